//! `/etc` across versions as Boot tasks: the overlay (task `etcOverlay`) and the setup hooks
//! (task `setupHooks`). The logic is `slate_node_fs`'s, shared with init, which does the same
//! on a systemd image before it executes systemd; the layout on STATE and the crash-safety
//! order are in `docs/node.md` ("/etc across versions").

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use slate_node_fs::etc::{mount_overlay, prepare_upper, state_etc_dir, EtcError};
use slate_node_fs::hooks::{hooks_due, run_setup_hooks, HookDir, HookRun};
use slate_node_fs::{SETUP_HOOKS_DIR, USER_SETUP_HOOKS_DIR};
use slate_sequencer::{TaskContext, TaskError};

use crate::base::node::Node;

pub use slate_node_fs::ETC;

/// How long one setup hook may run before it is killed (and the boot fails).
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// The files of `/etc` that survive a reset besides `machine-id`, relative to `/etc`: the
/// machine configuration's `etc.keep` and the files it places into /etc.
pub fn etc_keep_list(node: &Node) -> Vec<PathBuf> {
    node.machine
        .current()
        .map(|config| config.etc_keep().into_iter().map(PathBuf::from).collect())
        .unwrap_or_default()
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
    mount_overlay(Path::new(ETC), &dir)?;
    ctx.log(&format!(
        "/etc is an overlay: the image's /etc below, {} above",
        dir.join("upper").display()
    ));
    Ok(())
}

/// Task `setupHooks`: the image's and the user's setup hooks, when they are due for the booted
/// version.
pub(crate) fn setup_hooks_task(ctx: &TaskContext<'_>, node: &Node) -> Result<(), TaskError> {
    let state_etc_dir = state_etc_dir();
    // The etc overlay made it on an image root; a snapshot root (its /etc is its own) has
    // only the record here.
    fs::create_dir_all(&state_etc_dir).map_err(|source| EtcError::Io {
        op: "create",
        path: state_etc_dir.clone(),
        source,
    })?;
    let dirs = [
        HookDir::image(Path::new(SETUP_HOOKS_DIR)),
        HookDir::user(
            Path::new(USER_SETUP_HOOKS_DIR),
            Path::new(slate_node_fs::etc::USER_SETUP_HOOKS_CONFINE),
        ),
    ];
    let run = HookRun {
        dirs: &dirs,
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
