//! Boot's tasks on a snapshot root (`base::snapshot_root`): Initialize opens the pool and
//! cleans up after an interrupted upgrade; Boot mounts `@state` and `@home`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use slate_sequencer::{Task, TaskContext, TaskError};
use slate_snapshot_engine as engine;

use crate::base::node::Node;
use crate::base::paths::STATE_MOUNT;
use crate::base::snapshot_root::{open_pool, SnapshotRoot, HOME_SUBVOLUME, STATE_SUBVOLUME};
use crate::base::task::{failed, task};

/// Initialize's task on a snapshot root: the pool's disk is the system disk, and what an
/// upgrade cut short by a power cut or a kill left on the pool is removed now, before the
/// boot is settled and before any new upgrade.
pub fn initialize(
    ctx: &TaskContext<'_>,
    node: &Node,
    system_disk: &Mutex<Option<PathBuf>>,
) -> Result<(), TaskError> {
    let Some(root) = &node.snapshot_root else {
        return Ok(());
    };
    ctx.log(&format!(
        "the root is Btrfs snapshot {} on {} (disk {}): no META, the snapshot engine settles \
         the boot",
        root.snapshot,
        root.device.display(),
        root.disk.display()
    ));
    let pool = open_pool(root, true).map_err(failed)?;
    engine::clean_up_interrupted(&pool, &mut |line| ctx.log(&line))
        .map_err(|e| failed(slate_sequencer::error_chain(&e)))?;
    *system_disk.lock().unwrap_or_else(|p| p.into_inner()) = Some(root.disk.clone());
    Ok(())
}

/// Boot's volumes on a snapshot root: `@state` on `/system/state`, `@home` on `/home`.
pub fn volume_tasks(node: &Node) -> Vec<Task<'_>> {
    let mounts = [
        ("mountState", STATE_SUBVOLUME, STATE_MOUNT),
        ("mountHome", HOME_SUBVOLUME, "/home"),
    ];
    mounts
        .into_iter()
        .map(|(name, subvolume, target)| {
            task(node, name, move |ctx| match &node.snapshot_root {
                Some(root) => mount_subvolume(ctx, root, subvolume, Path::new(target)),
                None => Ok(()),
            })
        })
        .collect()
}

/// Mounts the pool's `subvolume` on `target` (a Boot task).
pub fn mount_subvolume(
    ctx: &TaskContext<'_>,
    root: &SnapshotRoot,
    subvolume: &str,
    target: &Path,
) -> Result<(), TaskError> {
    std::fs::create_dir_all(target)
        .map_err(|e| failed(format!("creating {}: {e}", target.display())))?;
    slate_host::mount(
        &root.device,
        target,
        "btrfs",
        slate_host::MsFlags::MS_NOSUID | slate_host::MsFlags::MS_NODEV,
        Some(&format!("subvol={subvolume}")),
    )?;
    ctx.log(&format!(
        "mounted {subvolume} of {} on {}",
        root.device.display(),
        target.display()
    ));
    Ok(())
}
