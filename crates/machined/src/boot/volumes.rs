//! The node's data partitions, found by GPT label: waited for (disks are probed after their
//! driver loads), mounted (formatted first when blank), and wiped (their heads zeroed through
//! the Disk trait, so the next mount formats them).

use std::path::Path;
use std::time::{Duration, Instant};

use slate_disk::{Disk, FileDisk, PartitionView};
use slate_host::{BlockPartition, MsFlags};
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
    let started = Instant::now();
    loop {
        match slate_host::find_partition_by_label(label, disk) {
            Ok(part) => return Ok(part),
            Err(err) if started.elapsed() > Duration::from_secs(10) => return Err(err.into()),
            Err(_) => ctx.sleep(Duration::from_millis(100))?,
        }
    }
}

/// Mount a volume, formatting it first when its head is blank (the first boot after install:
/// a journaled ext4), and checking it with `e2fsck -p` otherwise when its superblock says a
/// check would do anything (a power cut's half-written metadata is repaired before the kernel
/// sees it). What e2fsck could not repair by itself
/// fails the task with its output: the fatal path, never a mount of a damaged filesystem.
///
/// A filesystem made by an older slate (busybox's mke2fs: ext2, no journal) gets one with
/// `tune2fs -j` once it checked clean, so it survives the next power cut as well.
pub fn mount_volume(
    ctx: &TaskContext<'_>,
    label: &str,
    disk: Option<&Path>,
    target: &Path,
) -> Result<(), TaskError> {
    let part = wait_for_partition(ctx, label, disk)?;
    prepare(ctx, label, &part.device)?;
    mount_ext4(ctx, label, &part.device, target)
}

/// Formats the volume when its head is blank, else checks it when its superblock asks;
/// returns which (`formatted (blank)`, `checked`, `mounted`: nothing to do).
fn prepare(ctx: &TaskContext<'_>, label: &str, device: &Path) -> Result<&'static str, TaskError> {
    if slate_host::is_blank(device)? {
        ctx.log(&format!(
            "{label} ({}) is blank: formatting it (first boot)",
            device.display()
        ));
        slate_host::format_ext(device, label)?;
        return Ok("formatted (blank)");
    }
    check_volume(ctx, label, device)
}

fn mount_ext4(
    ctx: &TaskContext<'_>,
    label: &str,
    device: &Path,
    target: &Path,
) -> Result<(), TaskError> {
    let source = device.to_string_lossy().into_owned();
    slate_host::mount(
        &source,
        target,
        "ext4",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    ctx.log(&format!("{label} mounted on {}", target.display()));
    Ok(())
}

/// EPHEMERAL on /var as `mode` says (docs/node.md, "/var modes"): `persistent` as any volume
/// (formatted when blank, checked when its superblock asks); `ephemeral` formatted afresh at
/// every boot before it is mounted, so nothing of the last boot's contents is ever read.
pub fn mount_var(
    ctx: &TaskContext<'_>,
    disk: Option<&Path>,
    mode: VarMode,
) -> Result<VarStatus, TaskError> {
    let part = wait_for_partition(ctx, "EPHEMERAL", disk)?;
    let prepared = match mode {
        VarMode::Persistent => prepare(ctx, "EPHEMERAL", &part.device)?,
        VarMode::Ephemeral => {
            ctx.log(&format!(
                "EPHEMERAL ({}): /var is ephemeral: formatting it afresh",
                part.device.display()
            ));
            slate_host::format_ext(&part.device, "EPHEMERAL")?;
            "formatted (ephemeral)"
        }
    };
    mount_ext4(ctx, "EPHEMERAL", &part.device, Path::new(EPHEMERAL_MOUNT))?;
    Ok(VarStatus {
        mode: mode.name().to_owned(),
        encrypted: false,
        unlocked: None,
        prepared: prepared.to_owned(),
    })
}

/// `e2fsck -p` on the unmounted volume when its superblock says preen would do anything (a
/// journal to replay, errors, a check due: [`slate_host::CheckDue`]), logged; a journal added
/// to one made without. A volume that was unmounted cleanly is mounted unchecked, as e2fsck -p
/// would conclude after reading the same superblock: starting e2fsck costs more than the rest
/// of a boot's volume work (0.2-0.3 s each under TCG).
fn check_volume(
    ctx: &TaskContext<'_>,
    label: &str,
    device: &Path,
) -> Result<&'static str, TaskError> {
    let started = Instant::now();
    let done = match slate_host::device_ext_check_due(device)? {
        None => {
            ctx.log(&format!(
                "{label}: clean by its superblock (unmounted cleanly, no check due): e2fsck -p \
                 not needed"
            ));
            "mounted"
        }
        Some(due) => {
            let outcome = slate_host::check_ext(device)
                .map_err(|e| failed(format!("{label} ({}): {e}", device.display())))?;
            ctx.log(&format!(
                "{label}: e2fsck -p ({due}): {} ({} ms)",
                outcome.summary(),
                started.elapsed().as_millis()
            ));
            "checked"
        }
    };
    if slate_host::device_ext_has_journal(device)? == Some(false) {
        ctx.log(&format!(
            "{label} ({}) has no journal (made by an older slate): adding one (tune2fs -j)",
            device.display()
        ));
        slate_host::add_ext_journal(device)?;
    }
    Ok(done)
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
