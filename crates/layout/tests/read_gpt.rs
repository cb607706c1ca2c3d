//! slate's own GPT reader on tables built byte by byte: entry sizes other than 128, fallback to
//! the backup, partitions that overlap each other or the table, and hostile numbers.

use proptest::prelude::*;
use slate_disk::{Disk, MemDisk};
use slate_layout::{
    find_partition, partitions, read_gpt, read_gpt_with_sector_size, write_gpt, DiskLayout,
    GptSource, LayoutError, LayoutParams, PartitionInfo, Uuid, ESP_TYPE, LINUX_DATA_TYPE, MIB,
};

const SECTOR: u64 = 512;
/// The disk of most tests: 4 MiB.
const SECTORS: u64 = 8192;
const LAST_LBA: u64 = SECTORS - 1;
const DISK_GUID: Uuid = Uuid::from_u128(0x5EED_0000_0000_4000_8000_0000_0000_0001);

/// One partition entry: label, first and last LBA (inclusive).
#[derive(Debug, Clone)]
struct Part {
    label: &'static str,
    type_guid: Uuid,
    first: u64,
    last: u64,
}

fn part(label: &'static str, first: u64, last: u64) -> Part {
    let type_guid = if label == "EFI" {
        ESP_TYPE
    } else {
        LINUX_DATA_TYPE
    };
    Part {
        label,
        type_guid,
        first,
        last,
    }
}

/// EFI, META and STATE on the 4 MiB disk, as a partitioning tool would place them.
fn usual_parts() -> Vec<Part> {
    vec![
        part("EFI", 2048, 4095),
        part("META", 4096, 6143),
        part("STATE", 6144, 6999),
    ]
}

/// A GPT built by hand, both copies with correct CRCs: primary array at LBA 2, backup array
/// just before the backup header at the last LBA.
#[derive(Debug, Clone)]
struct Table {
    sectors: u64,
    entry_size: u32,
    entry_count: u32,
    parts: Vec<Part>,
}

impl Table {
    fn new(parts: Vec<Part>) -> Self {
        Self {
            sectors: SECTORS,
            entry_size: 128,
            entry_count: 128,
            parts,
        }
    }

    fn array_bytes(&self) -> usize {
        self.entry_count as usize * self.entry_size as usize
    }

    fn array_sectors(&self) -> u64 {
        (self.array_bytes() as u64).div_ceil(SECTOR)
    }

    fn last_lba(&self) -> u64 {
        self.sectors - 1
    }

    fn first_usable(&self) -> u64 {
        2 + self.array_sectors()
    }

    fn last_usable(&self) -> u64 {
        self.last_lba() - self.array_sectors() - 1
    }

    fn array(&self) -> Vec<u8> {
        let size = self.entry_size as usize;
        let mut array = vec![0u8; self.array_bytes()];
        for (i, p) in self.parts.iter().enumerate() {
            let entry = &mut array[i * size..(i + 1) * size];
            entry[0..16].copy_from_slice(&p.type_guid.to_bytes_le());
            entry[16..32].copy_from_slice(&Uuid::from_u128(i as u128 + 1).to_bytes_le());
            entry[32..40].copy_from_slice(&p.first.to_le_bytes());
            entry[40..48].copy_from_slice(&p.last.to_le_bytes());
            for (unit, slot) in p.label.encode_utf16().zip(entry[56..128].chunks_mut(2)) {
                slot.copy_from_slice(&unit.to_le_bytes());
            }
            // Bytes past the 128 the format defines: a reader must ignore them.
            entry[128..].fill(0xA5);
        }
        array
    }

