//! The crash matrix of a snapshot root's ESP writes (`sdboot::snapshots`, `grub::snapshots`):
//! registration of a new snapshot's entry, its commit (bless), a rollback and a prune's removal,
//! each replayed over a fault-injecting disk, power cut at every write and flush (unflushed writes dropped, kept,
//! torn, scattered). In every state the selection model must start the old or the new root's
//! entry, and that entry's kernel and initramfs on the ESP must be the snapshot's, byte for byte.

use slate_bootloader::grub::snapshots::{self as grub, menu::MenuEntry};
use slate_bootloader::sdboot::snapshots as sdboot;
use slate_disk::{CrashPoint, Disk, MemDisk, RecordingDisk};
use slate_esp::fat;
use slate_snapshot::entry::{entry_text, EntrySpec};
use slate_snapshot::SnapshotName;

const UUID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn snap(i: u32) -> SnapshotName {
    SnapshotName::parse(&format!("root-2026010{i}-000000")).unwrap()
}

/// Distinct kernel and initramfs bytes per snapshot, a few clusters each.
fn files(i: u32) -> (Vec<u8>, Vec<u8>) {
    let k = (0..20_000u32).map(|b| (b * 7 + i) as u8).collect();
    let r = (0..9_000u32).map(|b| (b * 13 + i * 3) as u8).collect();
    (k, r)
}

fn text(i: u32) -> String {
    entry_text(&EntrySpec {
        snapshot: snap(i),
        pool_uuid: UUID.into(),
        os_name: "Test OS".into(),
        extra_options: vec!["quiet".into()],
    })
    .unwrap()
}

fn register(disk: &mut impl Disk, i: u32) {
    let (k, r) = files(i);
    sdboot::register(disk, &snap(i), &k, &r, &text(i), 3).unwrap();
}

/// A GPT disk with one 40 MiB ESP, FAT32, snapshot 1 registered, booted and blessed.
fn base() -> MemDisk {
    let mut disk = MemDisk::zeroed(slate_testkit::esp::ESP_ONLY_DISK as usize);
    slate_testkit::esp::esp_only(&mut disk, "snapshot-crash", 0x5157_0001);
    register(&mut disk, 1);
    assert_eq!(
        sdboot::simulate_boot_attempt(&mut disk).unwrap().as_deref(),
        Some("root-20260101-000000+2-1.conf")
    );
    sdboot::bless(&mut disk, &snap(1)).unwrap();
    disk
}

/// The snapshot whose entry boots, after checking its files are that snapshot's.
fn check_boots(disk: &MemDisk) -> Result<u32, String> {
    let scan = sdboot::scan(disk).map_err(|e| format!("scan: {e}"))?;
    let found = scan.selected().ok_or("nothing boots")?;
    let snapshot = found.snapshot.clone().ok_or("a non-snapshot entry boots")?;
    let i: u32 = snapshot.as_str()[12..13].parse().unwrap();
    let conf = found.conf.as_ref().ok_or("no entry text")?;
    if conf != &slate_bootspec::Type1Entry::parse(&text(i)).unwrap() {
        return Err(format!("{snapshot}: entry text differs"));
    }
    let (k, r) = files(i);
    for (path, want) in [
        (conf.linux.clone().unwrap(), k),
        (conf.initrd[0].clone(), r),
    ] {
        let got = slate_esp::session::read_file(disk, path.trim_start_matches('/'))
            .map_err(|e| e.to_string())?;
        if got.as_deref() != Some(&want[..]) {
            return Err(format!("{snapshot}: {path} missing or not its own"));
        }
    }
    Ok(i)
}

