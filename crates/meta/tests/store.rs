//! The META store over real disks: fallback between copies, refusal without writes, and the crash
//! matrix over the fault-injecting recorder.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use slate_disk::{CutMode, Disk, MemDisk, RecordingDisk};
use slate_meta::{tags, MetaError, MetaStore, Source, ADV_LEN, DATA_LEN, META_LEN};

fn formatted() -> MemDisk {
    MetaStore::format(MemDisk::zeroed(META_LEN as usize))
        .unwrap()
        .into_disk()
}

fn with_values(values: &[(u8, &[u8])]) -> MemDisk {
    let mut store = MetaStore::open(formatted()).unwrap();
    for (tag, value) in values {
        store.set(*tag, value.to_vec()).unwrap();
    }
    store.flush().unwrap();
    store.into_disk()
}

fn tag_set<D: Disk>(store: &MetaStore<D>) -> BTreeMap<u8, Vec<u8>> {
    store.adv().tags().map(|(t, v)| (t, v.to_vec())).collect()
}

#[test]
fn a_corrupted_copy_1_falls_back_to_copy_2() {
    let mut disk = with_values(&[(tags::UPGRADE, b"slate-v1.efi")]);
    disk.write_at(100, b"garbage").unwrap();
    let store = MetaStore::open(disk).unwrap();
    assert_eq!(store.source(), Source::Copy2);
    assert_eq!(store.get(tags::UPGRADE), Some(&b"slate-v1.efi"[..]));
    assert!(store.warnings()[0].contains("copy 1 is invalid"));
}

#[test]
fn both_copies_corrupted_reads_as_empty_with_a_warning() {
    let mut disk = with_values(&[(tags::UPGRADE, b"A")]);
    disk.write_at(100, b"garbage").unwrap();
    disk.write_at(ADV_LEN as u64 + 100, b"garbage").unwrap();
    let before = disk.to_bytes();
    let mut store = MetaStore::open(RecordingDisk::on(disk)).unwrap();
    assert_eq!(store.source(), Source::Unrecognized);
    assert!(store.entries().is_empty());
    assert!(store.warnings()[0].contains("both META copies are invalid"));
    // Whatever the copies held is not thrown away by the next write.
    store.set(tags::UPGRADE, b"B".to_vec()).unwrap();
    let err = store.flush().unwrap_err();
    assert!(matches!(err, MetaError::Unrecognized { .. }), "{err}");
    assert!(err.to_string().contains("non-zero bytes"), "{err}");
    let disk = store.into_disk();
    assert!(disk.log().is_empty(), "no write was issued");
    assert_eq!(disk.current().to_bytes(), before);
}

