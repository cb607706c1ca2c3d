//! The node's system disk, found the one way: by its META partition's GPT label (sysfs
//! `PARTNAME`). META is opened here and nowhere else in machined.

use slate_disk::{FileDisk, PartitionView};
use slate_host::BlockPartition;
use slate_meta::MetaStore;
use slate_sequencer::error_chain;

/// The GPT label slate's installer gives META (the layout's reference label).
pub const META_LABEL: &str = slate_layout::META_LABEL;

/// The META partition of the system disk (`device` `/dev/vda2`, `disk` `/dev/vda`).
pub fn meta_partition() -> Result<BlockPartition, String> {
    slate_host::find_partition_by_label(META_LABEL, None).map_err(|e| e.to_string())
}

/// META as machined holds it: the partition's range of the whole disk.
pub type SystemMeta = MetaStore<PartitionView<FileDisk>>;

/// META on the disk of `part`, for reading (`writable` false) or for a change and a flush.
///
/// Through the whole disk (`/dev/vda`), found again by its GPT label, as the boot loader code
/// and the installer open it — never through the partition's own device (`/dev/vda2`): the
/// two block devices keep separate page caches, so a record written through one was not seen
/// by a later read through the other, and the installer wrote the stale copy back (a
/// replacement's record vanished that way).
pub fn open_meta_on(part: &BlockPartition, writable: bool) -> Result<SystemMeta, String> {
    let disk = if writable {
        FileDisk::open(&part.disk)
    } else {
        FileDisk::open_read_only(&part.disk)
    }
    .map_err(|e| format!("opening {}: {e}", part.disk.display()))?;
    let view = slate_layout::open_partition(disk, META_LABEL)
        .map_err(|e| format!("{}: {}", part.disk.display(), error_chain(&e)))?;
    let mut store = MetaStore::open(view).map_err(|e| error_chain(&e))?;
    if writable {
        // The node's own META, found by label: a commit or revert must record itself even
        // over rotted copies (the reader's warning says what they held).
        store.overwrite_unrecognized();
    }
    Ok(store)
}

/// META on the system disk.
pub fn open_meta(writable: bool) -> Result<SystemMeta, String> {
    open_meta_on(&meta_partition()?, writable)
}

/// How long a writer waits for the ESP to be unmounted: systemd stops `efi.mount` once
/// systemd-bless-boot and bootctl are done with it (a second or two after they exit).
const ESP_UNMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Before slate writes the system disk's ESP (through its own FAT code, on the partition
/// itself): nothing may have it mounted, or the kernel's vfat and slate would each cache
/// what the other rewrites. On a systemd image `efi.mount` mounts it for systemd-bless-boot
/// and bootctl and goes once they are done; this waits for that, then refuses.
pub fn esp_unmounted(disk: &std::path::Path) -> Result<(), String> {
    let started = std::time::Instant::now();
    loop {
        let mounts = std::fs::read_to_string("/proc/self/mounts")
            .map_err(|e| format!("reading /proc/self/mounts: {e}"))?;
        let Some((source, target)) = vfat_mounts_on(&mounts, disk).into_iter().next() else {
            return Ok(());
        };
        if started.elapsed() > ESP_UNMOUNT_WAIT {
            return Err(format!(
                "the ESP ({source}) is mounted on {target}: slate writes the ESP only while \
                 nothing has it mounted (efi.mount goes once systemd-bless-boot and bootctl are \
                 done); unmount it and try again"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// The vfat mounts of a partition of `disk` (`/dev/vda` → `/dev/vda1`, `/dev/nvme0n1` →
/// `/dev/nvme0n1p1`) in a mount table (`/proc/self/mounts`): (source, mount point).
fn vfat_mounts_on<'a>(mounts: &'a str, disk: &std::path::Path) -> Vec<(&'a str, &'a str)> {
    let disk = disk.to_string_lossy();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?, fields.next()?, fields.next()?))
        })
        .filter(|(source, _, fstype)| {
            *fstype == "vfat"
                && source.strip_prefix(disk.as_ref()).is_some_and(|rest| {
                    let rest = rest.strip_prefix('p').unwrap_or(rest);
                    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .map(|(source, target, _)| (source, target))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::vfat_mounts_on;
    use std::path::Path;

    #[test]
    fn only_a_vfat_partition_of_the_system_disk_counts_as_the_esp_mounted() {
        let mounts = "/dev/vda3 /system/state ext4 rw 0 0\n\
                      /dev/vdb1 /mnt vfat rw 0 0\n\
                      /dev/vda10 /other vfat rw 0 0\n\
                      /dev/vda1 /efi vfat rw,nosuid 0 0\n\
                      efivarfs /sys/firmware/efi/efivars efivarfs rw 0 0\n";
        assert_eq!(
            vfat_mounts_on(mounts, Path::new("/dev/vda")),
            [("/dev/vda10", "/other"), ("/dev/vda1", "/efi")]
        );
        assert_eq!(
            vfat_mounts_on(
                "/dev/nvme0n1p1 /boot/efi vfat rw 0 0\n/dev/nvme0n10p1 /x vfat rw 0 0\n",
                Path::new("/dev/nvme0n1")
            ),
            [("/dev/nvme0n1p1", "/boot/efi")]
        );
        assert!(vfat_mounts_on(mounts, Path::new("/dev/vdc")).is_empty());
        assert!(vfat_mounts_on("", Path::new("/dev/vda")).is_empty());
    }
}
