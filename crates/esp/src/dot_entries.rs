//! Repair of the `.` and `..` entries `fatfs` 0.3.6 writes for a new directory.
//!
//! FAT requires every subdirectory to begin with exactly two short entries, `.` (itself) and `..`
//! (its parent, cluster 0 when the parent is the root). `fatfs` 0.3.6, the latest release on
//! crates.io, writes a long-name entry before each of them (upstream rust-fatfs issue #117, fixed
//! on its master by PR #100 but not released) and points `..` of a top-level directory at the
//! root's cluster 2. `fsck.fat` then reports the directory as damaged and firmware may too. So
//! after `fatfs` creates a directory, this module finds it by walking the directory tree from
//! the raw bytes and rewrites its first four entries to `.`, `..`, end, end. A directory head
//! that is already right is left alone, so a fixed `fatfs` makes this a no-op; any other head is
//! an error, never guessed at.
//!
//! The same raw walk trims a directory's deleted tail ([`trim_deleted_tail`]), which `fatfs` has
//! no call for.

use slate_disk::{Disk, DiskError};

const ENTRY: usize = 32;
const ATTR_LFN: u8 = 0x0F;
#[cfg(test)]
const ATTR_VOLUME_ID: u8 = 0x08;
const DELETED: u8 = 0xE5;
const ATTR_DIRECTORY: u8 = 0x10;
const DOT: &[u8; 11] = b".          ";
const DOTDOT: &[u8; 11] = b"..         ";

#[derive(Debug, thiserror::Error)]
pub enum DotError {
    #[error("reading or writing the FAT volume")]
    Disk(#[from] DiskError),
    #[error("{0}")]
    Corrupt(String),
}

/// The few FAT32 boot-sector fields needed to find clusters.
struct Volume {
    bytes_per_sector: u64,
    sectors_per_cluster: u64,
    fat_start: u64,
    data_start: u64,
    root_cluster: u32,
}

impl Volume {
    fn read(disk: &impl Disk) -> Result<Self, DotError> {
        let boot = disk.read_vec(0, 512)?;
        let u16_at = |at: usize| u64::from(u16::from_le_bytes([boot[at], boot[at + 1]]));
        let u32_at = |at: usize| u32::from_le_bytes(boot[at..at + 4].try_into().expect("4 bytes"));
        let bytes_per_sector = u16_at(11);
        let sectors_per_cluster = u64::from(boot[13]);
        let reserved = u16_at(14);
        let fats = u64::from(boot[16]);
        let sectors_per_fat = u64::from(u32_at(36));
        if bytes_per_sector == 0 || sectors_per_cluster == 0 || sectors_per_fat == 0 {
            return Err(DotError::Corrupt("not a FAT32 boot sector".into()));
        }
        Ok(Self {
            bytes_per_sector,
            sectors_per_cluster,
            fat_start: reserved * bytes_per_sector,
            data_start: (reserved + fats * sectors_per_fat) * bytes_per_sector,
            root_cluster: u32_at(44),
        })
    }

    fn cluster_len(&self) -> u64 {
        self.bytes_per_sector * self.sectors_per_cluster
    }

    fn cluster_offset(&self, cluster: u32) -> u64 {
        self.data_start + u64::from(cluster - 2) * self.cluster_len()
    }

    /// The first cluster of the directory at `path` (`/`-separated from the root), and whether
    /// its parent is the root.
    fn locate(&self, disk: &impl Disk, path: &str) -> Result<(u32, bool), DotError> {
        let mut cluster = self.root_cluster;
        let mut parent_is_root = true;
        for (i, part) in path.split('/').filter(|p| !p.is_empty()).enumerate() {
            let dir = self.read_chain(disk, cluster)?;
            cluster = find_subdir(&dir, part).ok_or_else(|| {
                DotError::Corrupt(format!("no directory {part:?} on the way to {path}"))
            })?;
            parent_is_root = i == 0;
        }
        Ok((cluster, parent_is_root))
    }

    /// The contents of the cluster chain starting at `first`.
    fn read_chain(&self, disk: &impl Disk, first: u32) -> Result<Vec<u8>, DotError> {
        Ok(self.chain(disk, first)?.1)
    }