#[test]
fn a_copy_with_a_duplicated_record_beside_a_blank_one_is_not_overwritten() {
    // Copy 1 holds Upgrade twice and VersionFloor (invalid as a whole), copy 2 is blank: the
    // old reader started empty and the next set dropped VersionFloor.
    let mut copy1 = vec![0u8; ADV_LEN];
    let mut at = 4;
    for (tag, value) in [
        (6u32, &b"A"[..]),
        (6, b"A"),
        (tags::VERSION_FLOOR.into(), b"2.0.0"),
    ] {
        copy1[at..at + 4].copy_from_slice(&tag.to_be_bytes());
        copy1[at + 4..at + 8].copy_from_slice(&(value.len() as u32).to_be_bytes());
        copy1[at + 8..at + 8 + value.len()].copy_from_slice(value);
        at += 8 + value.len();
    }
    slate_meta::Adv::seal(&mut copy1);
    let mut disk = formatted();
    disk.write_at(0, &copy1).unwrap();
    disk.write_at(ADV_LEN as u64, &vec![0; ADV_LEN]).unwrap();
    let err = MetaStore::open_for_update(disk).unwrap_err();
    assert!(matches!(err, MetaError::Unrecognized { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("appears twice") && text.contains("copy 2: blank"),
        "{text}"
    );
}

#[test]
fn a_filesystem_is_not_meta_and_force_overwrites_it() {
    let mut bytes = vec![0u8; META_LEN as usize];
    // An ext4 superblock's magic at 1080, as a data partition would hold.
    bytes[1080..1082].copy_from_slice(&[0x53, 0xEF]);
    bytes[0..4].copy_from_slice(b"\xeb\x3c\x90M");
    let err = MetaStore::open_for_update(MemDisk::from_bytes(bytes.clone())).unwrap_err();
    assert!(err.to_string().contains("not a META area"), "{err}");
    let mut store = MetaStore::open(MemDisk::from_bytes(bytes)).unwrap();
    store.overwrite_unrecognized();
    store.set(tags::UPGRADE, b"A".to_vec()).unwrap();
    store.flush().unwrap();
    let store = MetaStore::open(store.into_disk()).unwrap();
    assert_eq!(store.source(), Source::Copy1);
    assert_eq!(store.get(tags::UPGRADE), Some(&b"A"[..]));
}

#[test]
fn a_blank_partition_reads_as_empty() {
    let store = MetaStore::open_for_update(MemDisk::zeroed(META_LEN as usize)).unwrap();
    assert_eq!(store.source(), Source::Blank);
    assert!(store.warnings().is_empty());
    assert!(store.get(tags::UPGRADE).is_none());
}

#[test]
fn a_value_that_does_not_fit_is_refused_and_nothing_is_written() {
    let disk = with_values(&[(tags::UPGRADE, b"A")]);
    let before = Sha256::digest(disk.to_bytes());
    let mut store = MetaStore::open(RecordingDisk::on(disk)).unwrap();
    let err = store
        .set(tags::USER_RESERVED_1, vec![0; DATA_LEN])
        .unwrap_err();
    assert!(matches!(err, MetaError::Value(_)), "{err}");
    assert!(err.to_string().contains("an ADV holds"), "{err}");
    let disk = store.into_disk();
    assert!(disk.log().is_empty(), "no write was issued");
    assert_eq!(Sha256::digest(disk.current().to_bytes()), before);
}

#[test]
fn a_too_small_area_is_refused() {
    assert!(matches!(
        MetaStore::open(MemDisk::zeroed(4096)),
        Err(MetaError::TooSmall(4096))
    ));
}

#[test]
fn a_failing_disk_reports_the_write_error() {
    let disk = RecordingDisk::new(formatted().into_bytes()).refuse_from(1);
    let mut store = MetaStore::open(disk).unwrap();
    store.set(tags::UPGRADE, b"A".to_vec()).unwrap();
    assert!(matches!(store.flush(), Err(MetaError::Write(_))));
}

/// A `set` + flush cut after every write and every flush, with unflushed writes dropped, kept,
/// torn after every sector and scattered at random: every state reads as the old or the new tag
/// set, never anything else.
#[test]
fn every_crash_state_of_a_set_reads_as_old_or_new() {
    let mut checked = 0;
    for (old_values, change) in [
        (vec![], (tags::UPGRADE, b"slate-v1.efi".to_vec())),
        (
            vec![(tags::UPGRADE, &b"slate-v1.efi"[..]), (7, &b"ref"[..])],
            (tags::UPGRADE, b"slate-v2.efi".to_vec()),
        ),
        (
            vec![(tags::UPGRADE, &b"x"[..])],
            (tags::STAGED_UPGRADE_INSTALL_OPTIONS, vec![b'{'; 100_000]),
        ),
    ] {
        let base = with_values(&old_values);
        let old = tag_set(&MetaStore::open(base.clone()).unwrap());
        let mut store = MetaStore::open(RecordingDisk::on(base)).unwrap();
        store.set(change.0, change.1.clone()).unwrap();
        let new = tag_set(&store);
        assert_ne!(old, new);
        store.flush().unwrap();
        let recorder = store.into_disk();
        assert_eq!(recorder.log().len(), 4, "copy 1, flush, copy 2, flush");

        let points = recorder.crash_points(usize::MAX, 64);
        for point in &points {
            let after = MetaStore::open(recorder.materialize(*point)).unwrap();
            let seen = tag_set(&after);
            assert!(
                seen == old || seen == new,
                "crash at {point:?} left a tag set that is neither old nor new: {seen:?}"
            );
            if point.ops_done == recorder.log().len() && point.mode == CutMode::DropUnflushed {
                assert_eq!(seen, new, "a completed flush is durable");
            }
            checked += 1;
        }
    }
    println!("META crash matrix: {checked} crash states checked, each old or new");
    assert!(checked > 3000);
}

/// The checker above can fail: a writer that issues both copies before a single flush (as Talos
/// does) leaves states where both copies are torn, which read as an empty store.
#[test]
fn the_crash_matrix_catches_a_writer_without_a_flush_between_copies() {
    let base = with_values(&[(tags::UPGRADE, b"A")]);
    let old = tag_set(&MetaStore::open(base.clone()).unwrap());
    let mut next = slate_meta::Adv::default();
    next.set(tags::UPGRADE, b"B".to_vec()).unwrap();
    let block = next.serialize();
    let mut recorder = RecordingDisk::on(base);
    recorder.write_at(0, &block).unwrap();
    recorder.write_at(ADV_LEN as u64, &block).unwrap();
    recorder.flush().unwrap();
    let bad = recorder
        .crash_points(usize::MAX, 64)
        .into_iter()
        .filter(|p| {
            let seen = tag_set(&MetaStore::open(recorder.materialize(*p)).unwrap());
            seen != old && seen.get(&tags::UPGRADE).map(Vec::as_slice) != Some(b"B")
        })
        .count();
    assert!(bad > 0, "the matrix must find the lost-both-copies states");
}
