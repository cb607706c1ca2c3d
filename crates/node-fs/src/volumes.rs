//! The node's data partitions (STATE, EPHEMERAL), found by GPT label: waited for (disks are
//! probed after their driver loads), then formatted when blank, checked when their superblock
//! says a check would do anything, and mounted. machined runs this as its `volumes` Boot tasks;
//! init runs it before it executes systemd on a systemd image.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use slate_host::{BlockPartition, CheckDue, HostError, MsFlags};

/// STATE's label and mount point: the machine configuration, the node's key, /etc's upper.
pub const STATE_LABEL: &str = "STATE";
pub const STATE_MOUNT: &str = "/system/state";
/// EPHEMERAL's label and mount point: /var.
pub const EPHEMERAL_LABEL: &str = "EPHEMERAL";
pub const EPHEMERAL_MOUNT: &str = "/var";

/// How long a data partition may take to appear.
pub const PARTITION_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(transparent)]
    Host(#[from] HostError),
    /// `e2fsck -p` could not make the filesystem safe to mount (its output in `cause`).
    #[error("{label} ({}): {cause}", device.display())]
    Check {
        label: String,
        device: PathBuf,
        cause: Box<HostError>,
    },
    #[error("cancelled while waiting for the partition labelled {0}")]
    Cancelled(String),
    /// A LUKS volume where a plain filesystem is expected (a `tpm2` /var's, now under another
    /// mode): never checked, formatted or mounted.
    #[error(
        "{label} ({}) holds a LUKS volume (a tpm2 /var): /var mode {mode} does not open it and \
         nothing was written to it; set [var] mode = \"tpm2\" again, or `slate reset` to wipe it",
        device.display()
    )]
    Encrypted {
        label: String,
        device: PathBuf,
        mode: &'static str,
    },
}

/// What a volume needs before it is mounted, from its head and superblock alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preparation {
    /// Its head is blank: the first boot after an install, a reset or a replacement.
    Format,
    /// A filesystem whose superblock says `e2fsck -p` would do something, and why.
    Check(CheckDue),
    /// Unmounted cleanly, no check due: mounted as it is.
    Clean,
}

/// The one decision: blank → format; otherwise check when a check is due.
pub fn preparation(blank: bool, due: Option<CheckDue>) -> Preparation {
    match (blank, due) {
        (true, _) => Preparation::Format,
        (false, Some(due)) => Preparation::Check(due),
        (false, None) => Preparation::Clean,
    }
}

/// Wait up to [`PARTITION_WAIT`] for the partition labelled `label` (on `disk`, when known).
/// `sleep` waits between looks; it returns `false` when the wait is cancelled.
pub fn wait_for_partition(
    label: &str,
    disk: Option<&Path>,
    sleep: &dyn Fn(Duration) -> bool,
) -> Result<BlockPartition, VolumeError> {
    let started = Instant::now();
    loop {
        match slate_host::find_partition_by_label(label, disk) {
            Ok(part) => return Ok(part),
            Err(err) if started.elapsed() > PARTITION_WAIT => return Err(err.into()),
            Err(_) => {
                if !sleep(Duration::from_millis(100)) {
                    return Err(VolumeError::Cancelled(label.to_owned()));
                }
            }
        }
    }
}

/// Mount the volume labelled `label` at `target`, formatting it first when its head is blank
/// (a journaled ext4), and checking it with `e2fsck -p` otherwise when its superblock says a
/// check would do anything (a power cut's half-written metadata is repaired before the kernel
/// sees it). What e2fsck could not repair by itself is an error with its output: a damaged
/// filesystem is never mounted. A filesystem made by an older slate (ext2, no journal) gets one
/// with `tune2fs -j` once it checked clean. Each step is logged through `log`.
pub fn mount_volume(
    label: &str,
    disk: Option<&Path>,
    target: &Path,
    log: &dyn Fn(&str),
    sleep: &dyn Fn(Duration) -> bool,
) -> Result<(), VolumeError> {
    mount_volume_as(label, disk, target, false, log, sleep).map(drop)
}

/// [`mount_volume`]; with `afresh` (an ephemeral /var) the volume is formatted whatever it
/// holds, before anything reads it. Answers what was done: `formatted (blank)`, `formatted
/// (ephemeral)`, `checked` (e2fsck ran) or `mounted`.
pub fn mount_volume_as(
    label: &str,
    disk: Option<&Path>,
    target: &Path,
    afresh: bool,
    log: &dyn Fn(&str),
    sleep: &dyn Fn(Duration) -> bool,
) -> Result<&'static str, VolumeError> {
    let part = wait_for_partition(label, disk, sleep)?;
    mount_device_as(label, &part.device, target, afresh, log)
}

