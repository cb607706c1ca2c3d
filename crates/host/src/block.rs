//! Block devices: partitions found by GPT label through sysfs, filesystems by UUID, blank
//! detection.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::{HostError, Result};

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

/// The disk a partition device belongs to (`/dev/vda2` -> `/dev/vda`): in sysfs a
/// partition's directory sits in its disk's.
pub fn disk_of_partition(partition: &Path) -> Result<PathBuf> {
    let name = partition.file_name().ok_or_else(|| HostError::Device {
        what: partition.display().to_string(),
        reason: "is not a device path".into(),
    })?;
    let sys = Path::new("/sys/class/block").join(name);
    let real = fs::canonicalize(&sys).map_err(|source| HostError::Read {
        path: sys.clone(),
        source,
    })?;
    let is_partition = real.join("partition").exists();
    match real.parent().and_then(|d| d.file_name()) {
        Some(disk) if is_partition => Ok(Path::new("/dev").join(disk)),
        _ => Err(HostError::Device {
            what: partition.display().to_string(),
            reason: "is not a partition of a disk".into(),
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
    } else if at(0, b"LUKS\xba\xbe") || at(0, b"SKUL\xba\xbe") {
        // A LUKS header (or LUKS2's secondary magic): never blank, so a /var mode that finds
        // one never formats over an encrypted volume.
        Some("crypto_LUKS")
    } else {
        None
    }
}

/// A filesystem's type and UUID read from the head of a device (the first 68 KiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIdentity {
    /// `btrfs` or `ext4` (the kernel mounts ext2/3 through its ext4 driver).
    pub fstype: &'static str,
    /// Lowercase, hyphenated: `8-4-4-4-12` hex digits, as `root=UUID=` and fstab spell it.
    pub uuid: String,
}

/// Bytes of a device's head [`filesystem_identity`] needs: up to the end of the Btrfs
/// superblock's magic at 64 KiB + 0x48.
pub const IDENTITY_HEAD_LEN: usize = 0x10048;

fn hyphenated(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The type and UUID of the filesystem at the head of `head`, for the two a slate root can
/// be: Btrfs (fsid at 64 KiB + 0x20, magic `_BHRfS_M` at + 0x40) and ext2/3/4 (magic 0xEF53 at
/// 1080, UUID at 1128).
pub fn filesystem_identity(head: &[u8]) -> Option<FsIdentity> {
    let field = |offset: usize| head.get(offset..offset + 16);
    match filesystem_signature(head)? {
        "btrfs" => field(0x10020).map(|id| FsIdentity {
            fstype: "btrfs",
            uuid: hyphenated(id),
        }),
        "ext2/3/4" => field(1128).map(|id| FsIdentity {
            fstype: "ext4",
            uuid: hyphenated(id),
        }),
        _ => None,
    }
}

/// The block device whose filesystem has UUID `uuid` (any case), with its type; `None` when
/// no device the kernel knows has it yet. A partition is preferred to its disk (a whole-disk
/// filesystem and a GPT are exclusive, but a stale head can survive partitioning).
pub fn find_filesystem_by_uuid(uuid: &str) -> Result<Option<(PathBuf, FsIdentity)>> {
    let wanted = uuid.to_ascii_lowercase();
    let entries = fs::read_dir("/sys/class/block").map_err(|source| HostError::Read {
        path: "/sys/class/block".into(),
        source,
    })?;
    let mut found = None;
    for entry in entries.flatten() {
        let Ok(uevent) = fs::read_to_string(entry.path().join("uevent")) else {
            continue;
        };
        let Some(name) = uevent_value(&uevent, "DEVNAME") else {
            continue;
        };
        let device = Path::new("/dev").join(name);
        // Unreadable or short devices (an empty CD-ROM, a tiny partition) are not it.
        let Ok(head) = read_head(&device, IDENTITY_HEAD_LEN) else {
            continue;
        };
        let Some(identity) = filesystem_identity(&head).filter(|i| i.uuid == wanted) else {
            continue;
        };
        let partition = uevent_value(&uevent, "DEVTYPE") == Some("partition");
        if found.is_none() || partition {
            found = Some((device, identity));
        }
    }
    Ok(found)
}

/// Whether `device` holds no filesystem slate recognizes (the installer zeroes the head of
/// STATE and EPHEMERAL, so a blank head means "format on first boot").
pub fn is_blank(device: &Path) -> Result<bool> {
    Ok(filesystem_signature(&read_head(device, IDENTITY_HEAD_LEN)?).is_none())
}

/// Whether `device` begins with a LUKS header.
pub fn device_is_luks(device: &Path) -> Result<bool> {
    Ok(filesystem_signature(&read_head(device, IDENTITY_HEAD_LEN)?) == Some("crypto_LUKS"))
}

/// The first `len` bytes of `device`.
pub(crate) fn read_head(device: &Path, len: usize) -> Result<Vec<u8>> {
    let mut head = vec![0u8; len];
    let mut file = fs::File::open(device).map_err(|source| HostError::Open {
        path: device.to_owned(),
        source,
    })?;
    file.read_exact(&mut head)
        .map_err(|source| HostError::Read {
            path: device.to_owned(),
            source,
        })?;
    Ok(head)
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
        let mut luks = vec![0u8; 0x10048];
        luks[..6].copy_from_slice(b"LUKS\xba\xbe");
        assert_eq!(filesystem_signature(&luks), Some("crypto_LUKS"));
    }

    #[test]
    fn reads_btrfs_and_ext_uuids() {
        let mut head = vec![0u8; IDENTITY_HEAD_LEN];
        assert_eq!(filesystem_identity(&head), None);
        head[0x10040..0x10048].copy_from_slice(b"_BHRfS_M");
        head[0x10020..0x10030].copy_from_slice(&[
            0x0e, 0x1f, 0x2a, 0x3b, 0x4c, 0x5d, 0x46, 0x7f, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ]);
        assert_eq!(
            filesystem_identity(&head),
            Some(FsIdentity {
                fstype: "btrfs",
                uuid: "0e1f2a3b-4c5d-467f-8899-aabbccddeeff".into()
            })
        );
        let mut ext = vec![0u8; IDENTITY_HEAD_LEN];
        ext[1080] = 0x53;
        ext[1081] = 0xEF;
        ext[1128..1144].copy_from_slice(&[0xab; 16]);
        let id = filesystem_identity(&ext).unwrap();
        assert_eq!(id.fstype, "ext4");
        assert_eq!(id.uuid, "abababab-abab-abab-abab-abababababab");
        // A head too short for the field is not identified.
        assert_eq!(filesystem_identity(&ext[..1130]), None);
    }

    /// mkfs.btrfs and mke2fs write the UUIDs blkid reports; slate reads the same ones.
    #[test]
    fn reads_the_uuid_mkfs_wrote() {
        if !slate_testkit::require_tool("mkfs.btrfs") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("pool.img");
        fs::File::create(&img).unwrap().set_len(128 << 20).unwrap();
        let uuid = "5f1c7a9e-2b3d-4e8f-9a0b-1c2d3e4f5a6b";
        let status = std::process::Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-U", uuid])
            .arg(&img)
            .status()
            .unwrap();
        assert!(status.success());
        let mut head = vec![0u8; IDENTITY_HEAD_LEN];
        fs::File::open(&img).unwrap().read_exact(&mut head).unwrap();
        let id = filesystem_identity(&head).unwrap();
        assert_eq!((id.fstype, id.uuid.as_str()), ("btrfs", uuid));
    }
}