    fn header(&self, my_lba: u64, alternate_lba: u64, array_lba: u64, array: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; SECTOR as usize];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&my_lba.to_le_bytes());
        h[32..40].copy_from_slice(&alternate_lba.to_le_bytes());
        h[40..48].copy_from_slice(&self.first_usable().to_le_bytes());
        h[48..56].copy_from_slice(&self.last_usable().to_le_bytes());
        h[56..72].copy_from_slice(&DISK_GUID.to_bytes_le());
        h[72..80].copy_from_slice(&array_lba.to_le_bytes());
        h[80..84].copy_from_slice(&self.entry_count.to_le_bytes());
        h[84..88].copy_from_slice(&self.entry_size.to_le_bytes());
        h[88..92].copy_from_slice(&crc32fast::hash(array).to_le_bytes());
        let crc = crc32fast::hash(&h[..92]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        h
    }

    fn disk(&self) -> MemDisk {
        let mut disk = MemDisk::zeroed((self.sectors * SECTOR) as usize);
        let array = self.array();
        let last = self.last_lba();
        let backup_array_lba = self.last_usable() + 1;
        let primary = self.header(1, last, 2, &array);
        let backup = self.header(last, 1, backup_array_lba, &array);
        disk.write_at(SECTOR, &primary).unwrap();
        disk.write_at(2 * SECTOR, &array).unwrap();
        disk.write_at(backup_array_lba * SECTOR, &array).unwrap();
        disk.write_at(last * SECTOR, &backup).unwrap();
        disk
    }

    /// The partitions a correct reader finds.
    fn expected(&self) -> Vec<PartitionInfo> {
        self.parts
            .iter()
            .enumerate()
            .map(|(i, p)| PartitionInfo {
                label: p.label.to_string(),
                type_guid: p.type_guid,
                number: i as u32 + 1,
                unique_guid: Uuid::from_u128(i as u128 + 1),
                start: p.first * SECTOR,
                len: (p.last - p.first + 1) * SECTOR,
            })
            .collect()
    }
}

fn flip_byte(disk: &mut MemDisk, offset: u64) {
    let byte = disk.read_vec(offset, 1).unwrap()[0];
    disk.write_at(offset, &[byte ^ 0x40]).unwrap();
}

/// Overwrite a header field, then recompute the header CRC (over the standard 92 bytes) so that
/// the reader gets past the CRC to the field itself.
fn set_field(disk: &mut MemDisk, header_lba: u64, at: u64, bytes: &[u8]) {
    let base = header_lba * SECTOR;
    disk.write_at(base + at, bytes).unwrap();
    let mut header = disk.read_vec(base, 92).unwrap();
    header[16..20].fill(0);
    let crc = crc32fast::hash(&header);
    disk.write_at(base + 16, &crc.to_le_bytes()).unwrap();
}

fn bad_gpt(err: LayoutError) -> (String, String) {
    match err {
        LayoutError::BadGpt { primary, backup } => (primary, backup),
        other => panic!("expected BadGpt, got {other:?}"),
    }
}

fn invalid_table(err: LayoutError) -> Vec<String> {
    match err {
        LayoutError::InvalidTable { problems, .. } => problems,
        other => panic!("expected InvalidTable, got {other:?}"),
    }
}

#[test]
fn a_healthy_table_is_read_from_the_primary_without_warnings() {
    let table = Table::new(usual_parts());
    let gpt = read_gpt(table.disk()).unwrap();
    assert_eq!(gpt.source, GptSource::Primary);
    assert!(gpt.warnings.is_empty(), "{:?}", gpt.warnings);
    assert_eq!(gpt.disk_guid, DISK_GUID);
    assert_eq!((gpt.first_usable_lba, gpt.last_usable_lba), (34, 8158));
    assert_eq!(gpt.partitions, table.expected());

    // What slate's own writer writes reads back as the placed layout, in both sector sizes.
    for sector_size in [512, 4096] {
        let params = LayoutParams {
            esp_size: 2 * MIB,
            state_size: MIB,
            ephemeral_min_size: MIB,
            sector_size,
            ..LayoutParams::default()
        };
        let mut disk = MemDisk::zeroed(8 * MIB as usize);
        let placed = write_gpt(&mut disk, &DiskLayout::reference("read", &params)).unwrap();
        let gpt = read_gpt_with_sector_size(&mut disk, sector_size).unwrap();
        assert!(!gpt.used_backup() && gpt.warnings.is_empty(), "{gpt:?}");
        assert_eq!(gpt.disk_guid, placed.disk_guid);
        let expected: Vec<_> = placed
            .partitions
            .iter()
            .map(|p| (p.label.clone(), p.type_guid, p.start(), p.len()))
            .collect();
        let found: Vec<_> = gpt
            .partitions
            .into_iter()
            .map(|p| (p.label, p.type_guid, p.start, p.len))
            .collect();
        assert_eq!(found, expected);
    }
}

#[test]
fn entries_larger_than_128_bytes_are_read_and_their_extra_bytes_ignored() {
    for entry_size in [256, 512, 4096] {
        let table = Table {
            entry_size,
            ..Table::new(usual_parts())
        };
        let mut disk = table.disk();
        // The `gpt` crate's reader asserted 128-byte entries and panicked here.
        assert_eq!(
            partitions(&mut disk).unwrap(),
            table.expected(),
            "{entry_size}"
        );
        let meta = find_partition(&mut disk, "META").unwrap();
        assert_eq!((meta.start, meta.len), (4096 * SECTOR, MIB));
        let gpt = read_gpt(&mut disk).unwrap();
        assert_eq!(gpt.source, GptSource::Primary);
        assert!(gpt.warnings.is_empty(), "{:?}", gpt.warnings);
    }
}