/// [`mount_volume_as`] on a known device: a partition, or an open LUKS2 volume (a `tpm2`
/// /var's `/dev/mapper/slate-var`), whose inside is formatted when blank: the first boot's,
/// or one whose first boot was cut short between the token and the filesystem.
pub fn mount_device_as(
    label: &str,
    device: &Path,
    target: &Path,
    afresh: bool,
    log: &dyn Fn(&str),
) -> Result<&'static str, VolumeError> {
    if afresh {
        log(&format!(
            "{label} ({}): ephemeral: formatting it afresh",
            device.display()
        ));
        slate_host::format_ext(device, label)?;
        mount_ext4(label, device, target, log)?;
        return Ok("formatted (ephemeral)");
    }
    let blank = slate_host::is_blank(device)?;
    if !blank && slate_host::device_is_luks(device)? {
        return Err(VolumeError::Encrypted {
            label: label.to_owned(),
            device: device.to_owned(),
            mode: "persistent",
        });
    }
    let due = if blank {
        None
    } else {
        slate_host::device_ext_check_due(device)?
    };
    let device = &device.to_owned();
    let done = match preparation(blank, due) {
        Preparation::Format => {
            log(&format!(
                "{label} ({}) is blank: formatting it (first boot)",
                device.display()
            ));
            slate_host::format_ext(device, label)?;
            "formatted (blank)"
        }
        Preparation::Clean => {
            log(&format!(
                "{label}: clean by its superblock (unmounted cleanly, no check due): e2fsck -p \
                 not needed"
            ));
            add_journal_when_missing(label, device, log)?;
            "mounted"
        }
        Preparation::Check(due) => {
            let started = Instant::now();
            let outcome = slate_host::check_ext(device).map_err(|cause| VolumeError::Check {
                label: label.to_owned(),
                device: device.clone(),
                cause: Box::new(cause),
            })?;
            log(&format!(
                "{label}: e2fsck -p ({due}): {} ({} ms)",
                outcome.summary(),
                started.elapsed().as_millis()
            ));
            add_journal_when_missing(label, device, log)?;
            "checked"
        }
    };
    mount_ext4(label, device, target, log)?;
    Ok(done)
}

fn mount_ext4(
    label: &str,
    device: &Path,
    target: &Path,
    log: &dyn Fn(&str),
) -> Result<(), VolumeError> {
    let source = device.to_string_lossy().into_owned();
    slate_host::mount(
        &source,
        target,
        "ext4",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    log(&format!("{label} mounted on {}", target.display()));
    Ok(())
}

/// `tune2fs -j` on a checked filesystem made without a journal (by an older slate).
fn add_journal_when_missing(
    label: &str,
    device: &Path,
    log: &dyn Fn(&str),
) -> Result<(), VolumeError> {
    if slate_host::device_ext_has_journal(device)? == Some(false) {
        log(&format!(
            "{label} ({}) has no journal (made by an older slate): adding one (tune2fs -j)",
            device.display()
        ));
        slate_host::add_ext_journal(device)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_luks_volume_is_never_checked_formatted_or_mounted_as_a_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        let device = dir.path().join("ephemeral");
        let mut head = vec![0u8; 1 << 20];
        head[..8].copy_from_slice(b"LUKS\xba\xbe\x00\x02");
        std::fs::write(&device, &head).unwrap();
        let err = mount_device_as(
            "EPHEMERAL",
            &device,
            &dir.path().join("var"),
            false,
            &|_| {},
        )
        .unwrap_err();
        assert!(matches!(err, VolumeError::Encrypted { .. }), "{err}");
        assert!(err.to_string().contains("holds a LUKS volume"), "{err}");
        assert_eq!(std::fs::read(&device).unwrap(), head, "nothing written");
    }

    #[test]
    fn blank_is_formatted_whatever_else_and_a_filesystem_is_checked_only_when_due() {
        assert_eq!(preparation(true, None), Preparation::Format);
        assert_eq!(
            preparation(true, Some(CheckDue::NotExt)),
            Preparation::Format
        );
        assert_eq!(preparation(false, None), Preparation::Clean);
        assert_eq!(
            preparation(false, Some(CheckDue::NotExt)),
            Preparation::Check(CheckDue::NotExt)
        );
    }
}
