//! The node's data partitions, found by GPT label: waited for (disks are probed after their
//! driver loads), mounted (formatted first when blank; `slate_node_fs::volumes`), and wiped (their heads zeroed through
//! the Disk trait, so the next mount formats them).

use std::path::Path;

use slate_disk::{Disk, FileDisk, PartitionView};
use slate_host::BlockPartition;
use slate_node_fs::var_crypt::{self, CryptError};
use slate_node_fs::volumes::{self, VolumeError};
use slate_sequencer::{TaskContext, TaskError};

use slate_api::VarStatus;
use slate_machine_config::{RecoveryKey, RECOVERY_KEY_STATE_PATH};
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
        VolumeError::Check { .. } | VolumeError::Encrypted { .. } => failed(err.to_string()),
        other => other.into(),
    }
}

/// Why /var was not mounted at this boot, for the node to wait in maintenance mode instead of
/// rebooting: a `tpm2` volume this machine's TPM cannot unlock, no TPM, or a volume the mode
/// does not open. Nothing was written to the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarRefused(pub String);

/// EPHEMERAL on /var as `mode` says (docs/node.md, "/var modes"): `persistent` as any volume
/// (formatted when blank, checked when its superblock asks); `ephemeral` formatted afresh at
/// every boot before it is mounted, so nothing of the last boot's contents is ever read;
/// `tpm2` opened with the key the TPM unseals (set up first when blank). A refusal is
/// `Err(Ok(VarRefused))`; any other failure `Err(Err(_))`.
pub fn mount_var(
    ctx: &TaskContext<'_>,
    disk: Option<&Path>,
    mode: VarMode,
    recovery_key: RecoveryKey,
) -> Result<VarStatus, Result<VarRefused, TaskError>> {
    let log = |line: &str| ctx.log(line);
    let target = Path::new(EPHEMERAL_MOUNT);
    let status = |prepared: &str, unlocked: Option<String>| VarStatus {
        mode: mode.name().to_owned(),
        encrypted: mode == VarMode::Tpm2,
        unlocked,
        prepared: prepared.to_owned(),
    };
    let refused_or_failed = |err: VolumeError| match err {
        VolumeError::Encrypted { .. } => Ok(VarRefused(err.to_string())),
        other => Err(task_error(other)),
    };
    if mode != VarMode::Tpm2 {
        let prepared = volumes::mount_volume_as(
            "EPHEMERAL",
            disk,
            target,
            mode == VarMode::Ephemeral,
            &log,
            &|d| ctx.sleep(d).is_ok(),
        )
        .map_err(refused_or_failed)?;
        return Ok(status(prepared, None));
    }
    let part = wait_for_partition(ctx, "EPHEMERAL", disk).map_err(Err)?;
    let recovery = recovery_destination(recovery_key);
    let setting = var_crypt::Setting::node();
    let opened =
        var_crypt::open(&part.device, "EPHEMERAL", &setting, &recovery, &log).map_err(|err| {
            match err {
                CryptError::Refused(why) => Ok(VarRefused(why)),
                other => Err(failed(other.to_string())),
            }
        })?;
    let prepared = volumes::mount_device_as("EPHEMERAL", &opened.device, target, false, &log)
        .map_err(refused_or_failed)?;
    Ok(status(prepared, Some(opened.how)))
}

/// Where the machine configuration's `[var] recovery_key` puts a new volume's recovery key.
pub fn recovery_destination(recovery_key: RecoveryKey) -> var_crypt::Recovery {
    match recovery_key {
        RecoveryKey::Console => var_crypt::Recovery::Log,
        RecoveryKey::State => var_crypt::Recovery::File(
            Path::new(crate::base::paths::STATE_MOUNT).join(RECOVERY_KEY_STATE_PATH),
        ),
        RecoveryKey::None => var_crypt::Recovery::None,
    }
}

/// The status of a /var that was refused: encrypted, locked, not mounted.
pub fn refused_status(mode: VarMode) -> VarStatus {
    VarStatus {
        mode: mode.name().to_owned(),
        encrypted: mode == VarMode::Tpm2,
        unlocked: None,
        prepared: "not mounted: locked".to_owned(),
    }
}

/// A reset's cryptographic erase of a `tpm2` /var: the open volume closed and every key slot
/// destroyed before the head is zeroed (`wipe_head`), so a copy of the disk taken before
/// the reset decrypts nothing either.
pub fn erase_var(ctx: &TaskContext<'_>, disk: Option<&Path>) -> Result<(), TaskError> {
    let part = wait_for_partition(ctx, "EPHEMERAL", disk)?;
    if var_crypt::erase(&part.device, &var_crypt::Setting::node())
        .map_err(|e| failed(e.to_string()))?
    {
        ctx.log(&format!(
            "EPHEMERAL ({}): LUKS2 key slots destroyed (cryptsetup erase): its contents can no \
             longer be decrypted",
            part.device.display()
        ));
    }
    Ok(())
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
