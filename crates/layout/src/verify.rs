//! Reading a partition table back and checking it is exactly the one a layout describes.
//!
//! Deliberately independent of the `gpt` crate that writes the table: the bytes are decoded here
//! from the format description (docs/formats.md §5), so a writer bug is not hidden by the same
//! reader. Every field is checked, in both copies, including both CRCs, which the `gpt` crate's
//! reader does not check for the partition array.

use slate_disk::Disk;
use uuid::Uuid;

use crate::spec::{DiskLayout, PlacedLayout, PlacedPartition};
use crate::LayoutError;

const ENTRIES: usize = 128;
const ENTRY_SIZE: usize = 128;
const HEADER_SIZE: usize = 92;

/// Check that `disk` holds the protective MBR and both GPT copies that [`crate::write_gpt`]
/// writes for `layout`, and return the placement. Every difference found is reported in one
/// [`LayoutError::Mismatch`].
pub fn verify_gpt<D: Disk>(disk: D, layout: &DiskLayout) -> Result<PlacedLayout, LayoutError> {
    let placed = layout.place(disk.len())?;
    let lb = placed.sector_size;
    let read = |what: &'static str, offset: u64, len: usize| {
        disk.read_vec(offset, len)
            .map_err(|source| LayoutError::Disk { what, source })
    };
    let mut problems = Vec::new();

    let mbr = read("reading the protective MBR", 0, 512)?;
    check_pmbr(&mbr, &placed, &mut problems);

    let array_len = ENTRIES * ENTRY_SIZE;
    let expected_array = encode_array(&placed.partitions);
    let last_lba = placed.total_lba - 1;
    let copies = [
        ("primary", 1, last_lba, 2),
        ("backup", last_lba, 1, placed.last_usable_lba + 1),
    ];
    for (which, my_lba, alt_lba, array_lba) in copies {
        let header = read("reading a GPT header", my_lba * lb, lb as usize)?;
        let array = read("reading a GPT partition array", array_lba * lb, array_len)?;
        let expect = ExpectedHeader {
            my_lba,
            alt_lba,
            array_lba,
            array_crc: crc32fast::hash(&expected_array),
        };
        check_header(which, &header, &expect, &placed, &mut problems);
        if crc32fast::hash(&array) != le_u32(&header, 88) {
            problems.push(format!(
                "{which} partition array: CRC32 does not match the header"
            ));
        }
        for (i, (got, want)) in array
            .chunks(ENTRY_SIZE)
            .zip(expected_array.chunks(ENTRY_SIZE))
            .enumerate()
        {
            if got != want {
                problems.push(format!(
                    "{which} partition entry {}: found {}, expected {}",
                    i + 1,
                    describe_entry(got),
                    describe_entry(want)
                ));
            }
        }
    }

    if problems.is_empty() {
        Ok(placed)
    } else {
        Err(LayoutError::Mismatch(problems.join("; ")))
    }
}

fn check_pmbr(mbr: &[u8], placed: &PlacedLayout, problems: &mut Vec<String>) {
    let size = (placed.total_lba - 1).min(u64::from(u32::MAX)) as u32;
    if mbr[510..512] != [0x55, 0xAA] {
        problems.push("protective MBR: no 55 AA signature".into());
    }
    let entry = &mbr[446..462];
    if entry[4] != 0xEE || le_u32(entry, 8) != 1 || le_u32(entry, 12) != size {
        problems.push(format!(
            "protective MBR: entry 1 is type {:#04x} from LBA {} for {} sectors, expected 0xee from 1 for {size}",
            entry[4],
            le_u32(entry, 8),
            le_u32(entry, 12)
        ));
    }
    if mbr[462..510].iter().any(|&b| b != 0) {
        problems.push("protective MBR: entries 2-4 are not empty".into());
    }
}

struct ExpectedHeader {
    my_lba: u64,
    alt_lba: u64,
    array_lba: u64,
    array_crc: u32,
}