#[test]
fn a_primary_header_with_a_bad_crc_falls_back_to_the_backup() {
    let table = Table::new(usual_parts());
    let mut disk = table.disk();
    flip_byte(&mut disk, SECTOR + 60); // inside the disk GUID
    let gpt = read_gpt(&mut disk).unwrap();
    assert!(gpt.used_backup());
    match &gpt.source {
        GptSource::Backup {
            lba,
            primary_problem,
        } => {
            assert_eq!(*lba, LAST_LBA);
            assert!(
                primary_problem.contains("header CRC32 is wrong"),
                "{primary_problem}"
            );
        }
        GptSource::Primary => unreachable!(),
    }
    assert_eq!(gpt.warnings.len(), 1);
    assert!(
        gpt.warnings[0].contains("primary GPT is refused"),
        "{:?}",
        gpt.warnings
    );
    assert_eq!(gpt.disk_guid, DISK_GUID);
    assert_eq!(gpt.partitions, table.expected());
}

#[test]
fn a_primary_array_with_a_bad_crc_falls_back_to_the_backup() {
    let table = Table::new(usual_parts());
    let mut disk = table.disk();
    // META's first LBA in the primary array: a reader without the array CRC would move META.
    flip_byte(&mut disk, 2 * SECTOR + 128 + 33);
    assert_eq!(partitions(&mut disk).unwrap(), table.expected());
    let gpt = read_gpt(&mut disk).unwrap();
    let GptSource::Backup {
        primary_problem, ..
    } = &gpt.source
    else {
        panic!("the backup is used: {gpt:?}")
    };
    assert!(
        primary_problem.contains("partition array CRC32 is wrong"),
        "{primary_problem}"
    );
}

#[test]
fn on_a_grown_disk_the_backup_is_found_where_the_primary_says() {
    // An image written to a larger disk: the backup is at the image's end, not the disk's.
    let table = Table::new(usual_parts());
    let mut bytes = table.disk().into_bytes();
    bytes.resize(bytes.len() + 4096 * SECTOR as usize, 0);
    let mut disk = MemDisk::from_bytes(bytes);
    assert!(read_gpt(&mut disk).unwrap().warnings.is_empty());

    flip_byte(&mut disk, 2 * SECTOR + 33); // primary array; header intact
    let gpt = read_gpt(&mut disk).unwrap();
    assert!(
        matches!(gpt.source, GptSource::Backup { lba, .. } if lba == LAST_LBA),
        "{gpt:?}"
    );
    assert_eq!(gpt.partitions, table.expected());

    // With the primary header itself damaged its alternate LBA cannot be trusted, and the last
    // LBA of the grown disk holds nothing.
    flip_byte(&mut disk, SECTOR + 60);
    let (primary, backup) = bad_gpt(read_gpt(&mut disk).unwrap_err());
    assert!(primary.contains("header CRC32"), "{primary}");
    assert!(backup.contains("no \"EFI PART\" signature"), "{backup}");
}

#[test]
fn when_both_copies_are_broken_the_error_names_both_problems() {
    let table = Table::new(usual_parts());
    let mut disk = table.disk();
    flip_byte(&mut disk, SECTOR + 60);
    flip_byte(&mut disk, (table.last_usable() + 1) * SECTOR + 33);
    let err = read_gpt(&mut disk).unwrap_err();
    let text = err.to_string();
    let (primary, backup) = bad_gpt(err);
    assert!(
        primary.contains("LBA 1: header CRC32 is wrong"),
        "{primary}"
    );
    assert!(
        backup.contains("partition array CRC32 is wrong"),
        "{backup}"
    );
    assert!(text.contains(&primary) && text.contains(&backup), "{text}");

    // A damaged backup alone is a warning: the primary is still used.
    let mut disk = table.disk();
    flip_byte(&mut disk, LAST_LBA * SECTOR + 60);
    let gpt = read_gpt(&mut disk).unwrap();
    assert_eq!(gpt.source, GptSource::Primary);
    assert!(
        gpt.warnings[0].contains("backup GPT is unusable"),
        "{:?}",
        gpt.warnings
    );

    // No signature anywhere: no GPT at all.
    let mut disk = table.disk();
    disk.write_at(SECTOR, &[0; 8]).unwrap();
    disk.write_at(LAST_LBA * SECTOR, &[0; 8]).unwrap();
    assert!(matches!(read_gpt(&mut disk), Err(LayoutError::NoGpt(_))));
}