    /// The clusters of the chain starting at `first`, and their contents.
    fn chain(&self, disk: &impl Disk, first: u32) -> Result<(Vec<u32>, Vec<u8>), DotError> {
        let mut clusters = Vec::new();
        let mut bytes = Vec::new();
        let mut cluster = first;
        // A chain longer than the volume is a loop.
        for _ in 0..disk.len() / self.cluster_len() {
            if !(2..0x0FFF_FFF7).contains(&cluster) {
                return Err(DotError::Corrupt(format!(
                    "cluster {cluster:#x} in a directory chain"
                )));
            }
            let mut buf = vec![0; self.cluster_len() as usize];
            disk.read_at(self.cluster_offset(cluster), &mut buf)?;
            bytes.extend_from_slice(&buf);
            clusters.push(cluster);
            let mut next = [0u8; 4];
            disk.read_at(self.fat_start + u64::from(cluster) * 4, &mut next)?;
            cluster = u32::from_le_bytes(next) & 0x0FFF_FFFF;
            if cluster >= 0x0FFF_FFF8 {
                return Ok((clusters, bytes));
            }
        }
        Err(DotError::Corrupt(
            "a directory's cluster chain does not end".into(),
        ))
    }
}

/// First cluster of the subdirectory `name` (case-insensitive, long or short name) of the
/// directory whose contents are `dir`.
fn find_subdir(dir: &[u8], name: &str) -> Option<u32> {
    let mut long: Vec<(u8, Vec<u16>)> = Vec::new();
    for entry in dir.chunks(ENTRY) {
        match entry[0] {
            0x00 => return None,
            0xE5 => {
                long.clear();
                continue;
            }
            _ => {}
        }
        if entry[11] == ATTR_LFN {
            let units = [1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30]
                .iter()
                .map(|&at| u16::from_le_bytes([entry[at], entry[at + 1]]))
                .collect();
            long.push((entry[0] & 0x1F, units));
            continue;
        }
        let entry_name = if long.is_empty() {
            short_name(entry)
        } else {
            long.sort_by_key(|(order, _)| *order);
            let units: Vec<u16> = long
                .drain(..)
                .flat_map(|(_, units)| units)
                .take_while(|&u| u != 0)
                .collect();
            String::from_utf16_lossy(&units)
        };
        if entry[11] & ATTR_DIRECTORY != 0 && entry_name.eq_ignore_ascii_case(name) {
            return Some(first_cluster(entry));
        }
    }
    None
}

fn short_name(entry: &[u8]) -> String {
    let base = String::from_utf8_lossy(&entry[..8]).trim_end().to_string();
    let ext = String::from_utf8_lossy(&entry[8..11])
        .trim_end()
        .to_string();
    if ext.is_empty() {
        base
    } else {
        format!("{base}.{ext}")
    }
}

fn first_cluster(entry: &[u8]) -> u32 {
    let high = u32::from(u16::from_le_bytes([entry[20], entry[21]]));
    let low = u32::from(u16::from_le_bytes([entry[26], entry[27]]));
    (high << 16) | low
}

fn set_first_cluster(entry: &mut [u8], cluster: u32) {
    entry[20..22].copy_from_slice(&((cluster >> 16) as u16).to_le_bytes());
    entry[26..28].copy_from_slice(&(cluster as u16).to_le_bytes());
}

/// Make the directory at `path` (`/`-separated from the root) begin with `.` and `..` as FAT
/// requires. Returns whether anything was rewritten.
pub fn fix<D: Disk>(volume_disk: &mut D, path: &str) -> Result<bool, DotError> {
    let volume = Volume::read(volume_disk)?;
    let (cluster, parent_is_root) = volume.locate(volume_disk, path)?;
    if cluster == volume.root_cluster {
        return Ok(false); // the root has no dot entries
    }
    let at = volume.cluster_offset(cluster);
    let head = volume_disk.read_vec(at, 5 * ENTRY)?;
    let slot = |i: usize| &head[i * ENTRY..(i + 1) * ENTRY];
    let mut fixed = vec![0u8; 4 * ENTRY];
    if slot(0)[..11] == *DOT && slot(1)[..11] == *DOTDOT {
        fixed.copy_from_slice(&head[..4 * ENTRY]);
    } else if slot(0)[11] == ATTR_LFN
        && slot(1)[..11] == *DOT
        && slot(2)[11] == ATTR_LFN
        && slot(3)[..11] == *DOTDOT
    {
        fixed[..ENTRY].copy_from_slice(slot(1));
        fixed[ENTRY..2 * ENTRY].copy_from_slice(slot(3));
        // Slots 2 and 3 end the directory if nothing follows; otherwise they are free slots.
        if slot(4)[0] != 0 {
            fixed[2 * ENTRY] = 0xE5;
            fixed[3 * ENTRY] = 0xE5;
        }
    } else {
        return Err(DotError::Corrupt(format!(
            "directory {path} begins with neither `.`/`..` nor the entries fatfs writes"
        )));
    }
    if parent_is_root {
        set_first_cluster(&mut fixed[ENTRY..2 * ENTRY], 0);
    }
    if fixed == head[..4 * ENTRY] {
        return Ok(false);
    }
    volume_disk.write_at(at, &fixed)?;
    Ok(true)
}

/// Turn the deleted entries after the last entry in use of the directory at `path` into
/// end-of-directory entries (all 32 bytes zero). Returns how many.
///
/// UEFI's FAT driver (OVMF's, measured by `xtask soak`) puts a renamed file's new entry at the
/// directory's end rather than into deleted slots: systemd-boot's boot-counting rename at every
/// boot of a new version left three deleted entries (96 bytes) behind, and `EFI/Linux` grew by a
/// cluster every few upgrades. With the tail trimmed the end is right after the live entries
/// again, so the directory keeps its size.
///
/// The whole entry is zeroed, not only its first byte: EDK2's driver reads past an entry whose
/// attributes have the volume-label bit (as every long-name entry's 0x0F does) even when its
/// first byte is 0x00, and stops only at a zero-named entry without it. A trimmed long-name entry
/// that kept its attributes made the firmware's end lie two entries after `fatfs`'s, and the
/// firmware's next entry was invisible to slate (`firmware_end` is that rule, for the tests).
/// Only free entries change, in whole sectors through the caller's [`Disk`]: a cut anywhere
/// leaves the same files. A directory with anything after its end marker is left alone (0).
pub fn trim_deleted_tail<D: Disk>(volume_disk: &mut D, path: &str) -> Result<usize, DotError> {
    let volume = Volume::read(volume_disk)?;
    let (first, _) = volume.locate(volume_disk, path)?;
    let (clusters, dir) = volume.chain(volume_disk, first)?;
    let entries: Vec<&[u8]> = dir.chunks(ENTRY).collect();
    let end = entries
        .iter()
        .position(|e| e[0] == 0x00)
        .unwrap_or(entries.len());
    if entries[end..].iter().any(|e| e.iter().any(|&b| b != 0)) {
        // Some other writer's end is not ours: moving ours could hide its entries.
        return Ok(0);
    }
    let last_used = entries[..end].iter().rposition(|e| e[0] != DELETED);
    let from = last_used.map_or(0, |i| i + 1);
    let per_cluster = (volume.cluster_len() as usize) / ENTRY;
    let mut index = from;
    while index < end {
        // The deleted entries in one cluster are contiguous on disk: one write each.
        let in_cluster = (per_cluster - index % per_cluster).min(end - index);
        let cluster = clusters[index / per_cluster];
        let at = volume.cluster_offset(cluster) + ((index % per_cluster) * ENTRY) as u64;
        volume_disk.write_at(at, &vec![0; in_cluster * ENTRY])?;
        index += in_cluster;
    }
    Ok(end - from)
}

/// The index of the entry where EDK2's FAT driver (`FatLoadNextDirEnt`) sees a directory end:
/// it skips deleted entries and every entry whose attributes have the volume-label bit (0x08,
/// set in long-name entries), and ends at the first other entry whose name begins with 0x00.
/// New entries go there.
#[cfg(test)]
fn firmware_end(directory: &[u8]) -> usize {
    directory
        .chunks(ENTRY)
        .position(|e| e[0] == 0x00 && e[11] & ATTR_VOLUME_ID == 0)
        .unwrap_or(directory.len() / ENTRY)
}

#[cfg(test)]
mod tests {
    use slate_disk::MemDisk;

