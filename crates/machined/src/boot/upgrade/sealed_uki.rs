//! The newest upload's UKI, kept sealed in a memfd for the installer of this boot (issue 43):
//! the upload hashed it as it arrived, and the installer, handed the sealed copy
//! (`slate_installer::UkiHandover`), writes it without hashing it again. A file on /var could
//! change between the two; the sealed memfd cannot, so the installer's check is still about the
//! bytes it writes.
//!
//! One at a time, the newest upload's: it costs its size in RAM until the upgrade installs it,
//! another upload replaces it (both are held while the new one is copied), or the retention
//! rule removes its bundle. A staged upgrade (after
//! a reboot) and a pulled bundle have none, and their installer hashes the UKI as before.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use slate_bundle::{Bundle, Digest, UKI_ROLE};

/// A bundle's UKI in a sealed memfd, and the digest it was verified against.
pub(super) struct Sealed {
    bundle: Digest,
    uki: Digest,
    fd: Arc<OwnedFd>,
}

static SEALED: Mutex<Option<Sealed>> = Mutex::new(None);

/// Seal the UKI of the just kept `bundle`, which its upload verified (a blob it did not is
/// hashed as it is copied, and a mismatch seals nothing).
pub(super) fn seal(bundle: &Bundle) -> Result<Sealed, String> {
    let uki = Digest::parse(&bundle.blob_ref(UKI_ROLE).map_err(|e| e.to_string())?.digest)
        .map_err(|e| e.to_string())?;
    let mut blob = bundle.open_blob(UKI_ROLE).map_err(|e| e.to_string())?;
    let fd = slate_bundle::seal_verified_from("slate-uki", &mut blob)
        .map_err(|e| format!("sealing the UKI in a memfd: {e}"))?;
    Ok(Sealed {
        bundle: bundle.digest().clone(),
        uki,
        fd: Arc::new(fd),
    })
}

/// Keep `sealed` for the installer, in place of the one kept before.
pub(super) fn keep(sealed: Sealed) {
    *lock() = Some(sealed);
}

impl Sealed {
    /// The descriptor and the digest its bytes were verified against.
    pub(super) fn parts(&self) -> (Arc<OwnedFd>, Digest) {
        (Arc::clone(&self.fd), self.uki.clone())
    }
}

/// The sealed UKI of bundle `id` and the digest it was verified against, if one is kept.
pub(super) fn of(id: &Digest) -> Option<(Arc<OwnedFd>, Digest)> {
    lock()
        .as_ref()
        .filter(|s| &s.bundle == id)
        .map(Sealed::parts)
}

/// Bundle `id` was installed or removed: its sealed UKI is not needed any more.
pub(super) fn forget(id_hex: &str) {
    let mut sealed = lock();
    if sealed.as_ref().is_some_and(|s| s.bundle.hex() == id_hex) {
        *sealed = None;
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Sealed>> {
    SEALED.lock().unwrap_or_else(PoisonError::into_inner)
}
