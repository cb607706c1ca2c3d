//! Releases in a registry: the release index (docs/formats.md §10, `slate-release`) kept in the
//! bundles' own repository, and the channel tags that follow it.
//!
//! - **The index** is an OCI artifact tagged [`RELEASE_INDEX_TAG`] (`releases`): an image
//!   manifest with `artifactType` [`INDEX_MEDIA_TYPE`], the OCI empty config (`{}`), and one
//!   layer of that media type holding the index JSON. [`fetch_release_index`] reads it — the
//!   manifest capped and checked against its digest like any other, the layer's *declared* size
//!   held to [`MAX_INDEX_BYTES`] before one byte of it is read, then its size and digest — and
//!   [`store_release_index`] writes it. Only registry repositories hold one: an `oci-layout:`
//!   reference is refused (a layout is a build output, not a place nodes follow).
//! - **Channel tags** `alpha`, `beta`, `stable` name the newest release each channel offers that
//!   is not yanked ([`channel_heads`]), so `REGISTRY/REPO:stable` is what a plain pull of the
//!   channel gets. [`tag_manifest`] stores a manifest's exact bytes under another tag: the digest
//!   stays, and with it the cosign signature tag `sha256-<hex>.sig` that is keyed by it.
//! - **No compare-and-swap.** The distribution API has no conditional write of a tag, so two
//!   publishers can race. [`update_index`] narrows that as far as plain requests allow: read the
//!   index, change it, upload the blobs, check the tag still names the manifest that was read,
//!   write the manifest, wait [`SETTLE`], read again and check the change is there (applying it
//!   once more changes nothing). When another publisher's write came in between or replaced it,
//!   the change is made again on what that publisher wrote, at most [`MAX_UPDATE_ATTEMPTS`]
//!   times, then [`UpdateError::Contended`]. What remains: a publisher whose check came just
//!   before this write and whose own write lands more than [`SETTLE`] after it replaces this
//!   change unseen. Publishing is rare and done by few; the index can be listed to confirm.

use std::io::Read as _;
use std::time::Duration;

use serde::Deserialize;
use slate_bundle::Digest;
use slate_release::{Channel, Release, ReleaseIndex, INDEX_MEDIA_TYPE, MAX_INDEX_BYTES};
pub use slate_release::{RELEASE_INDEX_TAG, RESERVED_TAGS};

use crate::reference::{check_tag, Location, ReferenceError};
use crate::registry::{Manifest, Registry, DEFAULT_CHUNK, OCI_MANIFEST};
use crate::{Client, Options, Reference, TransportError};

/// The OCI empty descriptor's media type: the config of an artifact that has none.
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// `{}`, the empty config's bytes, and their digest.
const EMPTY_CONFIG: &[u8] = b"{}";
const EMPTY_CONFIG_DIGEST: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
/// How often [`update_index`] makes its change again after another publisher's write replaced
/// it. A handful turns the usual two-publisher race into two successes; the bound keeps a
/// publisher from spinning against a stuck writer.
pub const MAX_UPDATE_ATTEMPTS: u32 = 5;
/// How long [`update_index`] waits after its write before reading it back: a publisher whose
/// pre-write check came just before this write, and whose write lands within this time, is seen
/// (and this change made again on top of it).
pub const SETTLE: Duration = Duration::from_millis(250);

/// An index as read, with the digest of the manifest it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredIndex {
    pub index: ReleaseIndex,
    /// `sha256:<hex>` of the manifest tagged [`RELEASE_INDEX_TAG`].
    pub digest: String,
}

/// Where an index is kept, read and written whole. [`RegistryIndex`] is the registry; a test can
/// put another writer in between.
pub trait IndexStore {
    /// Where, for messages (`host/repository`).
    fn place(&self) -> String;
    /// The index, or `None` when there is none yet.
    fn load(&self) -> Result<Option<StoredIndex>, TransportError>;
    /// Store `index` unless the index tag no longer names `expected` (`None`: no index); returns
    /// the new manifest digest, or `None` when the tag had moved and nothing was written. Best
    /// effort: the check and the write are two requests.
    fn store_if(
        &self,
        index: &ReleaseIndex,
        expected: Option<&str>,
    ) -> Result<Option<String>, TransportError>;
}