    use super::*;
    use crate::fat::{self, EspGeometry};

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn fatfs_directories_get_proper_dot_entries_and_fixing_twice_is_a_no_op() {
        let mut disk = MemDisk::zeroed(40 * MIB as usize);
        fat::format(&mut disk, &EspGeometry::new(40 * MIB, 512), 1, "EFI").unwrap();
        for path in ["EFI", "EFI/Linux"] {
            let fs = fat::mount(&mut disk, 0).unwrap();
            fs.root_dir().create_dir(path).unwrap();
            fs.unmount().unwrap();
            assert!(fix(&mut disk, path).unwrap(), "fatfs 0.3.6 needs the fix");
            assert!(!fix(&mut disk, path).unwrap());
        }
        let volume = Volume::read(&disk).unwrap();
        let root = volume.read_chain(&disk, volume.root_cluster).unwrap();
        let efi = find_subdir(&root, "efi").unwrap();
        let efi_dir = volume.read_chain(&disk, efi).unwrap();
        assert_eq!(&efi_dir[..11], DOT);
        assert_eq!(first_cluster(&efi_dir[..32]), efi);
        assert_eq!(&efi_dir[32..43], DOTDOT);
        assert_eq!(first_cluster(&efi_dir[32..64]), 0, "the parent is the root");
        let linux = find_subdir(&efi_dir, "Linux").unwrap();
        let linux_dir = volume.read_chain(&disk, linux).unwrap();
        assert_eq!(first_cluster(&linux_dir[32..64]), efi);
        assert!(matches!(
            fix(&mut disk, "EFI/nope"),
            Err(DotError::Corrupt(_))
        ));

        // The fixed directories still work for fatfs.
        let fs = fat::mount(&mut disk, 0).unwrap();
        fat::write_file_atomically(&fs, "EFI/Linux/a.efi", b"x").unwrap();
        let names: Vec<String> = fs
            .root_dir()
            .open_dir("EFI/Linux")
            .unwrap()
            .iter()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [".", "..", "a.efi"]);
    }

