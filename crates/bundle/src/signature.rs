//! Signatures kept in the bundle's own layout, the way cosign stores them in a registry: an OCI
//! image manifest tagged `sha256-<hex>.sig` (the signed manifest's digest), whose layers are
//! simple-signing payloads (`application/vnd.dev.cosign.simplesigning.v1+json`) each carrying its
//! base64 signature in the layer annotation `dev.cosignproject.cosign/signature`.
//!
//! This module only stores and reads the bytes; what a payload says and whether a signature is
//! valid is `slate-trust`'s business. Several layers may sit in one signature manifest (cosign
//! appends; slate replaces a layer made by the same key), which is how a bundle is signed by an
//! old and a new key during a key rotation.

use std::fs;
use std::path::Path;
use std::sync::Mutex;

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, ImageManifestBuilder, MediaType};

use crate::blob::parse_digest;
use crate::read::{malformed, read_capped, read_descriptor, tag_of};
use crate::write::{canonical_json, descriptor, io_err, put_blob};
use crate::{
    Bundle, BundleError, Digest, VerifiedBlobs, MANIFEST_MEDIA_TYPE, MAX_DOCUMENT_BYTES,
    REF_NAME_ANNOTATION,
};

/// The media type of a cosign simple-signing payload layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature (cosign's name).
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// slate's own layer annotation: the signer's public key (SPKI PEM). It is never trusted by
/// itself; it only lets a verifier name the key of a signature no trusted key verifies.
pub const PUBLIC_KEY_ANNOTATION: &str = "dev.slate.signer.public-key";
/// The config media type cosign gives a signature manifest.
pub const SIGNATURE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// The most signatures one signature manifest may hold; each costs an ECDSA verification per
/// trusted key, so a hostile bundle cannot make verification slow.
pub const MAX_SIGNATURES: usize = 16;

/// One signature as stored: the payload bytes (what was signed), the signature annotation as
/// written (base64), and the signer's public key when the layer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureLayer {
    pub payload: Vec<u8>,
    pub signature: String,
    pub public_key: Option<String>,
}

/// A layer of a signature manifest, before its payload is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureDescriptor {
    pub digest: String,
    pub size: u64,
    pub signature: String,
    pub public_key: Option<String>,
}

/// cosign's tag for the signature of `manifest_digest`: `sha256-<hex>.sig`.
pub fn signature_tag(manifest_digest: &str) -> Result<String, BundleError> {
    Ok(signature_tag_of(&parse_digest(manifest_digest)?))
}

/// [`signature_tag`] of a parsed digest.
pub fn signature_tag_of(manifest_digest: &Digest) -> String {
    format!("sha256-{}.sig", manifest_digest.hex())
}

const WHAT: &str = "the signature manifest";

/// Parse a signature manifest: every layer must be a simple-signing payload with a signature
/// annotation and a sha256 digest; at least one, at most [`MAX_SIGNATURES`].
pub fn parse_signature_manifest(bytes: &[u8]) -> Result<Vec<SignatureDescriptor>, BundleError> {
    let manifest: ImageManifest = serde_json::from_slice(bytes).map_err(|e| malformed(WHAT, e))?;
    let layers = manifest.layers();
    if layers.is_empty() {
        return Err(malformed(WHAT, "it has no signature layer"));
    }
    if layers.len() > MAX_SIGNATURES {
        return Err(malformed(
            WHAT,
            format!(
                "it holds {} signatures, more than the {MAX_SIGNATURES} slate reads",
                layers.len()
            ),
        ));
    }
    layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let n = i + 1;
            if layer.media_type().to_string() != SIMPLE_SIGNING_MEDIA_TYPE {
                return Err(malformed(
                    WHAT,
                    format!(
                        "layer {n} is {}, not a simple-signing payload ({SIMPLE_SIGNING_MEDIA_TYPE})",
                        layer.media_type()
                    ),
                ));
            }
            let digest = parse_digest(layer.digest().as_ref())?.to_string();
            if layer.size() > MAX_DOCUMENT_BYTES {
                return Err(BundleError::Oversize {
                    what: format!("signature payload {n}"),
                    limit: MAX_DOCUMENT_BYTES,
                });
            }
            let annotation = |key: &str| {
                layer
                    .annotations()
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .cloned()
            };
            let signature = annotation(SIGNATURE_ANNOTATION).ok_or_else(|| {
                malformed(
                    WHAT,
                    format!("layer {n} has no {SIGNATURE_ANNOTATION} annotation"),
                )
            })?;
            Ok(SignatureDescriptor {
                digest,
                size: layer.size(),
                signature,
                public_key: annotation(PUBLIC_KEY_ANNOTATION),
            })
        })
        .collect()
}

fn read_index(dir: &Path) -> Result<ImageIndex, BundleError> {
    let bytes = read_capped(&dir.join("index.json"), "index.json", MAX_DOCUMENT_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| malformed("index.json", e))
}

