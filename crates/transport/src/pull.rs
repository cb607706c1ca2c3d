//! Pulling an image (and its signature tag) into a layout cache, under the cache's lock; what
//! a manifest declares is checked against the size limit before any of its blobs is fetched.

use std::path::Path;

use oci_spec::image::{Descriptor, DescriptorBuilder, ImageManifest, MediaType};
use slate_bundle::is_signature_tag;

use crate::delta::{
    fetch_by_delta, index_layer, read_index, read_table, table_layer, Delta, DeriveSeeds, SeedBlob,
};
use crate::files::is_regular;
use crate::layout::{parse_digest, set_entry, Incoming, Layout};
use crate::reference::Location;
use crate::registry::{Manifest, Registry, OCI_MANIFEST};
use crate::source::{parse_manifest, LayoutSource, Source};
use crate::{Client, Event, Pulled, Reference, TransportError, MAX_FILE_BYTES};

/// cosign's tag for the signature of the manifest `digest`: `sha256-<hex>.sig`.
pub fn signature_tag(manifest_digest: &str) -> Result<String, TransportError> {
    Ok(slate_bundle::signature_tag_of(&parse_digest(
        manifest_digest,
    )?))
}

/// The blob bytes `manifest` declares (config and layers), refused — before anything is
/// fetched — when one descriptor is larger than any file can be or all of them more than
/// `limit`. The sum is taken in `u128`, so no declared size can overflow it.
pub(crate) fn declared_bytes(
    what: &str,
    manifest: &ImageManifest,
    limit: u64,
) -> Result<u64, TransportError> {
    let mut total: u128 = 0;
    for d in std::iter::once(manifest.config()).chain(manifest.layers()) {
        if d.size() > MAX_FILE_BYTES {
            return Err(TransportError::TooLarge {
                what: format!("{what}: its blob {}", d.digest()),
                declared: d.size().into(),
                limit: MAX_FILE_BYTES,
            });
        }
        total += u128::from(d.size());
    }
    let limit = limit.min(MAX_FILE_BYTES);
    match u64::try_from(total) {
        Ok(total) if total <= limit => Ok(total),
        _ => Err(TransportError::TooLarge {
            what: format!("{what} (its config and layers together)"),
            declared: total,
            limit,
        }),
    }
}

/// Byte counts of one transfer.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub fetched: u64,
    pub cached: u64,
    /// Assembled from chunks held here (issue 41).
    pub reused: u64,
}

