//! The node's data partitions, found by GPT label: waited for (disks are probed after their
//! driver loads), mounted (formatted first when blank; `slate_node_fs::volumes`), and wiped (their heads zeroed through
//! the Disk trait, so the next mount formats them).

use std::path::Path;

use slate_disk::{Disk, FileDisk, PartitionView};
use slate_host::BlockPartition;
use slate_node_fs::volumes::{self, VolumeError};
use slate_sequencer::{TaskContext, TaskError};

use slate_api::VarStatus;
use slate_profile::VarMode;

use crate::base::paths::EPHEMERAL_MOUNT;
use crate::base::task::failed;

/// Disks are probed asynchronously after their driver loads: wait a while for a partition
/// before concluding it does not exist.
pub fn wait_for_partition(
    ctx: &TaskContext<'_>,
    label: &str,
    disk: Option<&Path>,
) -> Result<BlockPartition, TaskError> {
    volumes::wait_for_partition(label, disk, &|d| ctx.sleep(d).is_ok()).map_err(task_error)
}

/// Mount a volume, formatting it first when its head is blank and checking it with `e2fsck -p`
/// when its superblock says so (`slate_node_fs::volumes::mount_volume`, which init runs the
/// same way on a systemd image). What e2fsck could not repair fails the task with its output:
/// the fatal path, never a mount of a damaged filesystem.
pub fn mount_volume(
    ctx: &TaskContext<'_>,
    label: &str,
    disk: Option<&Path>,
    target: &Path,
) -> Result<(), TaskError> {
    volumes::mount_volume(label, disk, target, &|line| ctx.log(line), &|d| {
        ctx.sleep(d).is_ok()
    })
    .map_err(task_error)
}

fn task_error(err: VolumeError) -> TaskError {
    match err {
        VolumeError::Cancelled(_) => TaskError::Cancelled,
        VolumeError::Check { .. } => failed(err.to_string()),
        other => other.into(),
    }
}

/// EPHEMERAL on /var as `mode` says (docs/node.md, "/var modes"): `persistent` as any volume
/// (formatted when blank, checked when its superblock asks); `ephemeral` formatted afresh at
/// every boot before it is mounted, so nothing of the last boot's contents is ever read.
pub fn mount_var(
    ctx: &TaskContext<'_>,
    disk: Option<&Path>,
    mode: VarMode,
) -> Result<VarStatus, TaskError> {
    let prepared = volumes::mount_volume_as(
        "EPHEMERAL",
        disk,
        Path::new(EPHEMERAL_MOUNT),
        mode == VarMode::Ephemeral,
        &|line| ctx.log(line),
        &|d| ctx.sleep(d).is_ok(),
    )
    .map_err(task_error)?;
    Ok(VarStatus {
        mode: mode.name().to_owned(),
        encrypted: false,
        unlocked: None,
        prepared: prepared.to_owned(),
    })
}

/// Zero the first MiB of the partition labelled `label` (on `disk`, when known): the next
/// mount finds it blank and formats it.
pub fn wipe_head(ctx: &TaskContext<'_>, label: &str, disk: Option<&Path>) -> Result<(), TaskError> {
    let part = wait_for_partition(ctx, label, disk)?;
    let mut disk = FileDisk::open(&part.device)
        .map_err(|e| failed(format!("opening {}: {e}", part.device.display())))?;
    let len = disk.len().min(1 << 20);
    let mut view = PartitionView::new(&mut disk, 0, len)?;
    view.write_at(0, &vec![0u8; len as usize])?;
    view.flush()?;
    ctx.log(&format!("{label} ({}) wiped", part.device.display()));
    Ok(())
}