fn check_header(
    which: &str,
    sector: &[u8],
    expect: &ExpectedHeader,
    placed: &PlacedLayout,
    problems: &mut Vec<String>,
) {
    if &sector[..8] != b"EFI PART" {
        problems.push(format!("{which} GPT header: no \"EFI PART\" signature"));
        return;
    }
    let mut zeroed = sector[..HEADER_SIZE].to_vec();
    zeroed[16..20].fill(0);
    if crc32fast::hash(&zeroed) != le_u32(sector, 16) {
        problems.push(format!("{which} GPT header: header CRC32 is wrong"));
    }
    let disk_guid = Uuid::from_bytes_le(sector[56..72].try_into().expect("16 bytes"));
    let fields: [(&str, u64, u64); 12] = [
        ("revision", le_u32(sector, 8).into(), 0x0001_0000),
        ("header size", le_u32(sector, 12).into(), HEADER_SIZE as u64),
        ("reserved", le_u32(sector, 20).into(), 0),
        ("my LBA", le_u64(sector, 24), expect.my_lba),
        ("alternate LBA", le_u64(sector, 32), expect.alt_lba),
        (
            "first usable LBA",
            le_u64(sector, 40),
            placed.first_usable_lba,
        ),
        (
            "last usable LBA",
            le_u64(sector, 48),
            placed.last_usable_lba,
        ),
        ("partition array LBA", le_u64(sector, 72), expect.array_lba),
        (
            "number of entries",
            le_u32(sector, 80).into(),
            ENTRIES as u64,
        ),
        ("entry size", le_u32(sector, 84).into(), ENTRY_SIZE as u64),
        (
            "partition array CRC32",
            le_u32(sector, 88).into(),
            expect.array_crc.into(),
        ),
        (
            "non-zero bytes after the header",
            sector[HEADER_SIZE..].iter().filter(|&&b| b != 0).count() as u64,
            0,
        ),
    ];
    for (name, got, want) in fields {
        if got != want {
            problems.push(format!(
                "{which} GPT header: {name} is {got:#x}, expected {want:#x}"
            ));
        }
    }
    if disk_guid != placed.disk_guid {
        problems.push(format!(
            "{which} GPT header: disk GUID is {disk_guid}, expected {}",
            placed.disk_guid
        ));
    }
}

/// The 128 × 128-byte partition array the layout calls for.
fn encode_array(partitions: &[PlacedPartition]) -> Vec<u8> {
    let mut array = vec![0u8; ENTRIES * ENTRY_SIZE];
    for (p, entry) in partitions.iter().zip(array.chunks_mut(ENTRY_SIZE)) {
        entry[0..16].copy_from_slice(&p.type_guid.to_bytes_le());
        entry[16..32].copy_from_slice(&p.guid.to_bytes_le());
        entry[32..40].copy_from_slice(&p.first_lba.to_le_bytes());
        entry[40..48].copy_from_slice(&p.last_lba.to_le_bytes());
        entry[48..56].copy_from_slice(&p.attributes.to_le_bytes());
        for (unit, slot) in p.label.encode_utf16().zip(entry[56..].chunks_mut(2)) {
            slot.copy_from_slice(&unit.to_le_bytes());
        }
    }
    array
}

fn describe_entry(entry: &[u8]) -> String {
    if entry.iter().all(|&b| b == 0) {
        return "an unused entry".into();
    }
    let guid = |at: usize| Uuid::from_bytes_le(entry[at..at + 16].try_into().expect("16 bytes"));
    let units: Vec<u16> = entry[56..128]
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    format!(
        "{:?} type {} guid {} LBA {}-{} attributes {:#x}",
        String::from_utf16_lossy(&units),
        guid(0),
        guid(16),
        le_u64(entry, 32),
        le_u64(entry, 40),
        le_u64(entry, 48)
    )
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}
