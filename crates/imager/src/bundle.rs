//! The installer bundle: an OCI image layout directory holding the UKI, the target version's own
//! slate binary, and a manifest naming version, arch, variant and the digest of every blob.
//!
//! Written with serde types of our own for now; the transport issue brings the OCI client crates
//! that push and pull it.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ImagerError;

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const ARTIFACT_TYPE: &str = "application/vnd.slate.installer.v1";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.slate.installer.config.v1+json";
pub const UKI_MEDIA_TYPE: &str = "application/vnd.slate.uki.v1";
pub const BINARY_MEDIA_TYPE: &str = "application/vnd.slate.installer-binary.v1";

/// The bundle's own manifest (the OCI config blob): what the bundle is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleManifest {
    pub name: String,
    pub version: String,
    pub arch: String,
    pub variant: String,
    /// Blob role (`uki`, `installer`) → its file name, digest and size.
    pub blobs: BTreeMap<String, BlobRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    pub file_name: String,
    pub digest: String,
    pub size: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: &'static str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'static str, String>,
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn put_blob(dir: &Path, bytes: &[u8]) -> Result<String, ImagerError> {
    let digest = digest(bytes);
    let path = dir
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    fs::write(&path, bytes).map_err(|source| ImagerError::Output { path, source })?;
    Ok(digest)
}

fn json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("plain data serializes")
}

/// Lay out the bundle in `dir` (empty), tagged with the version.
pub fn build_installer_bundle(
    dir: &Path,
    manifest_base: (&str, &str, &str, &str),
    uki_name: &str,
    uki: &[u8],
    slate: &[u8],
) -> Result<BundleManifest, ImagerError> {
    let (name, version, arch, variant) = manifest_base;
    let blobs_dir = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs_dir).map_err(|source| ImagerError::Output {
        path: blobs_dir.clone(),
        source,
    })?;
    let mut layers = Vec::new();
    let mut blobs = BTreeMap::new();
    for (role, file_name, media_type, bytes) in [
        ("uki", uki_name, UKI_MEDIA_TYPE, uki),
        ("installer", "slate", BINARY_MEDIA_TYPE, slate),
    ] {
        let digest = put_blob(dir, bytes)?;
        blobs.insert(
            role.to_string(),
            BlobRef {
                file_name: file_name.to_string(),
                digest: digest.clone(),
                size: bytes.len() as u64,
            },
        );
        layers.push(Descriptor {
            media_type,
            digest,
            size: bytes.len() as u64,
            annotations: BTreeMap::from([("org.opencontainers.image.title", file_name.into())]),
        });
    }
    let manifest = BundleManifest {
        name: name.into(),
        version: version.into(),
        arch: arch.into(),
        variant: variant.into(),
        blobs,
    };
    let config = json(&manifest);
    let config_desc = Descriptor {
        media_type: CONFIG_MEDIA_TYPE,
        digest: put_blob(dir, &config)?,
        size: config.len() as u64,
        annotations: BTreeMap::new(),
    };
    let oci_manifest = json(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": config_desc,
        "layers": layers,
        "annotations": {
            "org.opencontainers.image.version": version,
            "dev.slate.arch": arch,
            "dev.slate.variant": variant,
        },
    }));
    let index = json(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [Descriptor {
            media_type: MANIFEST_MEDIA_TYPE,
            digest: put_blob(dir, &oci_manifest)?,
            size: oci_manifest.len() as u64,
            annotations: BTreeMap::from([("org.opencontainers.image.ref.name", version.into())]),
        }],
    }));
    for (file, bytes) in [
        ("oci-layout", &br#"{"imageLayoutVersion":"1.0.0"}"#[..]),
        ("index.json", &index[..]),
    ] {
        let path = dir.join(file);
        fs::write(&path, bytes).map_err(|source| ImagerError::Output { path, source })?;
    }
    Ok(manifest)
}
