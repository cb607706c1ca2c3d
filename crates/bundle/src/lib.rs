//! The installer bundle: an OCI image layout directory holding a version's UKI and that
//! version's own slate binary, described by a bundle manifest (the OCI config blob) that names
//! version, arch, variant and the digest of every blob.
//!
//! The OCI documents (index, image manifest, descriptors) are `oci-spec` types. They are written
//! through `serde_json::Value` so object keys come out sorted and a bundle is byte-reproducible
//! (`oci-spec` keeps annotations in a `HashMap`).
//!
//! Reading never trusts a size or a digest it has not checked: every document and blob is read
//! with a size cap and hashed before it is returned, once per [`Bundle`] (see [`VerifiedBlobs`]).
//! Digests are [`Digest`]s, the one canonical `sha256:<64 lower-case hex>` form.
//!
//! The upload tar of one image (formats.md §7.4) lives here both ways: [`Bundle::export_tar`]
//! writes it, signature documents first; [`import_tar`] unpacks it, refusing bad entries,
//! hashing each blob once as it is written, and asking the caller's signature judge before any
//! large blob is read.

mod blob;
mod chunk_index;
mod chunks;
mod digest;
mod download;
mod export;
mod import;
mod mapped;
mod read;
mod sealed;
mod signature;
mod write;
mod zchunks;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use blob::{irregular_kind, BlobReader, VerifiedBlobs};
pub use chunk_index::{index_of, CHUNK_INDEX_MEDIA_TYPE, INDEXED_MIN};
pub use chunks::{
    ChunkDigests, ChunkMismatch, CHUNKED_MIN, CHUNK_DIGESTS_ANNOTATION, CHUNK_SIZE,
    CHUNK_SIZE_ANNOTATION,
};
pub use digest::{hashed_on_this_thread, Digest, DigestError, DigestWriter, Hasher, SHA256_PREFIX};
pub use download::Download;
pub use import::{import_tar, ImportError, Imported, JudgeError, Refusal};
pub use mapped::BlobBytes;
pub use read::{is_signature_tag, parse_documents, Bundle, MAX_DOCUMENT_BYTES};
pub use sealed::{
    seal_verified, seal_verified_from, HandoverError, HANDOVER_SEALS, UKI_DIGEST_ENV, UKI_FD_ENV,
};
pub use signature::{
    add_signature, parse_signature_manifest, signature_tag, signature_tag_of, SignatureDescriptor,
    SignatureLayer, MAX_SIGNATURES, PUBLIC_KEY_ANNOTATION, SIGNATURE_ANNOTATION,
    SIGNATURE_CONFIG_MEDIA_TYPE, SIMPLE_SIGNING_MEDIA_TYPE,
};
pub use write::{
    write_bundle, write_installable_bundle, write_installable_bundle_reusing,
    write_installable_bundle_with, zchunks_manifest, BlobInput, BundleSpec,
};
pub use zchunks::{
    is_attached_tag, is_zchunks_tag, zchunks_layer, zchunks_tag_of, EMPTY_CONFIG,
    EMPTY_CONFIG_MEDIA_TYPE, ZCHUNKS_TAG_SUFFIX,
};

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const ARTIFACT_TYPE: &str = "application/vnd.slate.installer.v1";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.slate.installer.config.v1+json";
pub const UKI_MEDIA_TYPE: &str = "application/vnd.slate.uki.v1";
pub const BINARY_MEDIA_TYPE: &str = "application/vnd.slate.installer-binary.v1";
/// The annotation of an index entry naming its tag.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// The architecture this slate binary was built for, as bundles name it.
pub const NATIVE_ARCH: &str = if cfg!(target_arch = "x86_64") {
    "amd64"
} else if cfg!(target_arch = "aarch64") {
    "arm64"
} else {
    std::env::consts::ARCH
};

/// Blob roles the installer needs.
pub const UKI_ROLE: &str = "uki";
pub const INSTALLER_ROLE: &str = "installer";
/// systemd-boot's EFI binary, for installs onto a blank disk.
pub const SYSTEMD_BOOT_ROLE: &str = "systemd-boot";
/// GRUB's EFI binary (`grub-mkstandalone` around slate's embedded config), carried instead of
/// systemd-boot by the bundles of a `bootloader = "grub"` profile: its presence is what makes
/// `slate installer install` lay down the GRUB layout (docs/formats.md §7).
pub const GRUB_ROLE: &str = "grub";
pub const EFI_MEDIA_TYPE: &str = "application/vnd.slate.efi-binary.v1";

