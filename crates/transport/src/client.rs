//! [`Client`]: [`crate::Options`] and the settings that came after them (the hosts a token
//! service may be on, a private CA, the size limit), with the operations that use them: pull,
//! push, and [`Client::resolve`], the dry run of a pull, which writes nothing.

use std::io::Read as _;
use std::path::Path;

use slate_bundle::{is_signature_tag, BundleManifest, CONFIG_MEDIA_TYPE, MAX_DOCUMENT_BYTES};

use crate::layout::{parse_digest, read_capped, verify};
use crate::pull::{declared_bytes, signature_tag, AnySource};
use crate::source::{parse_manifest, Source};
use crate::{
    CaCertificates, Event, Options, PlannedBlob, Pulled, Pushed, Reference, TransportError,
};

/// The most blob bytes one manifest may declare unless told otherwise: 4 GiB (a UKI and the
/// installer binary are some 100 MiB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 4 << 30;

/// How to reach registries: [`Options`] and what came after them.
#[derive(Debug, Clone)]
pub struct Client {
    pub options: Options,
    /// Hosts (`host` or `host:port`) besides the registry's own that may receive its
    /// credentials: a token service on another host that the registry's 401 names. Any other
    /// token service is asked for an anonymous token; no credentials ever go in clear to a
    /// host that is not this machine.
    pub credential_hosts: Vec<String>,
    /// CA certificates trusted beside the compiled-in roots (a registry with a private CA).
    pub ca: CaCertificates,
    /// A pull refuses a manifest whose config and layers together declare more than this,
    /// before fetching any of them.
    pub max_image_bytes: u64,
}

impl Default for Client {
    fn default() -> Self {
        Client::new(Options::default())
    }
}

impl From<Options> for Client {
    fn from(options: Options) -> Self {
        Client::new(options)
    }
}

/// What a pull would fetch: the manifest a reference names and the sizes it declares, read
/// without writing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The name the image would get in the cache (the reference's tag, else its digest).
    pub tag: String,
    /// `sha256:<hex>` of the image manifest.
    pub manifest_digest: String,
    /// The config and the layers, in manifest order.
    pub blobs: Vec<PlannedBlob>,
    /// Their declared bytes (at most [`Client::max_image_bytes`]).
    pub total_bytes: u64,
    /// The bundle manifest (the config), when the image is a slate installer bundle.
    pub bundle: Option<BundleManifest>,
    /// The cosign signature tag, when the source has one.
    pub signature_tag: Option<String>,
    /// Blob bytes of the signature image.
    pub signature_bytes: u64,
}

impl Resolved {
    /// Of [`Resolved::blobs`], the bytes the cache at `cache_dir` already holds (read only;
    /// a missing cache holds none).
    pub fn cached_bytes(&self, cache_dir: &Path) -> u64 {
        self.blobs
            .iter()
            .filter(|b| {
                let Ok(digest) = parse_digest(&b.digest) else {
                    return false;
                };
                let path = cache_dir.join("blobs/sha256").join(digest.hex());
                std::fs::symlink_metadata(path)
                    .is_ok_and(|m| m.file_type().is_file() && m.len() == b.size)
            })
            .map(|b| b.size)
            .fold(0, u64::saturating_add)
    }
}