#[test]
fn overlapping_partitions_are_refused_naming_both() {
    let table = Table::new(vec![
        part("EFI", 2048, 4095),
        part("META", 3072, 5119), // over the second half of EFI
        part("STATE", 6144, 8158),
    ]);
    let mut disk = table.disk();
    let err = find_partition(&mut disk, "META").unwrap_err();
    let text = err.to_string();
    let problems = invalid_table(err);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("\"EFI\" (entry 1, LBA 2048-4095)"),
        "{text}"
    );
    assert!(
        problems[0].contains("\"META\" (entry 2, LBA 3072-5119)"),
        "{text}"
    );
    assert!(problems[0].contains("overlap"), "{text}");
    assert!(text.contains("primary GPT"), "{text}");

    // A partition inside another, listed first, and one sharing a single sector.
    let table = Table::new(vec![
        part("STATE", 6144, 8158),
        part("EFI", 2048, 6144),
        part("META", 3000, 3001),
    ]);
    let problems = invalid_table(read_gpt(table.disk()).unwrap_err());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems
        .iter()
        .any(|p| p.contains("EFI") && p.contains("META")));
    assert!(problems
        .iter()
        .any(|p| p.contains("EFI") && p.contains("STATE")));
}

#[test]
fn partitions_over_the_table_or_past_the_disk_are_refused_together() {
    let table = Table::new(vec![
        part("MBR", 0, 2047),
        part("HEADER", 1, 1),
        part("BACKUP", 8100, 8159),
        part("BEYOND", 8160, 9000),
        part("HUGE", u64::MAX - 1, u64::MAX),
        part("REVERSED", 5000, 4000),
        part("FINE", 4096, 4096),
    ]);
    let problems = invalid_table(read_gpt(table.disk()).unwrap_err());
    let find = |label: &str| {
        problems
            .iter()
            .find(|p| p.contains(&format!("{label:?}")))
            .unwrap_or_else(|| panic!("{label}: {problems:?}"))
    };
    assert!(find("MBR").contains("before the first usable LBA 34"));
    assert!(find("HEADER").contains("before the first usable LBA 34"));
    assert!(find("BACKUP").contains("after the last usable LBA 8158"));
    assert!(find("BEYOND").contains("past the end of the disk (last LBA 8191)"));
    assert!(find("HUGE").contains("past the end of the disk"));
    assert!(find("REVERSED").contains("ends before it starts"));
    assert!(problems.iter().all(|p| !p.contains("FINE")), "{problems:?}");
    // MBR overlaps HEADER: the other problem the table has.
    assert_eq!(problems.len(), 7, "{problems:?}");
}