/// The index of one registry repository.
#[derive(Debug)]
pub struct RegistryIndex {
    registry: Registry,
    place: String,
}

impl RegistryIndex {
    /// The repository of `repository` (a registry reference; its tag is ignored, a digest or a
    /// layout is refused), for reading and writing.
    pub fn open(repository: &Reference, options: &Options) -> Result<Self, TransportError> {
        let (registry, place) = repository_of(repository, options, true)?;
        Ok(RegistryIndex { registry, place })
    }
}

impl IndexStore for RegistryIndex {
    fn place(&self) -> String {
        self.place.clone()
    }

    fn load(&self) -> Result<Option<StoredIndex>, TransportError> {
        load(&self.registry, &self.place)
    }

    fn store_if(
        &self,
        index: &ReleaseIndex,
        expected: Option<&str>,
    ) -> Result<Option<String>, TransportError> {
        let manifest = upload_index(&self.registry, &self.place, index)?;
        // The blobs are up: the check and the manifest write follow each other as closely as
        // two requests can.
        let current = self
            .registry
            .get_manifest(RELEASE_INDEX_TAG)?
            .map(|m| m.digest);
        if current.as_deref() != expected {
            return Ok(None);
        }
        self.registry.put_manifest(RELEASE_INDEX_TAG, &manifest)?;
        Ok(Some(manifest.digest))
    }
}

/// The registry repository a reference names: its tag does not matter here, a digest (which
/// would pin one image) and a local layout are refused.
fn repository_of(
    reference: &Reference,
    options: &Options,
    push: bool,
) -> Result<(Registry, String), TransportError> {
    match reference.location() {
        Location::Registry { host, repository } => {
            if reference.digest().is_some() {
                return Err(TransportError::Usage(format!(
                    "{reference}: name the repository (HOST/REPOSITORY) without a digest: the \
                     release index and the channel tags belong to the repository"
                )));
            }
            Ok((
                Registry::new(host, repository, &Client::new(options.clone()), push)?,
                format!("{host}/{repository}"),
            ))
        }
        Location::Layout { .. } => Err(TransportError::Usage(format!(
            "{reference}: releases live in a registry repository, not in a local layout (push \
             the bundle to a registry and publish it there)"
        ))),
    }
}

/// The release index of `repository` (a registry reference; its tag is ignored), or `None` when
/// the repository has no `releases` tag. A malformed artifact is an error naming what is wrong.
pub fn fetch_release_index(
    repository: &Reference,
    options: &Options,
) -> Result<Option<ReleaseIndex>, TransportError> {
    let (registry, place) = repository_of(repository, options, false)?;
    Ok(load(&registry, &place)?.map(|stored| stored.index))
}

/// [`fetch_release_index`] with the digest of the manifest it was read from.
pub fn fetch_stored_index(
    repository: &Reference,
    options: &Options,
) -> Result<Option<StoredIndex>, TransportError> {
    let (registry, place) = repository_of(repository, options, false)?;
    load(&registry, &place)
}

/// Write `index` as `repository`'s release index (unconditionally: [`update_index`] is the
/// read-change-write loop); returns the manifest digest.
pub fn store_release_index(
    repository: &Reference,
    index: &ReleaseIndex,
    options: &Options,
) -> Result<String, TransportError> {
    let (registry, place) = repository_of(repository, options, true)?;
    let manifest = upload_index(&registry, &place, index)?;
    registry.put_manifest(RELEASE_INDEX_TAG, &manifest)?;
    Ok(manifest.digest)
}

/// The manifest digest `tag` names in `repository`, or `None` when there is no such tag.
pub fn resolve_tag(
    repository: &Reference,
    tag: &str,
    options: &Options,
) -> Result<Option<String>, TransportError> {
    let (registry, _) = repository_of(repository, options, false)?;
    Ok(registry.get_manifest(tag)?.map(|m| m.digest))
}

