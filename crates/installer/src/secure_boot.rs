//! The pre-write Secure Boot check: a boot file the target's firmware would refuse is never
//! written. A refused UKI is not a failed boot that boot counting reverts: systemd-boot prints
//! "Access Denied" and returns to the firmware, which waits at its prompt for a person.
//!
//! What the target trusts: the certificates the caller names (on a node, the db certificate its
//! running image carries, `/etc/slate/secureboot/db.pem`), else the `db.auth` on the target's
//! ESP (what its first boot enrolled), else nothing — a target that enrols no keys is not
//! checked.

use std::path::Path;

use slate_disk::FileDisk;
use slate_secureboot::{certs_from_auth, verify_pe, Signer, TrustedCerts, VerifyError};

/// Why a Secure Boot target was refused a boot file, or its trust could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecureBootError {
    #[error(
        "{what} would be refused by the target's Secure Boot firmware (trusted db: {trusted})"
    )]
    Refused {
        what: String,
        trusted: String,
        #[source]
        source: VerifyError,
    },
    #[error("the Secure Boot db certificates: {0}")]
    BadDb(String),
    #[error("reading the enrolled Secure Boot keys on {disk}")]
    ReadDb {
        disk: std::path::PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The certificates inside a `db.auth` (the enrolment file a Secure Boot image ships).
pub fn trusted_from_db_auth(db_auth: &[u8]) -> Result<TrustedCerts, SecureBootError> {
    let ders = certs_from_auth(db_auth).map_err(|e| SecureBootError::BadDb(e.to_string()))?;
    if ders.is_empty() {
        return Err(SecureBootError::BadDb(
            "db.auth holds no X.509 certificate".into(),
        ));
    }
    TrustedCerts::from_der(ders.iter().map(Vec::as_slice)).map_err(SecureBootError::BadDb)
}

/// PEM certificates (`--secureboot-db`, a node's `/etc/slate/secureboot/db.pem`).
pub fn trusted_from_pem(pem: &[u8]) -> Result<TrustedCerts, SecureBootError> {
    TrustedCerts::from_pem(pem).map_err(SecureBootError::BadDb)
}

/// What a slate disk's ESP says its firmware trusts: the certificates of its `db.auth`, or
/// `None` when it enrols no keys.
pub fn enrolled_on(disk: &Path) -> Result<Option<TrustedCerts>, SecureBootError> {
    let read_err = |source: Box<dyn std::error::Error + Send + Sync>| SecureBootError::ReadDb {
        disk: disk.to_owned(),
        source,
    };
    let file = FileDisk::open_read_only(disk).map_err(|e| read_err(e.into()))?;
    match slate_bootloader::enrolled_db_auth(&file).map_err(|e| read_err(e.into()))? {
        Some(auth) => trusted_from_db_auth(&auth).map(Some),
        None => Ok(None),
    }
}

/// Refuse `image` (named `what` in the error) unless a certificate in `trusted` vouches for its
/// signature.
pub fn check_signed(
    what: &str,
    image: &[u8],
    trusted: &TrustedCerts,
) -> Result<Signer, SecureBootError> {
    verify_pe(image, trusted).map_err(|source| SecureBootError::Refused {
        what: what.to_owned(),
        trusted: trusted.subjects().join("; "),
        source,
    })
}

#[cfg(test)]
#[path = "secure_boot_tests.rs"]
mod tests;