/// The signature manifest tagged `tag`, its layers read and each payload checked against its
/// digest; `None` when the index tags none.
fn read_tagged(
    dir: &Path,
    index: &ImageIndex,
    tag: &str,
    verified: &Mutex<VerifiedBlobs>,
) -> Result<Option<Vec<SignatureLayer>>, BundleError> {
    let Some(entry) = index.manifests().iter().find(|d| tag_of(d) == Some(tag)) else {
        return Ok(None);
    };
    let bytes = read_descriptor(dir, WHAT, entry, verified)?;
    parse_signature_manifest(&bytes)?
        .into_iter()
        .enumerate()
        .map(|(i, layer)| {
            let what = format!("signature payload {}", i + 1);
            let payload = crate::blob::read_blob(
                dir,
                &what,
                &parse_digest(&layer.digest)?,
                layer.size,
                MAX_DOCUMENT_BYTES,
                None,
                verified,
            )?;
            Ok(SignatureLayer {
                payload,
                signature: layer.signature,
                public_key: layer.public_key,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl Bundle {
    /// The signatures stored for this bundle's image manifest (the manifest tagged
    /// [`signature_tag`] of [`Bundle::manifest_digest`]), each payload checked against its
    /// digest; `None` when there is no such manifest: the bundle is unsigned.
    pub fn signatures(&self) -> Result<Option<Vec<SignatureLayer>>, BundleError> {
        let index = read_index(self.dir())?;
        read_tagged(
            self.dir(),
            &index,
            &signature_tag_of(self.digest()),
            self.verified_set(),
        )
    }

    /// Every signature tag the index holds, for whatever digest (to explain an unsigned bundle).
    pub fn signature_tags(&self) -> Result<Vec<String>, BundleError> {
        Ok(read_index(self.dir())?
            .manifests()
            .iter()
            .filter_map(|d| tag_of(d).filter(|t| crate::is_signature_tag(t)))
            .map(str::to_owned)
            .collect())
    }
}

fn layer_descriptor(dir: &Path, layer: &SignatureLayer) -> Result<Descriptor, BundleError> {
    let mut annotations = vec![(SIGNATURE_ANNOTATION, layer.signature.as_str())];
    if let Some(key) = &layer.public_key {
        annotations.push((PUBLIC_KEY_ANNOTATION, key.as_str()));
    }
    descriptor(
        SIMPLE_SIGNING_MEDIA_TYPE,
        &put_blob(dir, &layer.payload)?,
        layer.payload.len(),
        &annotations,
    )
}

/// Store `layer` as a signature of `manifest_digest` in the layout at `dir`: the payload blob,
/// a config blob and the signature manifest first, then `index.json` replaced in one rename
/// (its entry tagged [`signature_tag`] added or updated). A signature already there by the same
/// public key (or an identical one) is replaced; others are kept. Returns the digest of the
/// signature manifest.
pub fn add_signature(
    dir: &Path,
    manifest_digest: &str,
    layer: &SignatureLayer,
) -> Result<String, BundleError> {
    let tag = signature_tag(manifest_digest)?;
    let mut index = read_index(dir)?;
    let mut layers = read_tagged(dir, &index, &tag, &Mutex::default())?.unwrap_or_default();
    layers.retain(|old| {
        let same_key = old.public_key.is_some() && old.public_key == layer.public_key;
        !same_key && old.signature != layer.signature
    });
    layers.push(layer.clone());
    if layers.len() > MAX_SIGNATURES {
        return Err(malformed(
            WHAT,
            format!("it would hold more than {MAX_SIGNATURES} signatures"),
        ));
    }
    let descriptors = layers
        .iter()
        .map(|l| layer_descriptor(dir, l))
        .collect::<Result<Vec<_>, _>>()?;
    // cosign's config: an image config whose rootfs lists the payloads.
    let diff_ids: Vec<String> = descriptors.iter().map(|d| d.digest().to_string()).collect();
    let config = canonical_json(&serde_json::json!({
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }));
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            SIGNATURE_CONFIG_MEDIA_TYPE,
            &put_blob(dir, &config)?,
            config.len(),
            &[],
        )?)
        .layers(descriptors)
        .build()
        .map_err(|e| malformed(WHAT, e))?;
    let manifest = canonical_json(&manifest);
    let entry = descriptor(
        MANIFEST_MEDIA_TYPE,
        &put_blob(dir, &manifest)?,
        manifest.len(),
        &[(REF_NAME_ANNOTATION, &tag)],
    )?;
    let digest = entry.digest().to_string();
    let mut entries = index.manifests().clone();
    match entries.iter_mut().find(|d| tag_of(d) == Some(tag.as_str())) {
        Some(old) => *old = entry,
        None => entries.push(entry),
    }
    index.set_manifests(entries);
    let tmp = dir.join(".index.json.tmp");
    fs::write(&tmp, canonical_json(&index)).map_err(io_err(&tmp))?;
    let path = dir.join("index.json");
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    Ok(digest)
}
