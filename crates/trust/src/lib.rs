//! Trust in installer bundles.
//!
//! - **Keys** ([`keys`]): ECDSA P-256, cosign's default scheme. Private keys are PKCS#8 PEM,
//!   public keys SPKI PEM (what `cosign.pub` holds). A key's id is the SHA-256 of its SPKI DER.
//! - **Signatures** ([`verify`], [`sign`]): cosign's layout. The signed payload is a
//!   simple-signing document naming the bundle's image manifest digest; the signature
//!   (ECDSA-P256-SHA256 over the payload bytes, DER, base64) is the annotation
//!   `dev.cosignproject.cosign/signature` of the payload's layer in an OCI image manifest kept in
//!   the bundle's own layout, tagged `sha256-<hex>.sig`. The image manifest names the bundle
//!   manifest's digest, which names every blob's, so the one signature covers every byte.
//! - **Policy** ([`check_update`]): arch, variant, downgrades and the version floor.
//!
//! Pure apart from what the caller hands in: the bundle (whose reads go through
//! `slate-bundle`'s checked readers), key files the caller names, and the OS random source for
//! [`generate_keypair`].
//!
//! The public API the upgrade path uses:
//! ```text
//! let keys = slate_trust::load_trusted_keys(Path::new("/etc/slate/trusted-keys"))?;
//! let verified = slate_trust::verify(&bundle, &keys)?;        // signature over the manifest
//! slate_trust::check_update(bundle.manifest(), &facts, allow_downgrade)?;
//! let uki = bundle.read_blob(slate_bundle::UKI_ROLE)?;          // digest checked on read
//! ```

pub mod extension;
pub mod keys;
mod payload;
mod policy;
mod verify;

use std::path::{Path, PathBuf};

pub use extension::{
    sha256_digest, valid_extension_name, valid_extension_version, valid_sha256_digest,
    ExtensionError, ExtensionManifest, SignedExtension, EXTENSION_MANIFEST_SUFFIX,
    MAX_EXTENSION_MANIFEST_BYTES,
};
pub use keys::{
    generate_keypair, load_trusted_keys, read_private_key, read_public_key, KeyId, KeyPair,
    PrivateKey, PublicKey, MAX_KEY_FILE_BYTES, SHORT_KEY_ID_LEN,
};
pub use payload::{Critical, Identity, Image, Payload, COSIGN_SIGNATURE_TYPE};
pub use policy::{check_update, NodeFacts, PolicyError, UpdateKind};
pub use verify::{
    check_signature_present, decode_signature, sign, signature_for, signature_over, verify,
    verify_blobs, verify_bundle, verify_layer, Verified,
};

/// The file name `key` has in a directory of trusted keys: `<full key id>.pub` (the directory
/// an image carries is `slate_profile::image_contract::TRUSTED_KEYS`).
pub fn trusted_key_file_name(key: &PublicKey) -> String {
    format!("{}.pub", key.id().to_hex())
}

/// Why a key could not be used or a bundle's signature was refused. Every message names what
/// was wrong; key ids are shortened to [`SHORT_KEY_ID_LEN`] hex digits.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {reason}")]
    BadKey { what: String, reason: String },
    #[error("no trusted keys in {place}: nothing could verify a bundle")]
    NoTrustedKeys { place: String },
    #[error(
        "the bundle is not signed: its layout has no signature manifest tagged {tag}{}",
        if others.is_empty() { String::new() } else {
            format!(" (it has signatures for other manifests: {})", others.join(", "))
        }
    )]
    Unsigned { tag: String, others: Vec<String> },
    #[error("the bundle is signed by key {key_id}, which is not trusted (trusted: {trusted})")]
    UntrustedKey { key_id: String, trusted: String },
    #[error(
        "bad signature: it does not verify with the key it names ({key_id}); the payload or the \
         signature was altered"
    )]
    BadSignature { key_id: String },
    #[error(
        "no trusted key ({trusted}) verifies the signature: it was made with another key, or the \
         payload or the signature was altered"
    )]
    NotVerified { trusted: String },
    #[error("the signature by key {key_id} is for manifest {signed}, not this bundle's {bundle}")]
    SignedAnotherDigest {
        key_id: String,
        signed: String,
        bundle: String,
    },
    #[error("no signature of the bundle names its manifest {digest}")]
    Unbound { digest: String },
    #[error("the signature payload is malformed: {reason}")]
    MalformedPayload { reason: String },
    #[error("the signature is malformed: {reason}")]
    MalformedSignature { reason: String },
    #[error("none of the bundle's {} signatures is valid: {}", errors.len(), join(errors))]
    NoValidSignature { errors: Vec<TrustError> },
    #[error(transparent)]
    Bundle(#[from] slate_bundle::BundleError),
    /// A key file or directory that is not what it must be, or too large.
    #[error(transparent)]
    File(#[from] slate_files::FileError),
}

fn join(errors: &[TrustError]) -> String {
    errors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}) {e}", i + 1))
        .collect::<Vec<_>>()
        .join("; ")
}

impl TrustError {
    /// Name the file a key came from.
    fn in_file(self, path: &Path) -> Self {
        match self {
            TrustError::BadKey { what, reason } => TrustError::BadKey {
                what: format!("{what} {}", path.display()),
                reason,
            },
            other => other,
        }
    }
}
