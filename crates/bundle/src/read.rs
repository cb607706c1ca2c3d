//! Opening a bundle: `index.json` → the tagged image manifest → the bundle manifest, each read
//! with a size cap and checked against the digest that names it; blobs on demand, the same way,
//! each hashed at most once per [`Bundle`]. Files are opened only when they are regular files
//! (`blob::open_regular`); a size no file can have is refused when the manifest is read.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};

use crate::blob::{self, declared_too_large, lock, open_regular, parse_digest, BlobReader};
use crate::{
    BlobRef, BundleError, BundleManifest, ChunkDigests, Digest, VerifiedBlobs, CONFIG_MEDIA_TYPE,
    REF_NAME_ANNOTATION,
};

/// The largest index, image manifest or bundle manifest slate reads. Real ones are ~1 KiB; the
/// cap keeps a hostile bundle from making the node buffer gigabytes of JSON.
pub const MAX_DOCUMENT_BYTES: u64 = 256 * 1024;

/// An opened bundle whose manifests have been checked. Blobs are read (and checked) on demand;
/// the bundle remembers each blob it has verified, so no blob is hashed twice through it.
#[derive(Debug)]
pub struct Bundle {
    dir: PathBuf,
    digest: Digest,
    manifest_bytes: Vec<u8>,
    manifest: BundleManifest,
    /// The image's config and layers, in manifest order.
    image_blobs: Vec<(Digest, u64)>,
    /// The chunk digests layers declare, verified in parallel instead of the whole digest.
    chunks: BTreeMap<Digest, ChunkDigests>,
    verified: Mutex<VerifiedBlobs>,
}

