//! `/etc` across versions: a writable overlay over the image's `/etc`, reset when the booted
//! version is not the one its upper layer belongs to, and the image's setup hooks run once per
//! such reset (`hooks.rs`). The layout on STATE and the crash-safety order are in
//! `docs/node.md` ("/etc across versions").
//!
//! The core ([`prepare_upper`] in `upper.rs`, [`run_setup_hooks`] in `hooks.rs`) works on any
//! directory, so it is tested on a temporary one; only [`mount_overlay`] and the two tasks at
//! the bottom touch the real system. The records and file helpers both share live here.

mod hooks;
mod upper;

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use slate_sequencer::{TaskContext, TaskError};

pub use hooks::{hooks_due, run_setup_hooks, HookRun};
pub use upper::prepare_upper;

use crate::base::node::Node;

/// Where the overlay is mounted, and its lower layer (the image's `/etc`).
pub const ETC: &str = "/etc";
/// The image's setup hooks.
pub const SETUP_HOOKS_DIR: &str = "/usr/lib/slate/setup.d";
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
const HOOKS_RECORD: &str = "hooks.done";
const MACHINE_ID: &str = "machine-id";

/// The directory on STATE that holds `/etc`'s layers and records.
pub fn state_etc_dir() -> PathBuf {
    Path::new(crate::base::paths::STATE_MOUNT).join("etc")
}

/// The files of `/etc` that survive a reset besides `machine-id`, relative to `/etc`: the
/// machine configuration's `etc.keep` and the files it places into /etc.
pub fn etc_keep_list(node: &Node) -> Vec<PathBuf> {
    node.machine
        .current()
        .map(|config| config.etc_keep().into_iter().map(PathBuf::from).collect())
        .unwrap_or_default()
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
    #[error("the setup hooks were cancelled")]
    Cancelled,
    /// A simulated power cut just before the named step of a reset (tests).
    #[error("interrupted before {0}")]
    Interrupted(&'static str),
    #[error(transparent)]
    Host(#[from] slate_host::HostError),
}

fn io_error<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> EtcError + 'p {
    move |source| EtcError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Mount the overlay on `/etc`: the image's `/etc` below, the upper and work directories of
/// `state_etc_dir` (prepared by [`prepare_upper`]) above.
pub fn mount_overlay(state_etc_dir: &Path) -> Result<(), EtcError> {
    let etc = Path::new(ETC);
    slate_host::mount_overlay(
        etc,
        &state_etc_dir.join(UPPER),
        &state_etc_dir.join(WORK),
        etc,
    )?;
    Ok(())
}

/// A one-line record's value, `None` when there is none.
fn read_record(path: &Path) -> Result<Option<String>, EtcError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.strip_suffix('\n').unwrap_or(&text).to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("read", path)(e)),
    }
}

/// Replace the record `name` in `dir` by `value`: temporary file, sync, rename, sync the
/// directory — the record is the old one or the new one, never a torn one.
fn write_record(dir: &Path, name: &str, value: &str) -> Result<(), EtcError> {
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

/// Task `etcOverlay`: prepare the upper on STATE for the booted version and mount the overlay.
pub(crate) fn overlay_task(
    ctx: &TaskContext<'_>,
    node: &Node,
    keep: &[PathBuf],
) -> Result<(), TaskError> {
    let dir = state_etc_dir();
    let prepared = prepare_upper(&dir, &node.version, keep)?;
    for note in &prepared.recovered {
        ctx.log(&format!(
            "/etc: an interrupted reset was cleaned up: {note}"
        ));
    }
    ctx.log(&prepared.summary());
    mount_overlay(&dir)?;
    ctx.log(&format!(
        "/etc is an overlay: the image's /etc below, {} above",
        dir.join(UPPER).display()
    ));
    Ok(())
}

/// Task `setupHooks`: the image's setup hooks, when they are due for the booted version.
pub(crate) fn setup_hooks_task(ctx: &TaskContext<'_>, node: &Node) -> Result<(), TaskError> {
    let state_etc_dir = state_etc_dir();
    // The etc overlay made it on an image root; a snapshot root (its /etc is its own) has
    // only the record here.
    fs::create_dir_all(&state_etc_dir).map_err(io_error("create", &state_etc_dir))?;
    let run = HookRun {
        dir: Path::new(SETUP_HOOKS_DIR),
        timeout: HOOK_TIMEOUT,
        state_etc_dir: &state_etc_dir,
        version: &node.version,
    };
    hooks_when_due(ctx, &run)
}

/// The body of task `setupHooks`, on any directories.
fn hooks_when_due(ctx: &TaskContext<'_>, run: &HookRun<'_>) -> Result<(), TaskError> {
    if !hooks_due(run.state_etc_dir, run.version)? {
        ctx.log(&format!("setup hooks already ran for {}", run.version));
        return Ok(());
    }
    match run_setup_hooks(run, |line| ctx.log(line), ctx.cancel_token()) {
        Ok(_) => Ok(()),
        Err(EtcError::Cancelled) => Err(TaskError::Cancelled),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests;