#[test]
fn hostile_header_numbers_are_refused_cleanly_in_both_copies() {
    let cases: &[(u64, &[u8], &str)] = &[
        (
            80,
            &u32::MAX.to_le_bytes(),
            "exceed the 1048576-byte partition array",
        ),
        (
            80,
            &8193u32.to_le_bytes(),
            "exceed the 1048576-byte partition array",
        ),
        (84, &0u32.to_le_bytes(), "partition entry size 0 is not"),
        (84, &100u32.to_le_bytes(), "partition entry size 100 is not"),
        (
            84,
            &(1u32 << 31).to_le_bytes(),
            "partition entry size 2147483648 is not",
        ),
        (
            84,
            &8192u32.to_le_bytes(),
            "partition entry size 8192 is not",
        ),
        (72, &u64::MAX.to_le_bytes(), "runs past the end of the disk"),
        (72, &0u64.to_le_bytes(), "overlaps the protective MBR"),
        (
            12,
            &0u32.to_le_bytes(),
            "header size 0 is not between 92 and 512",
        ),
        (
            12,
            &600u32.to_le_bytes(),
            "header size 600 is not between 92 and 512",
        ),
        (
            24,
            &u64::MAX.to_le_bytes(),
            "it says it lies at LBA 18446744073709551615",
        ),
        (40, &u64::MAX.to_le_bytes(), "is after the last usable LBA"),
        (
            48,
            &u64::MAX.to_le_bytes(),
            "last usable LBA 18446744073709551615 is past the end",
        ),
        (40, &1u64.to_le_bytes(), "header (LBA 1)"),
        (8, &0x0002_0000u32.to_le_bytes(), "unsupported revision"),
    ];
    for (at, bytes, expected) in cases {
        let mut disk = Table::new(usual_parts()).disk();
        set_field(&mut disk, 1, *at, bytes);
        set_field(&mut disk, LAST_LBA, *at, bytes);
        // The `gpt` crate's reader panicked on the entry sizes other than 128.
        assert!(partitions(&mut disk).is_err(), "field {at}");
        let (primary, backup) = bad_gpt(read_gpt(&mut disk).unwrap_err());
        assert!(primary.contains(expected), "field {at}: {primary}");
        assert!(backup.contains(expected), "field {at}: {backup}");
    }

    // An array that fits the bound and the disk but not the space before the usable area.
    let mut disk = Table::new(usual_parts()).disk();
    set_field(&mut disk, 1, 80, &1024u32.to_le_bytes());
    let gpt = read_gpt(&mut disk).unwrap();
    let GptSource::Backup {
        primary_problem, ..
    } = gpt.source
    else {
        panic!("the backup is used")
    };
    assert!(
        primary_problem.contains("overlaps the partition array"),
        "{primary_problem}"
    );

    // Zero entries is a valid, empty table.
    let mut disk = Table::new(usual_parts()).disk();
    for lba in [1, LAST_LBA] {
        set_field(&mut disk, lba, 88, &crc32fast::hash(&[]).to_le_bytes());
        set_field(&mut disk, lba, 80, &0u32.to_le_bytes());
    }
    let gpt = read_gpt(&mut disk).unwrap();
    assert!(
        gpt.partitions.is_empty() && gpt.warnings.is_empty(),
        "{gpt:?}"
    );

    // Disks too small for any GPT, and a sector size slate does not support.
    for len in [0, 1, 1024] {
        let err = read_gpt(MemDisk::zeroed(len)).unwrap_err();
        assert!(matches!(err, LayoutError::NoGpt(_)), "{len}: {err}");
    }
    assert!(read_gpt_with_sector_size(MemDisk::zeroed(4096), 1024).is_err());
}

/// A disk of 256 sectors with a valid table, for the property tests.
fn small_table() -> Table {
    Table {
        sectors: 256,
        ..Table::new(vec![part("A", 34, 99), part("B", 100, 222)])
    }
}

/// What must hold of any table the reader accepts.
fn check_accepted(disk_len: u64, found: &[PartitionInfo]) {
    for (i, p) in found.iter().enumerate() {
        let end = p.start.checked_add(p.len).expect("end fits in u64");
        assert!(p.len > 0 && end <= disk_len, "{p:?}");
        for q in &found[..i] {
            assert!(end <= q.start || q.start + q.len <= p.start, "{p:?} {q:?}");
        }
    }
}

proptest! {
    #[test]
    fn random_bytes_over_both_tables_never_panic(
        head in proptest::collection::vec(any::<u8>(), 34 * 512),
        tail in proptest::collection::vec(any::<u8>(), 33 * 512),
        signatures in any::<bool>(),
    ) {
        let mut disk = MemDisk::zeroed(256 * 512);
        disk.write_at(0, &head).unwrap();
        disk.write_at(223 * 512, &tail).unwrap();
        if signatures {
            disk.write_at(512, b"EFI PART").unwrap();
            disk.write_at(255 * 512, b"EFI PART").unwrap();
        }
        if let Ok(gpt) = read_gpt(&mut disk) {
            check_accepted(disk.len(), &gpt.partitions);
        }
    }

    #[test]
    fn mutated_valid_tables_never_panic_and_never_yield_unsafe_partitions(
        edits in proptest::collection::vec((0usize..34 * 512 + 33 * 512, any::<u8>()), 1..16),
        wide in proptest::collection::vec((0usize..92, any::<u64>()), 0..4),
        reseal in any::<bool>(),
    ) {
        let table = small_table();
        let mut disk = table.disk();
        for (position, byte) in edits {
            // The first 34 sectors, then the last 33.
            let offset = if position < 34 * 512 { position } else { position + 189 * 512 };
            disk.write_at(offset as u64, &[byte]).unwrap();
        }
        for (at, value) in wide {
            let at = at.min(84) as u64;
            disk.write_at(512 + at, &value.to_le_bytes()).unwrap();
        }
        if reseal {
            // Reach the checks behind the CRCs: recompute both over what is there now.
            let array = disk.read_vec(2 * 512, 128 * 128).unwrap();
            set_field(&mut disk, 1, 88, &crc32fast::hash(&array).to_le_bytes());
        }
        if let Ok(gpt) = read_gpt(&mut disk) {
            check_accepted(disk.len(), &gpt.partitions);
        }
    }
}