/// Store the manifest `existing` (a tag or `sha256:<hex>`) of `repository` under `new_tag` as
/// well: the same bytes, so the same digest. Returns that digest.
pub fn tag_manifest(
    repository: &Reference,
    existing: &str,
    new_tag: &str,
    options: &Options,
) -> Result<String, TransportError> {
    check_tag(new_tag).map_err(|reason| ReferenceError {
        input: new_tag.to_owned(),
        reason,
    })?;
    let (registry, place) = repository_of(repository, options, true)?;
    tag_in(&registry, &place, existing, new_tag)
}

fn tag_in(
    registry: &Registry,
    place: &str,
    existing: &str,
    new_tag: &str,
) -> Result<String, TransportError> {
    // get_manifest keeps the bytes as served (checked against the digest asked for, or the one
    // the registry announced) and put_manifest sends them as they are, checking the digest the
    // registry answers: nothing is re-serialized.
    let manifest = registry
        .get_manifest(existing)?
        .ok_or_else(|| TransportError::NotFound {
            what: format!("the manifest {existing}"),
            location: place.to_owned(),
        })?;
    registry.put_manifest(new_tag, &manifest)?;
    Ok(manifest.digest)
}

/// The descriptors of an index manifest that are looked at; anything else in it is ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArtifactManifest {
    schema_version: u32,
    media_type: Option<String>,
    artifact_type: Option<String>,
    layers: Vec<LayerDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayerDescriptor {
    media_type: String,
    digest: String,
    size: u64,
}

/// The index layer of the manifest `bytes` (`what` names it in errors): the artifact type, one
/// layer of the index media type, a canonical digest and a declared size within the cap.
fn index_layer(what: &str, bytes: &[u8]) -> Result<(Digest, u64), TransportError> {
    let manifest: ArtifactManifest = serde_json::from_slice(bytes).map_err(|e| {
        TransportError::malformed(what, format!("it is not an OCI image manifest: {e}"))
    })?;
    if manifest.schema_version != 2 {
        return Err(TransportError::malformed(
            what,
            format!("its schemaVersion is {}, not 2", manifest.schema_version),
        ));
    }
    if let Some(media_type) = manifest.media_type.filter(|m| m != OCI_MANIFEST) {
        return Err(TransportError::MediaType {
            what: format!("{what} (its mediaType field)"),
            actual: media_type,
            expected: OCI_MANIFEST.into(),
        });
    }
    if manifest.artifact_type.as_deref() != Some(INDEX_MEDIA_TYPE) {
        return Err(TransportError::MediaType {
            what: format!("{what} (its artifactType; the tag {RELEASE_INDEX_TAG} is slate's)"),
            actual: manifest.artifact_type.unwrap_or_else(|| "none".into()),
            expected: INDEX_MEDIA_TYPE.into(),
        });
    }
    let [layer] = manifest.layers.as_slice() else {
        return Err(TransportError::malformed(
            what,
            format!(
                "it has {} layers; a release index has exactly one",
                manifest.layers.len()
            ),
        ));
    };
    if layer.media_type != INDEX_MEDIA_TYPE {
        return Err(TransportError::MediaType {
            what: format!("the layer of {what}"),
            actual: layer.media_type.clone(),
            expected: INDEX_MEDIA_TYPE.into(),
        });
    }
    // The declared size decides whether the layer is fetched at all.
    if layer.size > MAX_INDEX_BYTES as u64 {
        return Err(TransportError::Oversize {
            what: format!("the layer of {what} (it declares {} bytes)", layer.size),
            limit: MAX_INDEX_BYTES as u64,
        });
    }
    let digest = Digest::parse(&layer.digest).map_err(|e| {
        TransportError::malformed(what, format!("its layer digest {:?}: {e}", layer.digest))
    })?;
    Ok((digest, layer.size))
}

