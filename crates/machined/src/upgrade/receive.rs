//! `POST /v1/bundles` on the node: the upload is unpacked by [`slate_bundle::import_tar`]
//! (layout names only, every blob hashed once as it is written, the signature judged before any
//! large blob is read; formats.md §7.4), judged here with `slate_trust` against the node's
//! trusted keys. What an upload verified is remembered for `plan` and the Upgrade sequence of
//! this boot, so they do not read a blob again to check it.

use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

use slate_api::BackendError;
use slate_bundle::{
    Bundle, Digest, ImportError, Imported, JudgeError, VerifiedBlobs, INSTALLER_ROLE,
};
use slate_sequencer::error_chain as chain;
use slate_trust::{PublicKey, TrustError};

/// What an accepted upload left in its staging directory: the bundle, opened with every blob
/// verified as it arrived, and the short id of the trusted key whose signature verified.
pub(super) type Received = Imported<String>;

pub(super) fn invalid(message: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidArgument(message.to_string())
}

/// The node's verdict on an upload's documents: signed by one of `keys`, and carrying an
/// installer (the binary the Upgrade sequence runs). Returns the signer's short key id.
fn judge(bundle: &Bundle, keys: &[PublicKey]) -> Result<String, JudgeError> {
    let verified = slate_trust::verify(bundle, keys).map_err(|e| match e {
        TrustError::Bundle(e) => JudgeError::Bundle(e),
        e => JudgeError::Refused(chain(&e)),
    })?;
    bundle.blob_ref(INSTALLER_ROLE)?;
    Ok(verified.key_id.short())
}

/// The API's answer to an upload that was not imported: the staging directory failing is the
/// node's fault, anything else the upload's.
fn backend_error(error: ImportError) -> BackendError {
    match error {
        ImportError::Io { .. } => BackendError::Failed(error.to_string()),
        _ => invalid(error),
    }
}

/// Unpack and check the upload `body` into the empty directory `dir`, against `keys`.
pub(super) fn receive_into(
    dir: &Path,
    keys: &[PublicKey],
    body: &mut dyn Read,
) -> Result<Received, BackendError> {
    slate_bundle::import_tar(body, dir, &mut |bundle| judge(bundle, keys)).map_err(backend_error)
}

/// The blobs a received bundle's upload verified, kept for `plan` and the Upgrade sequence of
/// this boot. One bundle at a time, like the bundle directory.
static RECEIVED: Mutex<Option<(Digest, VerifiedBlobs)>> = Mutex::new(None);

pub(super) fn remember(id: &Digest, verified: VerifiedBlobs) {
    *RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((id.clone(), verified));
}

/// What the upload of bundle `id` verified in this process, if it was received since the boot.
pub(super) fn remembered(id: &Digest) -> VerifiedBlobs {
    RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .filter(|(received, _)| received == id)
        .map(|(_, verified)| verified.clone())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "receive_tests.rs"]
mod tests;
