//! UEFI Secure Boot for slate (docs/formats.md §11): Authenticode signatures on the PE files the
//! firmware starts (systemd-boot, every UKI), and the EFI signature lists that carry the keys
//! the firmware trusts.
//!
//! - [`sign_pe`]: sign a PE image with an owner's `db` key, reproducibly (no signing time, RSA
//!   PKCS#1 v1.5, which is deterministic): the same key and the same image give the same bytes.
//! - [`verify_pe`]: does an image carry a valid signature by a certificate in a trusted set (the
//!   firmware's `db`)? The installer asks this before it writes a byte: a UKI the firmware would
//!   refuse leaves a node waiting at the firmware's prompt, which nothing unattended recovers.
//! - [`certs_from_auth`], [`certs_from_signature_lists`]: the certificates inside the `.auth`
//!   files systemd-boot enrols and inside an `EFI_SIGNATURE_LIST` variable such as `db`.
//!
//! Pure: no file, process or network access. The PE headers come from `slate_uki`'s
//! bounds-checked reader, the Authenticode image digest from the `authenticode` crate, CMS
//! from `cms`, RSA from `ring`.

mod pe;
mod siglist;
mod sign;
mod verify;
mod x509;

pub use siglist::{
    certs_from_auth, certs_from_signature_lists, signature_list, SigListError, EFI_CERT_X509_GUID,
};
pub use sign::{sign_pe, SigningKey};
pub use verify::{verify_pe, Signer, TrustedCerts};

/// Why an image could not be signed or a key not loaded.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("not a PE image: {0}")]
    NotPe(String),
    #[error("the image is already signed; sign the unsigned original")]
    AlreadySigned,
    #[error("the image has no certificate-table directory entry (NumberOfRvaAndSizes < 5)")]
    NoSecurityDirectory,
    #[error("the signing key: {0}")]
    Key(String),
    #[error("the signing certificate: {0}")]
    Cert(String),
    #[error("the key does not belong to the certificate {0}")]
    KeyCertMismatch(String),
    #[error("encoding the signature: {0}")]
    Encode(String),
}

/// Why an image's signature is not accepted. Each says what a firmware would do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("not a PE image: {0}")]
    NotPe(String),
    #[error("the image carries no signature (Secure Boot firmware refuses it)")]
    NotSigned,
    #[error("the image's signature table is malformed: {0}")]
    Malformed(String),
    #[error("the image was changed after it was signed (its Authenticode digest differs)")]
    ImageModified,
    #[error("the signature does not verify with its signer's certificate {0}")]
    BadSignature(String),
    #[error(
        "the image is signed by {signer}, which no trusted db certificate ({trusted}) vouches for \
         (Secure Boot firmware refuses it)"
    )]
    NotTrusted { signer: String, trusted: String },
    #[error("unsupported {what}: {oid} (only SHA-256 with RSA)")]
    Unsupported { what: &'static str, oid: String },
}
