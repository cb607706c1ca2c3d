//! `/proc/self/mountinfo`, read for two things: which device and subvolume a root is mounted
//! from, and what is still mounted under a snapshot left by a killed run.

use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The path inside the file system that is mounted (a Btrfs subvolume: `/root-…`).
    pub root: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push(((b[i + 1] - b'0') << 6) | ((b[i + 2] - b'0') << 3) | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                root: unescape(l.get(3)?),
                mount_point: PathBuf::from(unescape(l.get(4)?)),
                fstype: (*r.first()?).to_owned(),
                source: unescape(r.get(1)?),
            })
        })
        .collect()
}

/// The mount that `path` (canonical) is the mount point of; the last one wins (it is on top).
pub fn mount_at<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts.iter().rev().find(|m| m.mount_point == path)
}

/// Mount points strictly under `dir`, deepest first (the order to detach them).
pub fn under(mounts: &[Mount], dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mounts
        .iter()
        .map(|m| m.mount_point.clone())
        .filter(|p| p != dir && p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// Mounts of a partition of `disk` (`/dev/vda` → `/dev/vda1`, `/dev/nvme0n1` → `/dev/nvme0n1p1`)
/// or of `disk` itself, as FAT: a kernel mount would not see slate's writes through the disk,
/// and its later writes would undo them.
pub fn fat_mounts_of<'a>(mounts: &'a [Mount], disk: &str) -> Vec<&'a Mount> {
    mounts
        .iter()
        .filter(|m| matches!(m.fstype.as_str(), "vfat" | "msdos" | "fat"))
        .filter(|m| {
            m.source.strip_prefix(disk).is_some_and(|rest| {
                rest.is_empty()
                    || rest
                        .trim_start_matches('p')
                        .bytes()
                        .all(|b| b.is_ascii_digit())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_btrfs_roots() {
        let text = "29 1 0:26 /root-20260101-000000 / rw,relatime shared:1 - btrfs /dev/vda2 rw,subvol=/root-20260101-000000\n\
                    40 29 0:26 / /run/slate/btrfs-x rw - btrfs /dev/vda2 rw,subvolid=5\n\
                    41 40 0:5 / /run/slate/btrfs-x/root-2/dev rw - devtmpfs udev rw\n\
                    42 41 0:6 / /run/slate/btrfs-x/root-2/dev/pts rw - devpts devpts rw\n\
                    43 1 0:27 / /mnt/a\\040b rw - ext4 /dev/loop0 rw\n";
        let m = parse(text);
        assert_eq!(m.len(), 5);
        let root = mount_at(&m, Path::new("/")).unwrap();
        assert_eq!(
            (
                root.root.as_str(),
                root.fstype.as_str(),
                root.source.as_str()
            ),
            ("/root-20260101-000000", "btrfs", "/dev/vda2")
        );
        assert_eq!(m[4].mount_point, PathBuf::from("/mnt/a b"));
        let esp = parse("50 1 259:1 / /efi rw - vfat /dev/nvme0n1p1 rw\n51 1 8:1 / /mnt rw - vfat /dev/sda1 rw\n");
        assert_eq!(fat_mounts_of(&esp, "/dev/nvme0n1").len(), 1);
        assert_eq!(fat_mounts_of(&esp, "/dev/sd").len(), 0);
        assert_eq!(fat_mounts_of(&esp, "/dev/sda").len(), 1);
        assert_eq!(fat_mounts_of(&m, "/dev/vda").len(), 0);
        assert_eq!(
            under(&m, Path::new("/run/slate/btrfs-x/root-2")),
            [
                PathBuf::from("/run/slate/btrfs-x/root-2/dev/pts"),
                PathBuf::from("/run/slate/btrfs-x/root-2/dev")
            ]
        );
    }
}