    /// Files created and removed leave deleted entries at the directory's end (as a firmware's
    /// renames do); the trim makes them the end again, touching nothing that is in use, and
    /// fatfs then writes the next file right after the live ones.
    #[test]
    fn deleted_entries_at_a_directory_end_are_trimmed() {
        let mut disk = MemDisk::zeroed(40 * MIB as usize);
        fat::format(&mut disk, &EspGeometry::new(40 * MIB, 512), 1, "EFI").unwrap();
        fat::create_dirs(&mut disk, 0, &["EFI/Linux"]).unwrap();
        let names = |disk: &mut MemDisk| -> Vec<String> {
            let fs = fat::mount(&mut *disk, 0).unwrap();
            let names = fs
                .root_dir()
                .open_dir("EFI/Linux")
                .unwrap()
                .iter()
                .map(|e| e.unwrap().file_name())
                .collect();
            fs.unmount().unwrap();
            names
        };
        {
            let fs = fat::mount(&mut disk, 0).unwrap();
            let dir = fs.root_dir().open_dir("EFI/Linux").unwrap();
            dir.create_file("slate-1.0.0.efi").unwrap();
            for i in 0..30 {
                dir.create_file(&format!("slate-2.0.{i:02}+2-1.efi"))
                    .unwrap();
            }
            for i in 0..30 {
                dir.remove(&format!("slate-2.0.{i:02}+2-1.efi")).unwrap();
            }
            drop(dir);
            fs.unmount().unwrap();
        }
        let volume = Volume::read(&disk).unwrap();
        let (first, _) = volume.locate(&disk, "EFI/Linux").unwrap();
        let read_dir = |disk: &MemDisk| volume.read_chain(disk, first).unwrap();
        let fatfs_end = |dir: &[u8]| dir.chunks(ENTRY).position(|e| e[0] == 0).unwrap();
        let untrimmed = read_dir(&disk);
        assert_eq!(firmware_end(&untrimmed), fatfs_end(&untrimmed));
        assert!(
            fatfs_end(&untrimmed) > 90,
            "the deleted entries are before the end"
        );
        let before = disk.clone();
        let trimmed = trim_deleted_tail(&mut disk, "EFI/Linux").unwrap();
        assert_eq!(trimmed, 90, "three entries each for 30 names");
        assert_eq!(names(&mut disk), [".", "..", "slate-1.0.0.efi"]);
        // The firmware and fatfs see the same end, right after the live entries (`.`, `..`,
        // and slate-1.0.0.efi's long-name and short entries). Zeroing first bytes only would
        // leave the firmware's end two entries later.
        let dir = read_dir(&disk);
        assert_eq!(fatfs_end(&dir), 5);
        assert_eq!(firmware_end(&dir), 5);
        // Only deleted entries changed, to zero.
        let (old, new) = (before.to_bytes(), disk.to_bytes());
        let changed: Vec<usize> = (0..old.len()).filter(|&i| old[i] != new[i]).collect();
        assert!(changed
            .iter()
            .all(|&i| new[i] == 0x00 && old[i - i % ENTRY] == DELETED));
        assert!(
            changed.iter().any(|&i| old[i] == 0x0F),
            "long-name attributes cleared"
        );
        assert_eq!(trim_deleted_tail(&mut disk, "EFI/Linux").unwrap(), 0);
        // The next file goes right after the live entries.
        {
            let fs = fat::mount(&mut disk, 0).unwrap();
            fs.root_dir()
                .create_file("EFI/Linux/slate-3.0.0+3.efi")
                .unwrap();
            fs.unmount().unwrap();
        }
        let dir = read_dir(&disk);
        assert!(
            fatfs_end(&dir) <= 5 + 3,
            "{} entries before the end",
            fatfs_end(&dir)
        );
        assert_eq!(firmware_end(&dir), fatfs_end(&dir));
    }
}
