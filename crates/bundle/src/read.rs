//! Opening a bundle: `index.json` → the tagged image manifest → the bundle manifest, each read
//! with a size cap and checked against the digest that names it; blobs on demand, the same way.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};

use crate::{
    sha256_digest, BlobRef, BundleError, BundleManifest, CONFIG_MEDIA_TYPE, REF_NAME_ANNOTATION,
};

/// The largest index, image manifest or bundle manifest slate reads. Real ones are ~1 KiB; the
/// cap keeps a hostile bundle from making the node buffer gigabytes of JSON.
pub const MAX_DOCUMENT_BYTES: u64 = 256 * 1024;

/// An opened bundle whose manifests have been checked. Blobs are read (and checked) on demand.
#[derive(Debug)]
pub struct Bundle {
    dir: PathBuf,
    manifest_digest: String,
    manifest_bytes: Vec<u8>,
    manifest: BundleManifest,
}

pub(crate) fn malformed(what: &str, reason: impl std::fmt::Display) -> BundleError {
    BundleError::Malformed {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

/// Read at most `limit` bytes of `path`; more is an error.
pub(crate) fn read_capped(path: &Path, what: &str, limit: u64) -> Result<Vec<u8>, BundleError> {
    let file = File::open(path).map_err(|source| BundleError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| BundleError::Io {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(BundleError::Oversize {
            what: what.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf, BundleError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| BundleError::UnsupportedDigest(digest.to_owned()))?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// The blob `digest` of `size` bytes, read and verified (size first, then hash).
pub(crate) fn read_blob(
    dir: &Path,
    what: &str,
    digest: &str,
    size: u64,
    limit: u64,
) -> Result<Vec<u8>, BundleError> {
    if size > limit {
        return Err(BundleError::Oversize {
            what: what.to_owned(),
            limit,
        });
    }
    let bytes = read_capped(&blob_path(dir, digest)?, what, size)?;
    if bytes.len() as u64 != size {
        return Err(BundleError::SizeMismatch {
            what: what.to_owned(),
            expected: size,
            actual: bytes.len() as u64,
        });
    }
    let actual = sha256_digest(&bytes);
    if actual != digest {
        return Err(BundleError::DigestMismatch {
            what: what.to_owned(),
            expected: digest.to_owned(),
            actual,
        });
    }
    Ok(bytes)
}

pub(crate) fn read_descriptor(
    dir: &Path,
    what: &str,
    d: &Descriptor,
) -> Result<Vec<u8>, BundleError> {
    read_blob(dir, what, d.digest().as_ref(), d.size(), MAX_DOCUMENT_BYTES)
}

pub(crate) fn tag_of(d: &Descriptor) -> Option<&str> {
    d.annotations()
        .as_ref()
        .and_then(|a| a.get(REF_NAME_ANNOTATION))
        .map(String::as_str)
}

/// The descriptor of the image tagged `tag` in `index.json` (or of its only non-signature one).
fn choose_image(index_bytes: &[u8], tag: Option<&str>) -> Result<Descriptor, BundleError> {
    let index: ImageIndex =
        serde_json::from_slice(index_bytes).map_err(|e| malformed("index.json", e))?;
    let chosen = match tag {
        Some(tag) => index
            .manifests()
            .iter()
            .find(|d| tag_of(d) == Some(tag))
            .ok_or_else(|| BundleError::NoSuchTag(tag.to_owned()))?,
        None => match index
            .manifests()
            .iter()
            .filter(|d| !tag_of(d).is_some_and(is_signature_tag))
            .collect::<Vec<_>>()
            .as_slice()
        {
            [only] => *only,
            [] => return Err(malformed("index.json", "it lists no image")),
            _ => {
                return Err(malformed(
                    "index.json",
                    "it lists several images; name the tag",
                ))
            }
        },
    };
    Ok(chosen.clone())
}

/// The OCI image manifest, whose config must be a slate bundle manifest.
fn parse_image_manifest(bytes: &[u8]) -> Result<ImageManifest, BundleError> {
    let oci: ImageManifest =
        serde_json::from_slice(bytes).map_err(|e| malformed("the image manifest", e))?;
    let config = oci.config();
    if config.media_type().to_string() != CONFIG_MEDIA_TYPE {
        return Err(malformed(
            "the image manifest",
            format!(
                "its config is {}, not a slate bundle manifest ({CONFIG_MEDIA_TYPE})",
                config.media_type()
            ),
        ));
    }
    Ok(oci)
}

/// The bundle manifest (the config blob); every blob it names must be a layer of `oci`.
fn parse_bundle_manifest(bytes: &[u8], oci: &ImageManifest) -> Result<BundleManifest, BundleError> {
    let manifest: BundleManifest =
        serde_json::from_slice(bytes).map_err(|e| malformed("the bundle manifest", e))?;
    for (role, blob) in &manifest.blobs {
        let listed = oci
            .layers()
            .iter()
            .any(|layer| layer.digest().to_string() == blob.digest && layer.size() == blob.size);
        if !listed {
            return Err(malformed(
                "the bundle manifest",
                format!(
                    "its {role} blob {} is not a layer of the image",
                    blob.digest
                ),
            ));
        }
    }
    Ok(manifest)
}

/// The three documents of a bundle checked against each other, without the digests that tie
/// them together on disk (for fuzzing the parsers; [`Bundle::open`] is the real reader).
pub fn parse_documents(
    index: &[u8],
    tag: Option<&str>,
    image_manifest: &[u8],
    bundle_manifest: &[u8],
) -> Result<BundleManifest, BundleError> {
    choose_image(index, tag)?;
    let oci = parse_image_manifest(image_manifest)?;
    parse_bundle_manifest(bundle_manifest, &oci)
}

/// cosign's tag for the signature of a manifest: `sha256-<hex>.sig`.
pub fn is_signature_tag(tag: &str) -> bool {
    tag.starts_with("sha256-") && tag.ends_with(".sig")
}

impl Bundle {
    /// Open the layout at `dir`, choosing the image tagged `tag` (or the only one that is not a
    /// signature).
    pub fn open(dir: &Path, tag: Option<&str>) -> Result<Self, BundleError> {
        let index_bytes = read_capped(&dir.join("index.json"), "index.json", MAX_DOCUMENT_BYTES)?;
        let chosen = choose_image(&index_bytes, tag)?;
        let manifest_digest = chosen.digest().to_string();
        let manifest_bytes = read_descriptor(dir, "the image manifest", &chosen)?;
        let oci = parse_image_manifest(&manifest_bytes)?;
        let config_bytes = read_descriptor(dir, "the bundle manifest", oci.config())?;
        let manifest = parse_bundle_manifest(&config_bytes, &oci)?;
        Ok(Bundle {
            dir: dir.to_owned(),
            manifest_digest,
            manifest_bytes,
            manifest,
        })
    }

    pub fn manifest(&self) -> &BundleManifest {
        &self.manifest
    }

    /// Digest of the OCI image manifest: what a signature covers (the manifest names the
    /// config's digest, which names every blob's).
    pub fn manifest_digest(&self) -> &str {
        &self.manifest_digest
    }

    /// The image manifest exactly as stored.
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The descriptor of the blob with `role`.
    pub fn blob_ref(&self, role: &str) -> Result<&BlobRef, BundleError> {
        self.manifest
            .blobs
            .get(role)
            .ok_or_else(|| BundleError::MissingBlob(role.to_owned()))
    }

    /// The blob with `role`, read and verified against its size and digest.
    pub fn read_blob(&self, role: &str) -> Result<Vec<u8>, BundleError> {
        let blob = self.blob_ref(role)?;
        read_blob(
            &self.dir,
            &format!("the {role} blob"),
            &blob.digest,
            blob.size,
            u64::MAX,
        )
    }
}