/// The bundle's own manifest (the OCI config blob): what the bundle is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleManifest {
    pub name: String,
    pub version: String,
    pub arch: String,
    pub variant: String,
    /// Blob role (`uki`, `installer`, `systemd-boot` or `grub`) → its file name, digest and
    /// size.
    pub blobs: BTreeMap<String, BlobRef>,
    /// How a fresh install of this bundle lays out a disk (from the image profile); absent in
    /// bundles that can only upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallDefaults>,
}

/// The profile's disk and boot settings, carried so `slate installer install` can lay out a
/// blank disk as the imager would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallDefaults {
    pub esp_mib: u64,
    pub state_mib: u64,
    /// Boot-counting tries of the installed entry.
    pub tries: u32,
    /// systemd-boot's menu timeout in seconds.
    pub menu_timeout: u32,
    /// How many versions an upgrade to this bundle leaves on the ESP (profile `[image]
    /// keep_versions`); applied by this bundle's own installer. Absent means
    /// [`DEFAULT_KEEP_VERSIONS`], and the default is not written: such a bundle manifest is byte
    /// for byte what slate wrote before the field existed, and older slate (which refuses
    /// unknown fields) still reads it.
    #[serde(
        default = "default_keep_versions",
        skip_serializing_if = "is_default_keep_versions"
    )]
    pub keep_versions: u32,
}

/// `keep_versions` of a bundle that names none (and of upgrade-only bundles): the new version
/// and the running one.
pub const DEFAULT_KEEP_VERSIONS: u32 = 2;

fn default_keep_versions() -> u32 {
    DEFAULT_KEEP_VERSIONS
}

fn is_default_keep_versions(n: &u32) -> bool {
    *n == DEFAULT_KEEP_VERSIONS
}

impl BundleManifest {
    /// How many versions an upgrade to this bundle leaves on the ESP.
    pub fn keep_versions(&self) -> u32 {
        self.install
            .map_or(DEFAULT_KEEP_VERSIONS, |install| install.keep_versions)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlobRef {
    pub file_name: String,
    /// `sha256:<hex>`; [`Bundle::open`] refuses a bundle manifest whose digests are not
    /// canonical ([`Digest::parse`]).
    pub digest: String,
    pub size: u64,
}

/// Why a bundle was refused. Every variant names what was wrong; none is raised after a write.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is malformed: {reason}")]
    Malformed { what: String, reason: String },
    #[error("{what} is larger than {limit} bytes")]
    Oversize { what: String, limit: u64 },
    #[error("{what} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{what} is {actual} bytes, its descriptor says {expected}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("the bundle has no tag {0:?}")]
    NoSuchTag(String),
    #[error("the bundle carries no {0} blob")]
    MissingBlob(String),
    /// Not a canonical digest ([`Digest::parse`]): another algorithm, or not 64 lower-case hex.
    #[error("unsupported digest {0:?} (sha256 only, as `sha256:` and 64 lower-case hex digits)")]
    UnsupportedDigest(String),
    /// A blob handed over by the process that verified it was refused ([`HandoverError`]).
    #[error(transparent)]
    Handover(Box<HandoverError>),
}

/// `sha256:<hex>` of `bytes` as text ([`Digest::of`] for the typed value).
pub fn sha256_digest(bytes: &[u8]) -> String {
    Digest::of(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"{"esp_mib":64,"menu_timeout":1,"state_mib":32,"tries":3}"#;

    #[test]
    fn keep_versions_defaults_to_2_and_the_default_is_not_written() {
        // A bundle written before the field existed.
        let old: InstallDefaults = serde_json::from_str(OLD).unwrap();
        assert_eq!(old.keep_versions, DEFAULT_KEEP_VERSIONS);
        // Written back as it was: older readers refuse unknown fields.
        assert_eq!(
            serde_json::to_value(old).unwrap(),
            serde_json::from_str::<serde_json::Value>(OLD).unwrap()
        );
        let three = InstallDefaults {
            keep_versions: 3,
            ..old
        };
        let text = serde_json::to_string(&three).unwrap();
        assert!(text.contains(r#""keep_versions":3"#), "{text}");
        assert_eq!(
            serde_json::from_str::<InstallDefaults>(&text).unwrap(),
            three
        );
        let manifest = |install| BundleManifest {
            name: "slate".into(),
            version: "1".into(),
            arch: "amd64".into(),
            variant: "demo".into(),
            blobs: BTreeMap::new(),
            install,
        };
        assert_eq!(manifest(None).keep_versions(), 2);
        assert_eq!(manifest(Some(old)).keep_versions(), 2);
        assert_eq!(manifest(Some(three)).keep_versions(), 3);
    }
}