fn load(registry: &Registry, place: &str) -> Result<Option<StoredIndex>, TransportError> {
    let Some(manifest) = registry.get_manifest(RELEASE_INDEX_TAG)? else {
        return Ok(None);
    };
    let what = format!(
        "the release index {place}:{RELEASE_INDEX_TAG} ({})",
        manifest.digest
    );
    let (digest, size) = index_layer(&what, &manifest.bytes)?;
    let blob_what = format!("the index blob {digest} of {what}");
    let (_, reader) = registry.get_blob(&blob_what, digest.as_str(), size, 0)?;
    let mut bytes = Vec::new();
    reader
        .take(size + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| TransportError::Http {
            method: "GET".into(),
            url: format!("{}/blobs/{digest}", registry.describe()),
            cause: Box::new(e),
        })?;
    if bytes.len() as u64 != size {
        return Err(TransportError::SizeMismatch {
            what: blob_what,
            expected: size,
            actual: bytes.len() as u64,
        });
    }
    let actual = Digest::of(&bytes);
    if actual != digest {
        return Err(TransportError::DigestMismatch {
            what: blob_what,
            expected: digest.to_string(),
            actual: actual.to_string(),
        });
    }
    let index = ReleaseIndex::parse(&bytes).map_err(|e| TransportError::malformed(&what, e))?;
    Ok(Some(StoredIndex {
        index,
        digest: manifest.digest,
    }))
}

/// The manifest of an index whose JSON has the digest `layer` and `size` bytes (compact JSON,
/// keys sorted: the same index gives the same manifest digest).
fn index_manifest(layer: &Digest, size: usize) -> Manifest {
    let value = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": INDEX_MEDIA_TYPE,
        "config": {
            "mediaType": EMPTY_CONFIG_MEDIA_TYPE,
            "digest": EMPTY_CONFIG_DIGEST,
            "size": EMPTY_CONFIG.len(),
        },
        "layers": [{
            "mediaType": INDEX_MEDIA_TYPE,
            "digest": layer.as_str(),
            "size": size,
            "annotations": {"org.opencontainers.image.title": "releases.json"},
        }],
    });
    let bytes = serde_json::to_vec(&value).expect("a manifest serializes");
    Manifest {
        digest: Digest::of(&bytes).to_string(),
        bytes,
        media_type: OCI_MANIFEST.into(),
    }
}

/// Upload the empty config and the index JSON (each unless the registry has it) and return the
/// manifest that names them, not yet stored.
fn upload_index(
    registry: &Registry,
    place: &str,
    index: &ReleaseIndex,
) -> Result<Manifest, TransportError> {
    let json = index.to_json().into_bytes();
    if json.len() > MAX_INDEX_BYTES {
        // Never write what no reader would accept.
        return Err(TransportError::Oversize {
            what: format!("the release index for {place} ({} bytes)", json.len()),
            limit: MAX_INDEX_BYTES as u64,
        });
    }
    let digest = Digest::of(&json);
    for (what, digest, bytes) in [
        ("the empty config", EMPTY_CONFIG_DIGEST, EMPTY_CONFIG),
        ("the release index blob", digest.as_str(), json.as_slice()),
    ] {
        let size = bytes.len() as u64;
        if !registry.has_blob(what, digest, size)? {
            registry.upload_blob(
                what,
                digest,
                size,
                &mut &bytes[..],
                DEFAULT_CHUNK,
                &mut |_| {},
            )?;
        }
    }
    Ok(index_manifest(&digest, json.len()))
}

/// What [`update_index`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexUpdate<T> {
    /// What the change returned, on the index it was finally made on.
    pub outcome: T,
    /// The index as read back after the write (other publishers' changes included), or as read
    /// when there was nothing to write.
    pub index: ReleaseIndex,
    /// Its manifest digest (`None`: there is no index, and nothing was written).
    pub digest: Option<String>,
    /// Whether an index was written (false when the change changed nothing).
    pub written: bool,
    /// How many times the change was made (1 unless another publisher got in between).
    pub attempts: u32,
}

/// Why [`update_index`] failed. Nothing of the change is in the index as last read.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError<E> {
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The change refused the index (e.g. a promotion backwards).
    #[error(transparent)]
    Change(E),
    #[error(
        "the release index of {place} kept being replaced by other writers: {attempts} \
         attempts, each overwritten or preceded by another publisher's write; this change is \
         not in the index — run the command again once the other publisher is done"
    )]
    Contended { place: String, attempts: u32 },
}