fn matrix(what: &str, rec: &RecordingDisk, must_see: &[u32]) -> usize {
    let points: Vec<CrashPoint> = rec.crash_points(8, 16);
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for &point in &points {
        match check_boots(&rec.materialize(point)) {
            Ok(i) if must_see.contains(&i) => {
                if !seen.contains(&i) {
                    seen.push(i)
                }
            }
            Ok(i) => failures.push(format!("{point:?}: snapshot {i} boots")),
            Err(e) => failures.push(format!("{point:?}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: {} of {} states fail, e.g. {:#?}",
        failures.len(),
        points.len(),
        &failures[..failures.len().min(5)]
    );
    for i in must_see {
        assert!(
            seen.contains(i),
            "{what}: snapshot {i} never boots: {seen:?}"
        );
    }
    println!(
        "{what}: {} crash states ({} ops), boots {seen:?}",
        points.len(),
        rec.log().len()
    );
    points.len()
}

#[test]
fn snapshot_esp_crash_matrix() {
    let base = base();
    let mut total = 0;

    let mut rec = RecordingDisk::on(base.clone());
    register(&mut rec, 2);
    total += matrix("register", &rec, &[1, 2]);

    let mut upgraded = base.clone();
    register(&mut upgraded, 2);
    sdboot::simulate_boot_attempt(&mut upgraded).unwrap();
    let mut rec = RecordingDisk::on(upgraded.clone());
    sdboot::bless(&mut rec, &snap(2)).unwrap();
    // Both entries are good after the bless: 2 sorts first and boots.
    total += matrix("commit", &rec, &[2]);

    let mut committed = upgraded.clone();
    sdboot::bless(&mut committed, &snap(2)).unwrap();
    let mut rec = RecordingDisk::on(committed.clone());
    let (to, from) = sdboot::rollback(&mut rec, &snap(1), &snap(2), 3).unwrap();
    assert_eq!(
        (to.as_str(), from.as_str()),
        ("root-20260101-000000+3.conf", "root-20260102-000000+0.conf")
    );
    total += matrix("rollback", &rec, &[1, 2]);

    // Pruning snapshot 1 while 2 boots: 2 boots in every state.
    let mut rec = RecordingDisk::on(committed.clone());
    sdboot::remove(&mut rec, &snap(1)).unwrap();
    total += matrix("prune", &rec, &[2]);

    // A third registration on a disk with two entries, then its three failed tries: the
    // previous entry boots again.
    let mut disk = committed;
    register(&mut disk, 3);
    for want in ["+2-1", "+1-2", "+0-3"] {
        let booted = sdboot::simulate_boot_attempt(&mut disk).unwrap().unwrap();
        assert_eq!(booted, format!("root-20260103-000000{want}.conf"));
    }
    assert_eq!(check_boots(&disk), Ok(2));
    println!("snapshot ESP crash matrix: {total} crash states checked");
}

#[test]
fn removing_the_entry_that_boots_next_is_refused() {
    let mut disk = base();
    assert!(sdboot::remove(&mut disk, &snap(1)).is_err());
}

#[test]
fn a_loader_conf_that_would_not_pick_the_new_entry_is_refused_before_writing() {
    let mut disk = base();
    {
        let scan = sdboot::scan(&disk).unwrap();
        assert!(scan.loader_conf_present);
    }
    // Overwrite loader.conf with a default naming the old entry exactly.
    let (start, len) = {
        let parts = slate_layout::partitions(&mut disk).unwrap();
        (parts[0].start, parts[0].len)
    };
    {
        let view = slate_disk::PartitionView::new(&mut disk, start, len).unwrap();
        let fs = fat::mount(view, 0).unwrap();
        fat::write_file_atomically(
            &fs,
            "loader/loader.conf",
            b"default root-20260101-000000.conf\n",
        )
        .unwrap();
        fat::unmount(fs).unwrap();
    }
    let before = disk.to_bytes();
    let (k, r) = files(2);
    let err = sdboot::register(&mut disk, &snap(2), &k, &r, &text(2), 3).unwrap_err();
    assert!(err.to_string().contains("would not start"), "{err}");
    assert!(disk.to_bytes() == before, "nothing written");
}

/// GRUB on a snapshot root (docs/formats.md §12.9): snapshot `i`'s menu entry.
fn grub_entry(i: u32) -> MenuEntry {
    MenuEntry::new(
        &EntrySpec {
            snapshot: snap(i),
            pool_uuid: UUID.into(),
            os_name: "Test OS".into(),
            extra_options: vec!["quiet".into()],
        },
        "boot/vmlinuz-6.1.0-1-amd64",
        "boot/initrd.img-6.1.0-1-amd64",
    )
    .unwrap()
}

/// A GPT disk with one ESP carrying the GRUB layout with snapshot 1 the saved default.
fn grub_base() -> MemDisk {
    let mut disk = MemDisk::zeroed(slate_testkit::esp::ESP_ONLY_DISK as usize);
    slate_testkit::esp::esp_only(&mut disk, "snapshot-grub-crash", 0x5157_0002);
    grub::lay_down(&mut disk, 1, &grub_entry(1)).unwrap();
    disk
}

/// The snapshot GRUB starts, after checking its entry and the saved default's (the fallback,
/// which must exist: a bootable default at every cut) are exactly as registered. Returns
/// (started, saved default).
fn grub_boots(disk: &MemDisk) -> Result<(u32, u32), String> {
    let scan = grub::scan(disk).map_err(|e| format!("scan: {e}"))?;
    if scan.env.is_none() {
        return Err(format!("grubenv unreadable: {:?}", scan.env_error));
    }
    let index = |e: &MenuEntry| -> Result<u32, String> {
        let i: u32 = e.snapshot.as_str()[12..13].parse().unwrap();
        if *e != grub_entry(i) {
            return Err(format!("{}: menu entry differs", e.snapshot));
        }
        Ok(i)
    };
    let started = index(scan.selected().ok_or("nothing selected")?)?;
    let saved = index(scan.saved().ok_or("no saved default to fall back to")?)?;
    Ok((started, saved))
}

fn grub_matrix(what: &str, rec: &RecordingDisk, must_see: &[u32]) -> usize {
    let points: Vec<CrashPoint> = rec.crash_points(8, 16);
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for &point in &points {
        match grub_boots(&rec.materialize(point)) {
            Ok((i, saved)) if must_see.contains(&i) && must_see.contains(&saved) => {
                if !seen.contains(&i) {
                    seen.push(i)
                }
            }
            Ok((i, saved)) => failures.push(format!("{point:?}: {i} boots, default {saved}")),
            Err(e) => failures.push(format!("{point:?}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: {} of {} states fail, e.g. {:#?}",
        failures.len(),
        points.len(),
        &failures[..failures.len().min(5)]
    );
    for i in must_see {
        assert!(
            seen.contains(i),
            "{what}: snapshot {i} never boots: {seen:?}"
        );
    }
    println!(
        "grub {what}: {} crash states ({} ops), boots {seen:?}",
        points.len(),
        rec.log().len()
    );
    points.len()
}

#[test]
fn snapshot_grub_crash_matrix() {
    let base = grub_base();
    assert_eq!(grub_boots(&base), Ok((1, 1)));
    let mut total = 0;

    // Steps 4 and 6: the menu entry, then next_entry.
    let mut rec = RecordingDisk::on(base.clone());
    grub::register(&mut rec, &grub_entry(2)).unwrap();
    total += grub_matrix("register", &rec, &[1, 2]);

    // The trial boot consumes the one-shot; until the commit the saved default is 1.
    let mut upgraded = base.clone();
    grub::register(&mut upgraded, &grub_entry(2)).unwrap();
    assert_eq!(grub::simulate_boot(&mut upgraded).unwrap(), Some(snap(2)));
    assert_eq!(grub_boots(&upgraded), Ok((1, 1)));
    let mut rec = RecordingDisk::on(upgraded.clone());
    assert_eq!(
        grub::commit(&mut rec, &snap(2)).unwrap(),
        Some((snap(1).to_string(), snap(2).to_string()))
    );
    total += grub_matrix("commit", &rec, &[1, 2]);

    let mut committed = upgraded.clone();
    grub::commit(&mut committed, &snap(2)).unwrap();
    assert_eq!(grub_boots(&committed), Ok((2, 2)));
    let mut rec = RecordingDisk::on(committed.clone());
    grub::rollback(&mut rec, &snap(1)).unwrap();
    total += grub_matrix("rollback", &rec, &[1, 2]);

    // Pruning snapshot 1 while 2 is the default: 2 boots in every state.
    let mut rec = RecordingDisk::on(committed.clone());
    grub::remove(&mut rec, &snap(1)).unwrap();
    total += grub_matrix("prune", &rec, &[2]);

    // A third snapshot whose one try fails (never committed): the next boot is 2 again.
    let mut disk = committed;
    grub::register(&mut disk, &grub_entry(3)).unwrap();
    assert_eq!(grub::simulate_boot(&mut disk).unwrap(), Some(snap(3)));
    assert_eq!(grub::simulate_boot(&mut disk).unwrap(), Some(snap(2)));
    let scan = grub::scan(&disk).unwrap();
    use grub::Mark;
    use slate_bootspec::BootState::{Bad, Good};
    assert_eq!(
        scan.state_of(&snap(3), Some(&snap(2)), Some(Mark::Trial)),
        Some(Bad)
    );
    assert_eq!(scan.state_of(&snap(1), Some(&snap(2)), None), Some(Good));
    // The saved default and the one boot next are never removed.
    assert!(grub::remove(&mut disk, &snap(2)).is_err());
    println!("snapshot GRUB crash matrix: {total} crash states checked");
}

#[test]
fn grub_writes_are_refused_before_writing_when_grubenv_is_damaged() {
    let mut disk = grub_base();
    {
        let (start, len) = {
            let parts = slate_layout::partitions(&mut disk).unwrap();
            (parts[0].start, parts[0].len)
        };
        let view = slate_disk::PartitionView::new(&mut disk, start, len).unwrap();
        let fs = fat::mount(view, 0).unwrap();
        {
            use std::io::Write;
            let mut f = fs.root_dir().open_file("grub/grubenv").unwrap();
            f.write_all(b"garbage").unwrap();
        }
        fat::unmount(fs).unwrap();
    }
    let before = disk.to_bytes();
    // GRUB still boots the committed default, from the second record.
    let scan = grub::scan(&disk).unwrap();
    assert_eq!(scan.selected().map(|e| e.snapshot.clone()), Some(snap(1)));
    assert!(grub::register(&mut disk, &grub_entry(2)).is_err());
    assert!(grub::commit(&mut disk, &snap(1)).is_err());
    assert!(disk.to_bytes() == before, "nothing written");
    assert!(grub::is_grub_layout(&disk).unwrap());
    assert!(!grub::is_grub_layout(&base()).unwrap());
    // Another grub.cfg (an A/B GRUB disk's) is not taken for the snapshot layout: refused.
    let mut other = base();
    {
        let (start, len) = {
            let parts = slate_layout::partitions(&mut other).unwrap();
            (parts[0].start, parts[0].len)
        };
        let mut view = slate_disk::PartitionView::new(&mut other, start, len).unwrap();
        fat::create_dirs(&mut view, 0, &["grub"]).unwrap();
        let fs = fat::mount(view, 0).unwrap();
        fat::write_file_atomically(
            &fs,
            "grub/grub.cfg",
            b"# Generated by slate's installer
",
        )
        .unwrap();
        fat::unmount(fs).unwrap();
    }
    let err = grub::is_grub_layout(&other).unwrap_err();
    assert!(err.to_string().contains("A/B"), "{err}");
}
