//! `POST /v1/bundles` on the node: the upload is unpacked by [`slate_bundle::import_tar`]
//! (layout names only, every blob hashed once as it is written, the signature judged before any
//! large blob is read; formats.md §7.4), judged here with `slate_trust` against the node's
//! trusted keys. What an upload verified is remembered for `plan` and the Upgrade sequence of
//! this boot, so they do not read a blob again to check it.
//!
//! Each upload is staged in a directory of its own (`.incoming-<n>`) and renamed to
//! `<manifest hex>` when accepted, so uploads at once never touch each other's files (issue 19:
//! the second replaced the first, whose id, answered 200, then named nothing).
//!
//! # Retention
//!
//! An id answered 200 stays valid until an upgrade installs it or this rule removes it:
//!
//! - at most [`KEEP_RECEIVED`] (3) bundles are kept, newest first by the time each was kept
//!   (or pulled into, or last written); keeping a fourth removes the oldest;
//! - a pull makes room the same way, counting its own bundle as the newest;
//! - a bundle is removed once the Upgrade sequence installed it (its installer ran);
//! - the bundle the running Upgrade sequence uses is never removed, nor an upload in flight;
//!   staging directories of an earlier process are removed.
//!
//! An upload is also refused as soon as it outgrows the free space of the bundle directory's
//! file system at its start, before it fills /var.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

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

/// The blobs received bundles' uploads verified, newest last, kept for `plan` and the
/// Upgrade sequence of this boot; no more than the bundles kept.
static RECEIVED: Mutex<Vec<(Digest, VerifiedBlobs)>> = Mutex::new(Vec::new());

pub(super) fn remember(id: &Digest, verified: VerifiedBlobs) {
    let mut received = RECEIVED.lock().unwrap_or_else(PoisonError::into_inner);
    received.retain(|(kept, _)| kept != id);
    received.push((id.clone(), verified));
    let excess = received.len().saturating_sub(KEEP_RECEIVED + 1);
    received.drain(..excess);
}

fn forget(id: &str) {
    let mut received = RECEIVED.lock().unwrap_or_else(PoisonError::into_inner);
    received.retain(|(kept, _)| kept.hex() != id);
    super::sealed_uki::forget(id);
}

/// What the upload of bundle `id` verified in this process, if it was received since the boot.
pub(super) fn remembered(id: &Digest) -> VerifiedBlobs {
    RECEIVED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(received, _)| received == id)
        .map(|(_, verified)| verified.clone())
        .unwrap_or_default()
}

/// Received bundles kept at most; see the module's retention rule.
pub const KEEP_RECEIVED: usize = 3;
const STAGING: &str = ".incoming-";

/// Staging directories of uploads in progress in this process.
static IN_FLIGHT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// The bundle the running Upgrade sequence uses (one sequence runs at a time).
static IN_USE: Mutex<Option<Digest>> = Mutex::new(None);
/// Keeping a bundle and applying the rule, one at a time.
static KEEPING: Mutex<()> = Mutex::new(());

/// An accepted upload, kept under its id.
pub(super) struct Kept {
    pub(super) received: Received,
    pub(super) bytes: u64,
    /// Its UKI sealed for the installer (`sealed_uki.rs`), or why not.
    pub(super) sealed: Result<super::sealed_uki::Sealed, String>,
}

/// One upload's staging directory, removed (if still there) when dropped.
struct Staging(PathBuf);

impl Staging {
    fn new(root: &Path) -> Result<Self, BackendError> {
        static UPLOADS: AtomicU64 = AtomicU64::new(0);
        let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("{STAGING}{}-{n}", std::process::id()));
        IN_FLIGHT
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(path.clone());
        let staging = Staging(path);
        let _ = fs::remove_dir_all(&staging.0);
        fs::create_dir_all(&staging.0)
            .map_err(|e| BackendError::Failed(format!("{}: {e}", staging.0.display())))?;
        Ok(staging)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
        IN_FLIGHT
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|p| p != &self.0);
    }
}

/// The upload's body, refused once it outgrows the room there was for it.
struct Guarded<'a> {
    inner: &'a mut dyn Read,
    bytes: u64,
    room: Option<u64>,
    root: &'a Path,
}

impl Read for Guarded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        match self.room {
            Some(room) if self.bytes > room => Err(io::Error::other(format!(
                "the upload is larger than the {room} bytes that were free for bundles in {}",
                self.root.display()
            ))),
            _ => Ok(n),
        }
    }
}

