//! slate's GPT reader on arbitrary disks. Reading must never panic, and a table it accepts must
//! only hold partitions that lie inside the disk and do not overlap.
//!
//! Input: one flag byte, then the disk from LBA 1 on (LBA 0, the protective MBR, is never read),
//! zero-padded to at least 64 sectors. The fuzzer cannot forge CRC32s, so the flags let it past
//! them to the checks behind: bit 0 recomputes the primary header's array and header CRCs over
//! what its fields say, bit 1 copies the primary header to the last LBA as a backup (MyLBA and
//! AlternateLBA swapped) and reseals it. The disk is read with 512- and 4096-byte sectors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_disk::{Disk, MemDisk};
use slate_layout::{read_gpt, read_gpt_with_sector_size};

const SECTOR: usize = 512;
const MIN_DISK: usize = 64 * SECTOR;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, from_lba_1)) = data.split_first() else {
        return;
    };
    let len = (SECTOR + from_lba_1.len())
        .max(MIN_DISK)
        .next_multiple_of(SECTOR);
    let mut bytes = vec![0u8; len];
    bytes[SECTOR..SECTOR + from_lba_1.len()].copy_from_slice(from_lba_1);
    let last_lba = len / SECTOR - 1;
    if flags & 1 != 0 {
        reseal(&mut bytes, 1);
    }
    if flags & 2 != 0 {
        bytes.copy_within(SECTOR..2 * SECTOR, last_lba * SECTOR);
        let at = last_lba * SECTOR;
        bytes[at + 24..at + 32].copy_from_slice(&(last_lba as u64).to_le_bytes());
        bytes[at + 32..at + 40].copy_from_slice(&1u64.to_le_bytes());
        reseal(&mut bytes, last_lba);
    }
    let mut disk = MemDisk::from_bytes(bytes);

    if let Ok(gpt) = read_gpt(&mut disk) {
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for p in &gpt.partitions {
            let end = p
                .start
                .checked_add(p.len)
                .expect("a partition's end fits in u64");
            assert!(p.len > 0 && end <= disk.len(), "{p:?} is outside the disk");
            assert!(
                spans
                    .iter()
                    .all(|&(start, stop)| end <= start || stop <= p.start),
                "{p:?} overlaps another partition"
            );
            spans.push((p.start, end));
        }
    }
    let _ = read_gpt_with_sector_size(disk, 4096);
});

/// Make the header at `lba` carry the CRC32s of what it describes: the array (when its fields
/// name a range of at most 1 MiB inside the disk), then the header itself.
fn reseal(bytes: &mut [u8], lba: usize) {
    let at = lba * SECTOR;
    let u32_at = |bytes: &[u8], off: usize| {
        u32::from_le_bytes(bytes[at + off..at + off + 4].try_into().unwrap())
    };
    let array_lba = u64::from_le_bytes(bytes[at + 72..at + 80].try_into().unwrap());
    let array_len = u64::from(u32_at(bytes, 80)) * u64::from(u32_at(bytes, 84));
    let array = array_lba
        .checked_mul(SECTOR as u64)
        .and_then(|start| Some((start, start.checked_add(array_len)?)))
        .filter(|&(_, end)| array_len <= 1 << 20 && end <= bytes.len() as u64);
    if let Some((start, end)) = array {
        let crc = crc32fast::hash(&bytes[start as usize..end as usize]);
        bytes[at + 88..at + 92].copy_from_slice(&crc.to_le_bytes());
    }
    let header_size = u32_at(bytes, 12).clamp(92, SECTOR as u32) as usize;
    bytes[at + 16..at + 20].fill(0);
    let crc = crc32fast::hash(&bytes[at..at + header_size]);
    bytes[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
}