/// Read the index of `store`, make `change` on it, write it back, and check the change survived
/// (see the module documentation). `change` must be idempotent — made once more on its own
/// result it changes nothing — which publishing, promoting and yanking are: that is how a
/// re-read index is known to hold it.
pub fn update_index<T, E>(
    store: &dyn IndexStore,
    mut change: impl FnMut(&mut ReleaseIndex) -> Result<T, E>,
) -> Result<IndexUpdate<T>, UpdateError<E>> {
    for attempt in 1..=MAX_UPDATE_ATTEMPTS {
        if attempt > 1 {
            std::thread::sleep(backoff(attempt));
        }
        let loaded = store.load()?;
        let (before, expected) = match loaded {
            Some(stored) => (stored.index, Some(stored.digest)),
            None => (ReleaseIndex::default(), None),
        };
        let mut index = before.clone();
        let outcome = change(&mut index).map_err(UpdateError::Change)?;
        if index == before {
            return Ok(IndexUpdate {
                outcome,
                index,
                digest: expected,
                written: false,
                attempts: attempt,
            });
        }
        if store.store_if(&index, expected.as_deref())?.is_none() {
            continue; // another publisher wrote since the read: make the change on theirs
        }
        std::thread::sleep(SETTLE);
        if let Some(now) = store.load()? {
            let mut again = now.index.clone();
            if change(&mut again).is_ok() && again == now.index {
                return Ok(IndexUpdate {
                    outcome,
                    index: now.index,
                    digest: Some(now.digest),
                    written: true,
                    attempts: attempt,
                });
            }
        }
        // Another publisher's write replaced this one: make the change again on theirs.
    }
    Err(UpdateError::Contended {
        place: store.place(),
        attempts: MAX_UPDATE_ATTEMPTS,
    })
}

/// [`update_index`] on the index of a registry repository.
pub fn update_release_index<T, E>(
    repository: &Reference,
    options: &Options,
    change: impl FnMut(&mut ReleaseIndex) -> Result<T, E>,
) -> Result<IndexUpdate<T>, UpdateError<E>> {
    let store = RegistryIndex::open(repository, options)?;
    update_index(&store, change)
}

/// Growing, and jittered so that two publishers that collided do not collide again in step.
fn backoff(attempt: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() % 100);
    Duration::from_millis(100 * u64::from(attempt) + u64::from(jitter))
}

/// The release each channel's tag should name: the newest one the channel sees that is not
/// yanked (`None`: the channel offers nothing). In [`Channel::ALL`] order.
pub fn channel_heads(index: &ReleaseIndex) -> Vec<(Channel, Option<&Release>)> {
    Channel::ALL
        .into_iter()
        .map(|channel| {
            let head = index.visible(channel).filter(|r| !r.is_yanked()).last();
            (channel, head)
        })
        .collect()
}

/// One channel tag: where it is and where the index says it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagMove {
    pub channel: Channel,
    /// The digest the tag names now (`None`: no such tag).
    pub current: Option<String>,
    /// The release it should name; `None` when the channel offers none that is not yanked
    /// (the tag is then left where it is).
    pub target: Option<Release>,
}

impl TagMove {
    /// Whether the tag has to be written.
    pub fn is_needed(&self) -> bool {
        self.target
            .as_ref()
            .is_some_and(|t| self.current.as_deref() != Some(t.digest.as_str()))
    }
}

/// Each channel tag of `repository` against `index` (nothing is written).
pub fn plan_channel_tags(
    repository: &Reference,
    index: &ReleaseIndex,
    options: &Options,
) -> Result<Vec<TagMove>, TransportError> {
    let (registry, _) = repository_of(repository, options, false)?;
    channel_heads(index)
        .into_iter()
        .map(|(channel, head)| {
            Ok(TagMove {
                channel,
                current: registry.get_manifest(channel.as_str())?.map(|m| m.digest),
                target: head.cloned(),
            })
        })
        .collect()
}

/// Write the channel tags of `moves` that are needed ([`TagMove::is_needed`]).
pub fn move_channel_tags(
    repository: &Reference,
    moves: &[TagMove],
    options: &Options,
) -> Result<(), TransportError> {
    let (registry, place) = repository_of(repository, options, true)?;
    for tag in moves.iter().filter(|m| m.is_needed()) {
        if let Some(target) = &tag.target {
            tag_in(&registry, &place, &target.digest, tag.channel.as_str())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