impl Client {
    /// `options` with no further credential host, no extra CA, and the default size limit.
    pub fn new(options: Options) -> Self {
        Client {
            options,
            credential_hosts: Vec::new(),
            ca: CaCertificates::none(),
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }

    /// Pull `reference` into the layout cache at `cache_dir` (created when missing); see
    /// [`crate::pull`]. Pulls into one cache wait for each other (its lock).
    pub fn pull(
        &self,
        reference: &Reference,
        cache_dir: &Path,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Pulled, TransportError> {
        crate::pull::pull(self, reference, cache_dir, Vec::new(), None, progress)
    }

    /// [`Client::pull`] with `seeds` besides the cache's own images: blobs this machine holds,
    /// each listed by a signed chunk index (a node's running UKI on its ESP and its running
    /// installer). A blob the target's chunk index lists is assembled from the chunks found
    /// there and the missing ones fetched by range (issue 41, formats.md §7.7), when that is
    /// smaller than the blob; otherwise, or if the delta fails, it is downloaded whole.
    pub fn pull_with_seeds(
        &self,
        reference: &Reference,
        cache_dir: &Path,
        seeds: Vec<crate::SeedBlob>,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Pulled, TransportError> {
        crate::pull::pull(self, reference, cache_dir, seeds, None, progress)
    }

    /// [`Client::pull_with_seeds`], and more seeds `derive` makes from each blob once it is in
    /// place, for the blobs after it (the slate binary is pulled first).
    pub fn pull_with_derived_seeds(
        &self,
        reference: &Reference,
        cache_dir: &Path,
        seeds: Vec<crate::SeedBlob>,
        derive: &dyn crate::DeriveSeeds,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Pulled, TransportError> {
        crate::pull::pull(self, reference, cache_dir, seeds, Some(derive), progress)
    }

    /// Push every tag of the layout at `layout_dir` to `reference`; see [`crate::push`].
    pub fn push(
        &self,
        layout_dir: &Path,
        reference: &Reference,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Pushed, TransportError> {
        crate::push::push(self, layout_dir, reference, progress)
    }

    /// The dry run of a pull: the manifest `reference` names, verified against its digest, its
    /// declared sizes checked against the limit, the bundle manifest (a small document read
    /// into memory and verified), and whether a signature exists. Nothing is written anywhere.
    pub fn resolve(&self, reference: &Reference) -> Result<Resolved, TransportError> {
        let any = AnySource::open(reference, self)?;
        let source = any.as_source();
        let (fetch, name) = any.target(reference)?;
        let manifest = source
            .manifest(&fetch)?
            .ok_or_else(|| TransportError::NotFound {
                what: format!("the image {name}"),
                location: source.describe(),
            })?;
        let what = format!(
            "the manifest {name} ({}) from {}",
            manifest.digest,
            source.describe()
        );
        let parsed = parse_manifest(&what, &manifest)?;
        let total_bytes = declared_bytes(&what, &parsed, self.max_image_bytes)?;
        let blobs = std::iter::once(parsed.config())
            .chain(parsed.layers())
            .map(|d| PlannedBlob {
                digest: d.digest().to_string(),
                size: d.size(),
            })
            .collect();
        let config = parsed.config();
        let bundle = if config.media_type().to_string() == CONFIG_MEDIA_TYPE {
            let digest = config.digest().to_string();
            let bytes = read_document(source, "the bundle manifest", &digest, config.size())?;
            let bundle = serde_json::from_slice(&bytes).map_err(|e| {
                TransportError::malformed(format!("the bundle manifest {digest}"), e)
            })?;
            Some(bundle)
        } else {
            None
        };
        let (mut signature_tag_found, mut signature_bytes) = (None, 0);
        if !is_signature_tag(&name) {
            let tag = signature_tag(&manifest.digest)?;
            if let Some(signature) = source.manifest(&tag)? {
                let what = format!("the signature {tag} from {}", source.describe());
                let parsed = parse_manifest(&what, &signature)?;
                signature_bytes = declared_bytes(&what, &parsed, self.max_image_bytes)?;
                signature_tag_found = Some(tag);
            }
        }
        Ok(Resolved {
            tag: name,
            manifest_digest: manifest.digest,
            blobs,
            total_bytes,
            bundle,
            signature_tag: signature_tag_found,
            signature_bytes,
        })
    }
}

/// A small blob read into memory from `source`: the document cap, then the digest.
fn read_document(
    source: &dyn Source,
    what: &str,
    digest: &str,
    size: u64,
) -> Result<Vec<u8>, TransportError> {
    if size > MAX_DOCUMENT_BYTES {
        return Err(TransportError::Oversize {
            what: format!("{what} {digest} (it declares {size} bytes)"),
            limit: MAX_DOCUMENT_BYTES,
        });
    }
    let what = format!("{what} {digest} from {}", source.describe());
    let (_, reader) = source.blob(&what, digest, size, 0)?;
    let where_ = source.describe();
    let bytes = read_capped(reader.take(size), &what, size, Path::new(&where_))?;
    verify(&bytes, &what, digest, Some(size))?;
    Ok(bytes)
}
