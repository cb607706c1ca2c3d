//! Block devices: partitions found by GPT label through sysfs, blank detection, formatting.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{run_command, HostError, Result};

/// A partition the kernel knows, by GPT label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPartition {
    /// `/dev/vda3`
    pub device: PathBuf,
    /// `/dev/vda`
    pub disk: PathBuf,
    pub label: String,
}

/// `KEY=value` lines of a sysfs `uevent` file.
pub fn uevent_value<'a>(uevent: &'a str, key: &str) -> Option<&'a str> {
    uevent
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// The partition labelled `label` (the kernel exports GPT names as `PARTNAME`), on `disk` if
/// given. Several disks with the label and no disk given → an error, never a guess.
pub fn find_partition_by_label(label: &str, disk: Option<&Path>) -> Result<BlockPartition> {
    let mut found = Vec::new();
    let mut seen = Vec::new();
    let entries = fs::read_dir("/sys/class/block").map_err(|source| HostError::Read {
        path: "/sys/class/block".into(),
        source,
    })?;
    for entry in entries.flatten() {
        let Ok(uevent) = fs::read_to_string(entry.path().join("uevent")) else {
            continue;
        };
        seen.push(format!(
            "{}={}",
            entry.file_name().to_string_lossy(),
            uevent_value(&uevent, "PARTNAME").unwrap_or("-")
        ));
        if uevent_value(&uevent, "DEVTYPE") != Some("partition")
            || uevent_value(&uevent, "PARTNAME") != Some(label)
        {
            continue;
        }
        let Some(name) = uevent_value(&uevent, "DEVNAME") else {
            continue;
        };
        // The parent directory of a partition in sysfs is its disk.
        let parent = fs::canonicalize(entry.path())
            .ok()
            .and_then(|p| p.parent().and_then(|d| d.file_name()).map(|n| n.to_owned()));
        let Some(parent) = parent else { continue };
        let partition = BlockPartition {
            device: Path::new("/dev").join(name),
            disk: Path::new("/dev").join(parent),
            label: label.to_string(),
        };
        if disk.is_none_or(|d| d == partition.disk) {
            found.push(partition);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(HostError::Device {
            what: format!("partition {label}"),
            reason: format!(
                "no block device carries this GPT label (block devices: {})",
                seen.join(" ")
            ),
        }),
        _ => Err(HostError::Device {
            what: format!("partition {label}"),
            reason: format!(
                "several disks carry it: {}",
                found
                    .iter()
                    .map(|p| p.device.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// The filesystem signature at the head of `bytes` (the first 68 KiB of a device), if any.
pub fn filesystem_signature(head: &[u8]) -> Option<&'static str> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    if at(1080, &[0x53, 0xEF]) {
        Some("ext2/3/4")
    } else if at(0, b"XFSB") {
        Some("xfs")
    } else if at(0x10040, b"_BHRfS_M") {
        Some("btrfs")
    } else if at(0x52, b"FAT32") || at(0x36, b"FAT") {
        Some("vfat")
    } else {
        None
    }
}

/// Whether `device` holds no filesystem slate recognizes (the installer zeroes the head of
/// STATE and EPHEMERAL, so a blank head means "format on first boot").
pub fn is_blank(device: &Path) -> Result<bool> {
    let mut head = vec![0u8; 0x10048];
    let mut file = fs::File::open(device).map_err(|source| HostError::Open {
        path: device.to_owned(),
        source,
    })?;
    file.read_exact(&mut head)
        .map_err(|source| HostError::Read {
            path: device.to_owned(),
            source,
        })?;
    Ok(filesystem_signature(&head).is_none())
}

/// Make an ext2 filesystem labelled `label` (busybox's mke2fs; the kernel's ext4 driver mounts
/// it, and a node's STATE and /var need nothing ext4-only).
pub fn format_ext(device: &Path, label: &str) -> Result<()> {
    run_command(Command::new("mke2fs").args(["-F", "-L", label]).arg(device)).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uevent() {
        let ev = "MAJOR=254\nMINOR=3\nDEVNAME=vda3\nDEVTYPE=partition\nPARTN=3\nPARTNAME=STATE\n";
        assert_eq!(uevent_value(ev, "PARTNAME"), Some("STATE"));
        assert_eq!(uevent_value(ev, "DEVNAME"), Some("vda3"));
        assert_eq!(uevent_value(ev, "PARTN"), Some("3"));
        assert_eq!(uevent_value(ev, "NOPE"), None);
    }

    #[test]
    fn recognizes_filesystem_heads() {
        let mut head = vec![0u8; 0x10048];
        assert_eq!(filesystem_signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xEF;
        assert_eq!(filesystem_signature(&head), Some("ext2/3/4"));
        let mut fat = vec![0u8; 0x10048];
        fat[0x52..0x57].copy_from_slice(b"FAT32");
        assert_eq!(filesystem_signature(&fat), Some("vfat"));
    }

    #[test]
    fn formats_and_recognizes_a_real_ext_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("state.img");
        fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        assert!(is_blank(&img).unwrap());
        if !slate_testkit::require_tool("mke2fs") {
            return;
        }
        format_ext(&img, "STATE").unwrap();
        assert!(!is_blank(&img).unwrap());
    }
}
