//! The new UKI handed to `slate installer upgrade` by the process that verified it, so that its
//! bytes are hashed once across the two (issue 43): machined hashes an upload's UKI as it
//! arrives and keeps it in a sealed memfd (`slate_bundle::seal_verified`); the Upgrade sequence
//! starts the bundle's own installer with that memfd open and names it in two environment
//! variables, which the installer takes instead of hashing the UKI's file again.
//!
//! Environment variables, not options: machined runs the *target* version's installer, and an
//! installer from before this handover ignores them and hashes the file as it always did, where
//! an unknown option would refuse the upgrade. Set, they must be right: a descriptor that is not
//! a sealed memfd of the signed size, or a digest other than the one the bundle signs for its
//! UKI, refuses the upgrade before anything is written (`Bundle::handed_over_blob`).

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use slate_bundle::{BlobBytes, Bundle, BundleError, Digest, HandoverError};

pub use slate_bundle::{UKI_DIGEST_ENV, UKI_FD_ENV};

/// A verified UKI handed over: the sealed memfd and the digest its bytes were checked against.
#[derive(Debug, Clone)]
pub struct UkiHandover {
    fd: Arc<OwnedFd>,
    digest: Digest,
}

/// Why the handover the environment names could not be taken up.
#[derive(Debug, thiserror::Error)]
pub enum HandoverEnvError {
    #[error("{set} is set but {unset} is not: a UKI is handed over with both")]
    Half {
        set: &'static str,
        unset: &'static str,
    },
    #[error("{UKI_FD_ENV}={0:?} is not a descriptor number")]
    BadFd(String),
    #[error("{UKI_DIGEST_ENV}={0:?} is not a digest (sha256:<64 lower-case hex>)")]
    BadDigest(String),
    #[error("{UKI_FD_ENV}={fd}: the descriptor is not open")]
    Open {
        fd: u32,
        #[source]
        source: std::io::Error,
    },
}

impl UkiHandover {
    pub fn new(fd: OwnedFd, digest: Digest) -> Self {
        UkiHandover {
            fd: Arc::new(fd),
            digest,
        }
    }

    /// The handover this process was started with, if any ([`UKI_FD_ENV`], [`UKI_DIGEST_ENV`]).
    pub fn from_env() -> Result<Option<Self>, HandoverEnvError> {
        Self::from_vars(
            std::env::var_os(UKI_FD_ENV),
            std::env::var_os(UKI_DIGEST_ENV),
        )
    }

    fn from_vars(
        fd: Option<OsString>,
        digest: Option<OsString>,
    ) -> Result<Option<Self>, HandoverEnvError> {
        let (fd, digest) = match (fd, digest) {
            (None, None) => return Ok(None),
            (Some(fd), Some(digest)) => (fd, digest),
            (Some(_), None) => return Err(half(UKI_FD_ENV, UKI_DIGEST_ENV)),
            (None, Some(_)) => return Err(half(UKI_DIGEST_ENV, UKI_FD_ENV)),
        };
        let text = |v: OsString| v.to_string_lossy().into_owned();
        let fd_text = text(fd);
        let fd: u32 = fd_text
            .parse()
            .map_err(|_| HandoverEnvError::BadFd(fd_text.clone()))?;
        let digest_text = text(digest);
        let digest =
            Digest::parse(&digest_text).map_err(|_| HandoverEnvError::BadDigest(digest_text))?;
        // Reopened through /proc rather than adopted by number: the memfd's seals belong to
        // the file, so the new descriptor carries them, and taking ownership of a raw number
        // would need `unsafe` for nothing gained.
        let file = File::open(format!("/proc/self/fd/{fd}"))
            .map_err(|source| HandoverEnvError::Open { fd, source })?;
        Ok(Some(UkiHandover::new(file.into(), digest)))
    }

    /// The bundle's UKI from the handed-over memfd, checked and not hashed (module docs).
    pub(crate) fn take(&self, bundle: &Bundle) -> Result<BlobBytes, BundleError> {
        let fd = self.fd.try_clone().map_err(|source| {
            BundleError::from(HandoverError::Io {
                what: "the uki blob".into(),
                source,
            })
        })?;
        bundle.handed_over_blob(slate_bundle::UKI_ROLE, fd, &self.digest)
    }
}

fn half(set: &'static str, unset: &'static str) -> HandoverEnvError {
    HandoverEnvError::Half { set, unset }
}

#[cfg(test)]
#[path = "handover_tests.rs"]
mod tests;