pub(crate) fn malformed(what: &str, reason: impl std::fmt::Display) -> BundleError {
    BundleError::Malformed {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

/// Read at most `limit` bytes of the regular file `path`; more is an error.
pub(crate) fn read_capped(path: &Path, what: &str, limit: u64) -> Result<Vec<u8>, BundleError> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
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

/// A document (manifest, config, signature payload) by its descriptor: capped, verified.
pub(crate) fn read_descriptor(
    dir: &Path,
    what: &str,
    d: &Descriptor,
    verified: &Mutex<VerifiedBlobs>,
) -> Result<Vec<u8>, BundleError> {
    let digest = parse_digest(d.digest().as_ref())?;
    blob::read_blob(
        dir,
        what,
        &digest,
        d.size(),
        MAX_DOCUMENT_BYTES,
        None,
        verified,
    )
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
            .filter(|d| !tag_of(d).is_some_and(crate::is_attached_tag))
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

/// An image manifest checked by [`parse_image_manifest`], with what the checks read off it.
struct ParsedImage {
    oci: ImageManifest,
    /// The config and the layers with their sizes, in manifest order.
    blobs: Vec<(Digest, u64)>,
    /// The chunk digests layers declare, by layer digest.
    chunks: BTreeMap<Digest, ChunkDigests>,
}

/// The OCI image manifest, whose config must be a slate bundle manifest, whose blobs must all
/// be named by canonical sha256 digests, and whose chunk digests must be well formed.
fn parse_image_manifest(bytes: &[u8]) -> Result<ParsedImage, BundleError> {
    let oci: ImageManifest =
        serde_json::from_slice(bytes).map_err(|e| malformed("the image manifest", e))?;
    let blobs = image_blobs(&oci)?;
    let chunks = layer_chunks(&oci)?;
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
    Ok(ParsedImage { oci, blobs, chunks })
}

/// The config and the layers of `oci` with their sizes; a size no file can have is refused,
/// stating it.
fn image_blobs(oci: &ImageManifest) -> Result<Vec<(Digest, u64)>, BundleError> {
    std::iter::once(oci.config())
        .chain(oci.layers())
        .map(|d| {
            let digest = parse_digest(d.digest().as_ref())?;
            if d.size() > blob::MAX_FILE_BYTES {
                return Err(declared_too_large(
                    &format!("the image manifest's blob {digest}"),
                    d.size(),
                ));
            }
            Ok((digest, d.size()))
        })
        .collect()
}

/// The chunk digests each layer of `oci` declares (`crate::chunks`), by the layer's digest;
/// malformed ones refuse the image manifest.
fn layer_chunks(oci: &ImageManifest) -> Result<BTreeMap<Digest, ChunkDigests>, BundleError> {
    let mut chunks = BTreeMap::new();
    for layer in oci.layers() {
        let digest = parse_digest(layer.digest().as_ref())?;
        let declared = ChunkDigests::from_annotations(layer.annotations().as_ref(), layer.size())
            .map_err(|reason| {
            malformed(
                "the image manifest",
                format!("its layer {digest}: {reason}"),
            )
        })?;
        if let Some(declared) = declared {
            chunks.insert(digest, declared);
        }
    }
    Ok(chunks)
}

/// The bundle manifest (the config blob); every blob it names must be a layer of `oci`.
fn parse_bundle_manifest(bytes: &[u8], oci: &ImageManifest) -> Result<BundleManifest, BundleError> {
    let manifest: BundleManifest =
        serde_json::from_slice(bytes).map_err(|e| malformed("the bundle manifest", e))?;
    for (role, blob) in &manifest.blobs {
        parse_digest(&blob.digest)?;
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
    let image = parse_image_manifest(image_manifest)?;
    parse_bundle_manifest(bundle_manifest, &image.oci)
}

/// cosign's tag for the signature of a manifest: `sha256-<hex>.sig`.
pub fn is_signature_tag(tag: &str) -> bool {
    tag.starts_with("sha256-") && tag.ends_with(".sig")
}

impl Bundle {
    /// Open the layout at `dir`, choosing the image tagged `tag` (or the only one that is not a
    /// signature).
    pub fn open(dir: &Path, tag: Option<&str>) -> Result<Self, BundleError> {
        Self::open_with(dir, tag, VerifiedBlobs::new())
    }

    /// [`Bundle::open`] for a layout some of whose blobs this process has hashed already (as it
    /// received them, or through an earlier `Bundle`): those are read with a size check only,
    /// every other one is hashed when first read. The caller vouches that the files in
    /// `verified` have not changed since.
    pub fn open_with(
        dir: &Path,
        tag: Option<&str>,
        verified: VerifiedBlobs,
    ) -> Result<Self, BundleError> {
        let verified = Mutex::new(verified);
        let index_bytes = read_capped(&dir.join("index.json"), "index.json", MAX_DOCUMENT_BYTES)?;
        let chosen = choose_image(&index_bytes, tag)?;
        let digest = parse_digest(chosen.digest().as_ref())?;
        let manifest_bytes = blob::read_blob(
            dir,
            "the image manifest",
            &digest,
            chosen.size(),
            MAX_DOCUMENT_BYTES,
            None,
            &verified,
        )?;
        let image = parse_image_manifest(&manifest_bytes)?;
        let config_bytes =
            read_descriptor(dir, "the bundle manifest", image.oci.config(), &verified)?;
        let manifest = parse_bundle_manifest(&config_bytes, &image.oci)?;
        Ok(Bundle {
            dir: dir.to_owned(),
            digest,
            manifest_bytes,
            manifest,
            image_blobs: image.blobs,
            chunks: image.chunks,
            verified,
        })
    }

    pub fn manifest(&self) -> &BundleManifest {
        &self.manifest
    }

    /// Digest of the OCI image manifest: the bundle's identity, and what a signature covers
    /// (the manifest names the config's digest, which names every blob's).
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// [`Bundle::digest`] as text.
    pub fn manifest_digest(&self) -> &str {
        self.digest.as_str()
    }

    /// The image manifest exactly as stored.
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }

    /// The image's config (the bundle manifest) and layers with their sizes, in manifest order.
    pub fn image_blobs(&self) -> &[(Digest, u64)] {
        &self.image_blobs
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every blob (documents included) this bundle has verified so far, to hand to a later
    /// [`Bundle::open_with`] in the same process.
    pub fn verified_blobs(&self) -> VerifiedBlobs {
        lock(&self.verified).clone()
    }

    /// The descriptor of the blob with `role`.
    pub fn blob_ref(&self, role: &str) -> Result<&BlobRef, BundleError> {
        self.manifest
            .blobs
            .get(role)
            .ok_or_else(|| BundleError::MissingBlob(role.to_owned()))
    }

    fn role_digest(&self, role: &str) -> Result<(Digest, u64), BundleError> {
        let blob = self.blob_ref(role)?;
        Ok((parse_digest(&blob.digest)?, blob.size))
    }

    /// The blob with `role`, read and verified against its size and digest.
    pub fn read_blob(&self, role: &str) -> Result<Vec<u8>, BundleError> {
        let (digest, size) = self.role_digest(role)?;
        blob::read_blob(
            &self.dir,
            &format!("the {role} blob"),
            &digest,
            size,
            u64::MAX,
            self.chunks.get(&digest),
            &self.verified,
        )
    }

    /// The blob with `role`, verified like [`Bundle::read_blob`], but a large one mapped from its
    /// file instead of copied when only the caller can change the file (see [`BlobBytes`]).
    pub fn map_blob(&self, role: &str) -> Result<crate::BlobBytes, BundleError> {
        let (digest, size) = self.role_digest(role)?;
        crate::mapped::map_blob(
            &self.dir,
            &format!("the {role} blob"),
            &digest,
            size,
            self.chunks.get(&digest),
            &self.verified,
        )
    }

    /// The blob with `role` from a sealed memfd that the process which verified it handed over
    /// with the digest it verified (`crate::sealed`): checked for memfd, seals, size and that
    /// digest, then mapped without hashing it again.
    pub fn handed_over_blob(
        &self,
        role: &str,
        fd: std::os::fd::OwnedFd,
        claimed: &Digest,
    ) -> Result<crate::BlobBytes, BundleError> {
        let (digest, size) = self.role_digest(role)?;
        Ok(crate::sealed::handed_over(
            &format!("the {role} blob"),
            fd,
            claimed,
            &digest,
            size,
            &self.verified,
        )?)
    }

    /// The blob with `role` as a stream, verified as it is read (see [`BlobReader`]): for
    /// copying a large blob out without holding it.
    pub fn open_blob(&self, role: &str) -> Result<BlobReader<'_>, BundleError> {
        let (digest, size) = self.role_digest(role)?;
        if self.chunks.contains_key(&digest) {
            // Judged by its chunks first, as every reader judges it; the stream then checks
            // only the size.
            self.verify_blob(role)?;
        }
        self.blob_reader(&format!("the {role} blob"), &digest, size)
    }

    /// Check the blob with `role` against its size and digest without holding it. A blob
    /// verified before is only checked for size, and not read.
    pub fn verify_blob(&self, role: &str) -> Result<&BlobRef, BundleError> {
        let (digest, size) = self.role_digest(role)?;
        let mut reader = self.blob_reader(&format!("the {role} blob"), &digest, size)?;
        if !reader.hashes() {
            // Verified before (or handed over sealed): its size checked at open, not mapped.
            return self.blob_ref(role);
        }
        if self.chunks.contains_key(&digest) {
            // By its chunks, on every core, mapped or read as the installers read it.
            drop(reader);
            self.map_blob(role)?;
            return self.blob_ref(role);
        }
        std::io::copy(&mut reader, &mut std::io::sink())
            .map_err(|e| blob::from_io(&blob::blob_path(&self.dir, &digest), e))?;
        self.blob_ref(role)
    }

    /// [`Bundle::verify_blob`] for every blob the bundle manifest names.
    pub fn verify_blobs(&self) -> Result<(), BundleError> {
        for role in self.manifest.blobs.keys() {
            self.verify_blob(role)?;
        }
        Ok(())
    }

    pub(crate) fn blob_reader(
        &self,
        what: &str,
        digest: &Digest,
        size: u64,
    ) -> Result<BlobReader<'_>, BundleError> {
        BlobReader::open(&self.dir, what, digest, size, &self.verified)
    }

    pub(crate) fn verified_set(&self) -> &Mutex<VerifiedBlobs> {
        &self.verified
    }
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
