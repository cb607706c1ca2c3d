//! `/etc` across versions: a writable overlay over the image's `/etc`, reset when the booted
//! version is not the one its upper layer belongs to, and the setup hooks run once per such
//! reset (the `hooks` module). The layout on STATE and the crash-safety order are in
//! `docs/node.md` ("/etc across versions").
//!
//! The core ([`prepare_upper`] in `upper.rs`, `run_setup_hooks` in `hooks.rs`) works on any
//! directory, so it is tested on a temporary one; only [`mount_overlay`] touches the real
//! system. The records and file helpers both share live here.

mod upper;

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use upper::{prepare_upper, EtcChange, EtcPrepared};

/// Where the overlay is mounted, and its lower layer (the image's `/etc`).
pub const ETC: &str = "/etc";
/// The image's setup hooks.
pub const SETUP_HOOKS_DIR: &str = "/usr/lib/slate/setup.d";
/// The user's setup hooks: on /var, so they outlive every reset of /etc.
pub const USER_SETUP_HOOKS_DIR: &str = "/var/lib/slate/etc-setup-hooks";
/// What the user's hooks (the directory and each entry) must resolve inside.
pub const USER_SETUP_HOOKS_CONFINE: &str = "/var";
/// How long one setup hook may run before it is killed (and the boot fails).
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// The overlay's upper layer (what differs from the image's `/etc`).
const UPPER: &str = "upper";
/// A reset's new upper while it is built.
const UPPER_NEXT: &str = "upper.next";
/// The old upper between the two renames of a reset.
const UPPER_OLD: &str = "upper.old";
/// overlayfs' scratch directory, on the same filesystem as the upper.
const WORK: &str = "work";
/// The version the upper belongs to: one line.
const VERSION_RECORD: &str = "upper.version";
/// The version whose setup hooks all succeeded on this upper: one line.
pub(crate) const HOOKS_RECORD: &str = "hooks.done";
const MACHINE_ID: &str = "machine-id";

/// The directory on STATE that holds `/etc`'s layers and records.
pub fn state_etc_dir() -> PathBuf {
    Path::new(crate::volumes::STATE_MOUNT).join("etc")
}

#[derive(Debug, thiserror::Error)]
pub enum EtcError {
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the version {0:?} cannot be recorded (empty, or not one printable line)")]
    InvalidVersion(String),
    #[error("cannot keep {path} in /etc: {reason}")]
    InvalidKeep { path: PathBuf, reason: &'static str },
    #[error("setup hook {name} failed: {reason}")]
    HookFailed { name: String, reason: String },
    /// A user's hook directory or entry that leads out of the directory it must stay in.
    #[error("setup hooks refused, none ran: {path} resolves to {resolved}, outside {confine}")]
    HookOutside {
        path: PathBuf,
        resolved: PathBuf,
        confine: PathBuf,
    },
    #[error("the setup hooks were cancelled")]
    Cancelled,
    /// A simulated power cut just before the named step of a reset (tests).
    #[error("interrupted before {0}")]
    Interrupted(&'static str),
    #[error(transparent)]
    Host(#[from] slate_host::HostError),
}

pub(crate) fn io_error<'p>(
    op: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> EtcError + 'p {
    move |source| EtcError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Mount the overlay on `etc` (`/etc` on a node): the image's `etc` below, the upper and work
/// directories of `state_etc_dir` (prepared by [`prepare_upper`]) above.
pub fn mount_overlay(etc: &Path, state_etc_dir: &Path) -> Result<(), EtcError> {
    slate_host::mount_overlay(
        etc,
        &state_etc_dir.join(UPPER),
        &state_etc_dir.join(WORK),
        etc,
    )?;
    Ok(())
}

/// A one-line record's value, `None` when there is none.
/// Whether the setup hooks have yet to succeed for `version` on the current upper.
pub fn hooks_due(state_etc_dir: &Path, version: &str) -> Result<bool, EtcError> {
    Ok(read_record(&state_etc_dir.join(HOOKS_RECORD))?.as_deref() != Some(version))
}

pub(crate) fn read_record(path: &Path) -> Result<Option<String>, EtcError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.strip_suffix('\n').unwrap_or(&text).to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("read", path)(e)),
    }
}

/// Replace the record `name` in `dir` by `value`: temporary file, sync, rename, sync the
/// directory — the record is the old one or the new one, never a torn one.
pub(crate) fn write_record(dir: &Path, name: &str, value: &str) -> Result<(), EtcError> {
    replace_file(dir, name, format!("{value}\n").as_bytes(), 0o644)
}

/// Replace `dir/name` atomically: temporary file, sync, rename, sync the directory.
fn replace_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), EtcError> {
    let tmp = dir.join(format!("{name}.tmp"));
    write_file(&tmp, bytes, mode)?;
    rename(&tmp, &dir.join(name))?;
    sync_dir(dir)
}

/// Create (or truncate) `path` with `bytes` and `mode`, synced.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), EtcError> {
    let mut file = File::create(path).map_err(io_error("create", path))?;
    file.write_all(bytes)
        .and_then(|()| file.set_permissions(fs::Permissions::from_mode(mode & 0o7777)))
        .and_then(|()| file.sync_all())
        .map_err(io_error("write", path))
}

fn rename(from: &Path, to: &Path) -> Result<(), EtcError> {
    fs::rename(from, to).map_err(io_error("rename", from))
}

fn sync_dir(path: &Path) -> Result<(), EtcError> {
    File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error("sync", path))
}

#[cfg(test)]
mod tests;