/// Copy blob `digest` from `source` into `dest` unless it is there: resumes a partial, verifies
/// before the rename, and retries once from the start when a resumed blob fails its digest (the
/// prefix from an earlier run may be what was wrong).
pub(crate) fn fetch_blob(
    source: &dyn Source,
    dest: &Layout,
    digest: &str,
    size: u64,
    stats: &mut Stats,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<(), TransportError> {
    if dest.has_blob(digest, size)? {
        stats.cached = stats.cached.saturating_add(size);
        progress(Event::BlobPresent { digest, size });
        return Ok(());
    }
    let what = format!("blob {digest} from {}", source.describe());
    for attempt in 0..2 {
        let mut incoming = Incoming::begin(dest, &what, digest, size)?;
        let from = incoming.offset();
        progress(Event::BlobStart { digest, size, from });
        let mut received = || -> Result<(), TransportError> {
            if incoming.offset() < size {
                let (start, mut reader) = source.blob(&what, digest, size, incoming.offset())?;
                if start != incoming.offset() {
                    incoming.restart()?;
                }
                incoming.receive(&mut reader, progress)?;
            }
            Ok(())
        };
        let result = received();
        stats.fetched = stats.fetched.saturating_add(incoming.received);
        if let Err(e) = result {
            if incoming.offset() == 0 {
                incoming.discard();
            }
            return Err(e);
        }
        let kept = incoming.offset() - incoming.received;
        match incoming.finish() {
            Ok(()) => {
                stats.cached = stats.cached.saturating_add(kept);
                progress(Event::BlobDone { digest });
                return Ok(());
            }
            Err(TransportError::DigestMismatch { .. }) if from > 0 && attempt == 0 => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the second attempt starts from an empty partial and returns")
}

/// Copy the image manifest `reference` (tag or digest), its config and layers from `source` into
/// `dest`, refusing a manifest that declares more than `limit` bytes of blobs before any is
/// fetched. `None` when the source has no such manifest. The index is the caller's. With
/// `delta`, the blobs the image's chunk index lists are assembled from chunks where that is
/// smaller (`crate::delta`); the index itself is fetched first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_image(
    source: &dyn Source,
    dest: &Layout,
    reference: &str,
    name: &str,
    limit: u64,
    delta: Option<&Delta<'_>>,
    stats: &mut Stats,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Option<Descriptor>, TransportError> {
    // A manifest pinned by digest that is already here needs no network (only manifests that
    // were verified are ever stored; one that no longer verifies is dropped and fetched again).
    let mut cached = None;
    if reference.starts_with("sha256:") {
        let path = dest.blob_path(reference)?;
        if is_regular(&path) {
            match dest.read_document(&format!("the manifest {reference}"), reference, None) {
                Ok(bytes) => {
                    cached = Some(Manifest {
                        bytes,
                        digest: reference.to_owned(),
                        media_type: OCI_MANIFEST.to_owned(),
                    })
                }
                Err(_) => {
                    std::fs::remove_file(&path).map_err(TransportError::io(&path))?;
                }
            }
        }
    }
    let manifest = match cached {
        Some(m) => m,
        None => match source.manifest(reference)? {
            Some(m) => m,
            None => return Ok(None),
        },
    };
    let what = format!(
        "the manifest {name} ({}) from {}",
        manifest.digest,
        source.describe()
    );
    let parsed = parse_manifest(&what, &manifest)?;
    declared_bytes(&what, &parsed, limit)?;
    progress(Event::Manifest {
        name,
        digest: &manifest.digest,
    });
    let (index, mut first) = match (delta, index_layer(&parsed)) {
        (Some(_), Some(layer)) => {
            let digest = layer.digest().as_ref();
            fetch_blob(source, dest, digest, layer.size(), stats, progress)?;
            (read_index(dest, layer), vec![digest])
        }
        _ => (None, Vec::new()),
    };
    // The compressed chunks (formats.md §7.8): the signed table, then whether the source has
    // the compressed blob under the `.zchunks` tag. Without either, chunks travel raw.
    let zchunks = match (&index, table_layer(&parsed)) {
        (Some(index), Some(layer)) => {
            let digest = layer.digest().as_ref();
            fetch_blob(source, dest, digest, layer.size(), stats, progress)?;
            first.push(digest);
            compressed_chunks(source, dest, layer, index, &manifest.digest)?
        }
        _ => None,
    };
    // With a deriver, the slate binary before the rest: the UKI's root holds it again, and a
    // seed derived from it (`DeriveSeeds`) serves the UKI only once the binary is here.
    // Without one, the manifest's order.
    let deriving = delta.filter(|d| d.derive.is_some() && index.is_some());
    let mut blobs: Vec<&Descriptor> = std::iter::once(parsed.config())
        .chain(parsed.layers())
        .collect();
    if deriving.is_some() {
        blobs.sort_by_key(|d| {
            AsRef::<str>::as_ref(d.media_type()) != slate_bundle::BINARY_MEDIA_TYPE
        });
    }
    let mut derived = Vec::new();
    for d in blobs {
        let digest = d.digest().as_ref();
        if first.contains(&digest) {
            continue;
        }
        let mut in_place = false;
        if let (Some(delta), Some(index)) = (delta, &index) {
            let listed = index.blob(digest).filter(|b| b.size == d.size());
            if let Some(chunks) = listed {
                if !dest.has_blob(digest, d.size())? {
                    let delivered =
                        fetch_by_delta(delta, &derived, zchunks.as_ref(), dest, chunks, progress)?;
                    stats.fetched = stats.fetched.saturating_add(delivered.fetched);
                    stats.reused = stats.reused.saturating_add(delivered.reused);
                    in_place = delivered.in_place;
                }
            }
        }
        if !in_place {
            fetch_blob(source, dest, digest, d.size(), stats, progress)?;
        }
        // Only a delta of a later blob can use what is derived.
        if let Some(derive) = deriving.and_then(|delta| derive_from(delta, d)) {
            derived.extend(derive.derive(d.media_type().as_ref(), &dest.blob_path(digest)?));
        }
    }
    dest.put_document(&manifest.digest, &manifest.bytes)?;
    let descriptor = DescriptorBuilder::default()
        .media_type(MediaType::ImageManifest)
        .digest(
            manifest
                .digest
                .parse::<oci_spec::image::Digest>()
                .map_err(|e| TransportError::malformed(&what, e))?,
        )
        .size(manifest.bytes.len() as u64)
        .build()
        .map_err(|e| TransportError::malformed(&what, e))?;
    Ok(Some(descriptor))
}

/// The deriver to ask about blob `d`, unless a seed already holds `d` whole (the running
/// version's own binary: its copy in the running UKI is a seed already).
fn derive_from<'a>(delta: &Delta<'a>, d: &Descriptor) -> Option<&'a dyn DeriveSeeds> {
    let held = delta
        .seeds
        .iter()
        .any(|s| s.chunks.oci_digest() == d.digest().as_ref());
    delta.derive.filter(|_| !held)
}

/// The checked compressed chunk table of the image `manifest_digest` when its compressed blob
/// is at the source: tagged `sha256-<hex>.zchunks`, that manifest's one layer being the blob
/// the signed table names. `None` (chunks travel raw) when the table does not read or bind to
/// the index (the bundle's verification refuses it after the pull) or nothing is tagged.
fn compressed_chunks(
    source: &dyn Source,
    dest: &Layout,
    layer: &Descriptor,
    index: &slate_delta::ChunkIndex,
    manifest_digest: &str,
) -> Result<Option<slate_delta::ZChunks>, TransportError> {
    let Some(table) = read_table(dest, layer) else {
        return Ok(None);
    };
    let Ok(checked) = table.check(index) else {
        return Ok(None);
    };
    let tag = slate_bundle::zchunks_tag_of(&parse_digest(manifest_digest)?);
    let Some(manifest) = source.manifest(&tag)? else {
        return Ok(None);
    };
    let parsed = parse_manifest(&format!("the manifest {tag}"), &manifest)?;
    let tagged = slate_bundle::zchunks_layer(&parsed);
    Ok((tagged == Some((checked.blob.clone(), table.blob_size))).then_some(checked))
}

pub(crate) enum AnySource {
    Registry(Box<Registry>),
    Layout(Box<LayoutSource>),
}

impl AnySource {
    pub fn open(reference: &Reference, client: &Client) -> Result<Self, TransportError> {
        Ok(match reference.location() {
            Location::Registry { host, repository } => {
                AnySource::Registry(Box::new(Registry::new(host, repository, client, false)?))
            }
            Location::Layout { path } => AnySource::Layout(Box::new(LayoutSource::open(path)?)),
        })
    }

    pub fn as_source(&self) -> &dyn Source {
        match self {
            AnySource::Registry(r) => &**r,
            AnySource::Layout(l) => &**l,
        }
    }

    /// Where a delta's missing chunks come from: range requests on the registry's blob, or
    /// reads at offsets of the layout's.
    pub fn as_remote(&self) -> &dyn slate_delta::Remote {
        match self {
            AnySource::Registry(r) => &**r,
            AnySource::Layout(l) => &**l,
        }
    }

    /// What to fetch for `reference` (its digest, else its tag) and the name it gets in the
    /// cache (its tag, else its digest); a layout's only image when the reference names none.
    pub fn target(&self, reference: &Reference) -> Result<(String, String), TransportError> {
        Ok(match (reference.tag(), reference.digest()) {
            (tag, Some(digest)) => (digest.to_owned(), tag.unwrap_or(digest).to_owned()),
            (Some(tag), None) => (tag.to_owned(), tag.to_owned()),
            (None, None) => match self {
                AnySource::Layout(layout) => {
                    let tag = layout.default_tag()?;
                    (tag.clone(), tag)
                }
                AnySource::Registry(_) => {
                    return Err(TransportError::Usage(format!(
                        "{reference}: name a tag (:TAG) or a digest (@sha256:…) to pull"
                    )))
                }
            },
        })
    }
}

/// `seeds`: blobs held outside the cache (a node's running UKI); the cache's own images are
/// seeds too (`crate::delta::cache_seeds`).
pub(crate) fn pull(
    client: &Client,
    reference: &Reference,
    cache_dir: &Path,
    seeds: Vec<SeedBlob>,
    derive: Option<&dyn DeriveSeeds>,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pulled, TransportError> {
    let any = AnySource::open(reference, client)?;
    let source = any.as_source();
    let mut seeds = seeds;
    seeds.extend(crate::delta::cache_seeds(cache_dir));
    let delta = Delta {
        seeds: &seeds,
        remote: any.as_remote(),
        derive,
    };
    let (fetch, name) = any.target(reference)?;
    let limit = client.max_image_bytes;
    let existed = cache_dir.symlink_metadata().is_ok();
    // Held until the index names the image: pulls into one cache take turns.
    let lock = crate::cache::lock(cache_dir)?;
    let pulled = pull_locked(source, cache_dir, &fetch, name, limit, &delta, progress);
    if pulled.is_err() && !existed && holds_no_data(cache_dir) {
        // A failed first pull leaves no empty layout behind to be mistaken for a cache (issue
        // 44); one that got part of a blob keeps it, to resume. Removed under the lock; a pull
        // that was waiting for it goes on in a directory it makes again.
        let _ = std::fs::remove_dir_all(cache_dir);
    }
    drop(lock);
    pulled
}

/// No file under `dir`'s `blobs/` and `incoming/`: a layout with nothing in it yet.
fn holds_no_data(dir: &Path) -> bool {
    fn any_file(dir: &Path, depth: u32) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        entries.flatten().any(|e| match e.file_type() {
            Ok(t) if t.is_dir() => depth == 0 || any_file(&e.path(), depth - 1),
            _ => true,
        })
    }
    // blobs/sha256/<hex>: two levels; incoming/<name>: one. A deeper tree is no layout of
    // slate's, and counts as data.
    !any_file(&dir.join("blobs"), 2) && !any_file(&dir.join(crate::layout::INCOMING), 1)
}

fn pull_locked(
    source: &dyn Source,
    cache_dir: &Path,
    fetch: &str,
    name: String,
    limit: u64,
    delta: &Delta<'_>,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pulled, TransportError> {
    let cache = Layout::create(cache_dir)?;
    let mut stats = Stats::default();
    let image = copy_image(
        source,
        &cache,
        fetch,
        &name,
        limit,
        Some(delta),
        &mut stats,
        progress,
    )?
    .ok_or_else(|| TransportError::NotFound {
        what: format!("the image {name}"),
        location: source.describe(),
    })?;
    let manifest_digest = image.digest().to_string();
    let signature = if is_signature_tag(&name) {
        None
    } else {
        let tag = signature_tag(&manifest_digest)?;
        copy_image(
            source, &cache, &tag, &tag, limit, None, &mut stats, progress,
        )?
        .map(|d| (tag, d))
    };
    let mut index = cache.read_index()?;
    set_entry(&mut index, &image, Some(&name));
    if let Some((tag, descriptor)) = &signature {
        set_entry(&mut index, descriptor, Some(tag));
    }
    cache.write_index(&index)?;
    crate::delta::remove_chunks(&cache);
    Ok(Pulled {
        layout_dir: cache_dir.to_owned(),
        tag: name,
        manifest_digest,
        signature_tag: signature.map(|(tag, _)| tag),
        fetched_bytes: stats.fetched,
        cached_bytes: stats.cached,
        reused_bytes: stats.reused,
    })
}