/// Receive an upload into a staging directory of its own under `root`, check it against
/// `keys`, keep it as `root/<manifest hex>` and apply the retention rule.
pub(super) fn keep_upload(
    root: &Path,
    keys: &[PublicKey],
    body: &mut dyn Read,
) -> Result<Kept, BackendError> {
    fs::create_dir_all(root)
        .map_err(|e| BackendError::Failed(format!("{}: {e}", root.display())))?;
    let staging = Staging::new(root)?;
    let mut body = Guarded {
        inner: body,
        bytes: 0,
        room: slate_api::upload_room(root).ok(),
        root,
    };
    let received = receive_into(&staging.0, keys, &mut body)?;
    let id = received.bundle.digest().clone();
    let kept = root.join(id.hex());
    let _keeping = KEEPING.lock().unwrap_or_else(PoisonError::into_inner);
    if in_use(id.hex()) {
        // The same bundle again while an upgrade reads it: the one kept stays as it is.
    } else {
        if kept.exists() {
            // Ours was hashed just now; the one kept may be from an earlier boot.
            fs::remove_dir_all(&kept)
                .map_err(|e| BackendError::Failed(format!("{}: {e}", kept.display())))?;
        }
        fs::rename(&staging.0, &kept)
            .map_err(|e| BackendError::Failed(format!("keeping the bundle: {e}")))?;
        remember(&id, received.bundle.verified_blobs());
    }
    touch(&kept);
    let _ = retain_locked(root, Some(&kept));
    // From where it is kept now (the staging directory is gone), trusting what the upload
    // verified: the sealed copy is not hashed again.
    let sealed = Bundle::open_with(&kept, None, received.bundle.verified_blobs())
        .map_err(|e| chain(&e))
        .and_then(|bundle| super::sealed_uki::seal(&bundle));
    Ok(Kept {
        received,
        bytes: body.bytes,
        sealed,
    })
}

/// Marks `dir` as kept now: the rule removes the oldest first.
fn touch(dir: &Path) {
    if let Ok(file) = fs::File::open(dir) {
        let _ = file.set_modified(SystemTime::now());
    }
}

fn in_use(hex: &str) -> bool {
    IN_USE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .is_some_and(|id| id.hex() == hex)
}

/// The Upgrade sequence starts using bundle `id`: the rule leaves it alone.
pub(super) fn hold(id: &Digest) {
    *IN_USE.lock().unwrap_or_else(PoisonError::into_inner) = Some(id.clone());
}

/// The Upgrade sequence installed bundle `id` from `dir`: it is not needed any more.
pub(super) fn used(dir: &Path, id: &Digest) -> io::Result<()> {
    let _keeping = KEEPING.lock().unwrap_or_else(PoisonError::into_inner);
    let mut held = IN_USE.lock().unwrap_or_else(PoisonError::into_inner);
    if held.as_ref() == Some(id) {
        *held = None;
    }
    forget(id.hex());
    fs::remove_dir_all(dir)
}

/// Applies the retention rule under `root`, `newest` (a bundle just kept, or one about to be
/// pulled into) counted as the newest and never removed.
pub(super) fn retain(root: &Path, newest: Option<&Path>) {
    let _keeping = KEEPING.lock().unwrap_or_else(PoisonError::into_inner);
    retain_locked(root, newest);
}

/// At start, before the API takes uploads: removes what uploads of an earlier process left (a
/// power cut or a crash mid-upload) and applies the rule. The room an upload gets is /var's
/// free space, so a staging directory left there would shrink every later upload's room, and
/// only a kept upload ran the rule: a large enough leftover refused every upload after it.
/// Returns how many staging directories were removed.
pub(super) fn tidy(root: &Path) -> usize {
    let _keeping = KEEPING.lock().unwrap_or_else(PoisonError::into_inner);
    retain_locked(root, None)
}

/// The rule; returns how many staging directories of an earlier process it removed.
fn retain_locked(root: &Path, newest: Option<&Path>) -> usize {
    let Ok(entries) = fs::read_dir(root) else {
        return 0;
    };
    let mut stale = 0;
    let in_flight = IN_FLIGHT
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut kept = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(STAGING) {
            if !in_flight.contains(&path) {
                // Left by an earlier process (a reboot or a crash mid-upload).
                stale += usize::from(fs::remove_dir_all(&path).is_ok());
            }
            continue;
        }
        let is_bundle =
            name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !is_bundle || Some(path.as_path()) == newest {
            continue;
        }
        let when = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        kept.push((in_use(&name), when, name, path));
    }
    // The bundle in use takes a place first (it is never removed, and still counts), then the
    // newest; the room left beside `newest` goes to them.
    kept.sort_by(|a, b| (b.0, b.1, &b.2).cmp(&(a.0, a.1, &a.2)));
    let room = KEEP_RECEIVED - usize::from(newest.is_some());
    for (held, _, name, path) in kept.into_iter().skip(room) {
        if !held {
            let _ = fs::remove_dir_all(&path);
            forget(&name);
        }
    }
    stale
}

#[cfg(test)]
#[path = "receive_tests.rs"]
mod tests;
