//! The crash matrix: every operation of the systemd-boot backend replayed over a fault-injecting
//! disk, power cut at every write and flush (unflushed writes dropped, kept, torn, scattered),
//! and for each state the selection model must boot the old or the new version with its UKI
//! byte-identical (v1 or v2; v2 or v3 for an upgrade that first prunes v1).

mod common;

use common::*;
use slate_bootloader::{Bootloader, SystemdBoot};
use slate_disk::{CrashPoint, CutMode, Disk, MemDisk, RecordingDisk};
use slate_esp::fat;

const V1_LEN: usize = 20_000;
const V2_LEN: usize = 24_000;
const V3_LEN: usize = 22_000;

/// Crash points of a recorded run, none sampled away: after every op, unflushed writes dropped
/// and kept, the last unflushed write torn at up to 8 sector counts (evenly spaced), and 16
/// RandomSectors seeds. (The ESP's writes reach the disk as whole sectors at each flush, see
/// `SectorBuffer`, so a run has tens of ops, not thousands.)
fn points(rec: &RecordingDisk) -> Vec<CrashPoint> {
    rec.crash_points(8, 16)
}

/// Checks every crash state of `rec`; returns (states, failures, versions seen).
fn run_matrix(
    rec: &RecordingDisk,
    pts: &[CrashPoint],
    versions: &[(&str, &[u8])],
) -> (usize, Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for &point in pts {
        match check_boots(rec.materialize(point), versions) {
            Ok(v) => {
                if !seen.contains(&v) {
                    seen.push(v)
                }
            }
            Err(e) => failures.push(format!("{point:?}: {e}")),
        }
    }
    (pts.len(), failures, seen)
}

/// v1 running and committed; v2 upgraded in (tag = slate-1.efi) and booted once (`+2-1`).
fn upgraded_and_booted(v1: &[u8], v2: &[u8]) -> MemDisk {
    let mut boot = sdboot(running_v1(v1));
    boot.upgrade(&request(v2, "2", "slate-1.efi")).unwrap();
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-2+2-1.efi")
    );
    boot.into_parts().0
}

/// v1 and v2 committed, v2 running, no tag: the next upgrade prunes v1 (keep_versions 2).
fn two_committed(v1: &[u8], v2: &[u8]) -> MemDisk {
    let mut boot = sdboot(running_v1(v1));
    boot.upgrade(&request(v2, "2", "slate-1.efi")).unwrap();
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    boot.commit(&booted).unwrap();
    boot.into_parts().0
}

fn record(
    base: &MemDisk,
    op: impl FnOnce(&mut SystemdBoot<RecordingDisk, slate_bootloader::MemEfiVars>),
) -> RecordingDisk {
    let mut boot = sdboot(RecordingDisk::on(base.clone()));
    op(&mut boot);
    boot.into_parts().0
}

#[test]
fn systemd_boot_crash_matrix() {
    let (v1, v2, v3) = (uki(1, V1_LEN), uki(2, V2_LEN), uki(3, V3_LEN));
    let versions: [(&str, &[u8]); 2] = [("1", &v1), ("2", &v2)];
    let later: [(&str, &[u8]); 2] = [("2", &v2), ("3", &v3)];
    let mut total = 0;
    let mut report = Vec::new();

    let base = running_v1(&v1);
    let upgrade = record(&base, |b| {
        b.upgrade(&request(&v2, "2", "slate-1.efi")).unwrap();
    });
    let upgraded = upgraded_and_booted(&v1, &v2);
    let commit = record(&upgraded, |b| {
        b.commit("slate-2+2-1.efi").unwrap();
    });
    let revert = record(&upgraded, |b| {
        assert_eq!(
            b.revert("slate-2+2-1.efi").unwrap().as_deref(),
            Some("slate-1.efi")
        );
    });
    // The upgrade after that prunes v1 first: every state boots v2 or v3.
    let pruning = record(&two_committed(&v1, &v2), |b| {
        let out = b.upgrade(&request(&v3, "3", "slate-2.efi")).unwrap();
        assert_eq!(out.removed, ["slate-1.efi"]);
    });
    // A rollback by hand from v2 (committed) to v1: v1 on trial, v2 marked bad.
    let rollback = record(&two_committed(&v1, &v2), |b| {
        let plan = b.rollback("slate-2.efi", 3).unwrap();
        assert_eq!(
            (plan.to_on_trial.as_str(), plan.from_marked.as_str()),
            ("slate-1+3.efi", "slate-2+0.efi")
        );
    });
    for (what, rec, must_see, versions) in [
        ("upgrade", &upgrade, &["1", "2"][..], &versions),
        ("rollback", &rollback, &["1", "2"][..], &versions),
        ("commit", &commit, &["2"][..], &versions),
        ("revert", &revert, &["1", "2"][..], &versions),
        ("pruning upgrade", &pruning, &["2", "3"][..], &later),
    ] {
        let (n, failures, seen) = run_matrix(rec, &points(rec), versions);
        assert!(
            failures.is_empty(),
            "{what}: {} of {n} states fail, e.g. {:#?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        for v in must_see {
            assert!(
                seen.iter().any(|s| s == v),
                "{what}: v{v} never boots: {seen:?}"
            );
        }
        report.push(format!(
            "{what} {n} ({} ops, boots {})",
            rec.log().len(),
            seen.join("/")
        ));
        total += n;
    }
    println!(
        "systemd-boot crash matrix: {total} crash states checked ({})",
        report.join(", ")
    );
}

/// A writer that creates the final name first and fills it in place (no temp name): the matrix
/// must catch it, or it proves nothing.
#[test]
fn the_matrix_catches_writing_the_final_name_in_place() {
    let (v1, v2) = (uki(1, V1_LEN), uki(2, V2_LEN));
    let versions: [(&str, &[u8]); 2] = [("1", &v1), ("2", &v2)];
    let base = running_v1(&v1);
    let mut rec = RecordingDisk::on(base);
    {
        let esp = slate_esp::session::open(&mut rec).unwrap();
        let fs = fat::mount(esp, EPOCH).unwrap();
        let dir = fs.root_dir().open_dir("EFI/Linux").unwrap();
        let mut f = dir.create_file("slate-2+3.efi").unwrap();
        std::io::Write::write_all(&mut f, &v2).unwrap();
        std::io::Write::flush(&mut f).unwrap();
        drop(f);
        drop(dir);
        fat::unmount(fs).unwrap();
    }
    rec.flush().unwrap();
    // fatfs' own small writes make this run long: every 8th crash point is enough to show it.
    let sample: Vec<CrashPoint> = points(&rec).into_iter().step_by(8).collect();
    let (n, failures, _) = run_matrix(&rec, &sample, &versions);
    assert!(
        !failures.is_empty(),
        "all {n} states passed for a writer without a temp name"
    );
    println!(
        "in-place writer: {} of {n} crash states boot a broken UKI, e.g. {}",
        failures.len(),
        failures[0]
    );
    // The completed run itself is fine: the failures are the cut states.
    assert_eq!(
        check_boots(
            rec.materialize(CrashPoint {
                ops_done: rec.log().len(),
                mode: CutMode::DropUnflushed
            }),
            &versions
        )
        .unwrap(),
        "2"
    );
}

/// The install mode onto a blank disk, power cut at every write and flush: a disk that was
/// never bootable may stay unbootable (the install did not happen), but whenever the model
/// selects an entry it is v1 with its UKI byte-identical — a half-installed disk never boots a
/// torn UKI.
#[test]
fn install_crash_matrix() {
    let v1 = uki(1, V1_LEN);
    let mut rec = RecordingDisk::new(vec![0; DISK_LEN]);
    write_installed(&mut rec, &v1);
    // The install issues thousands of writes (FAT tables, cleared partition heads) before the
    // ESP's files, and each state is a 64 MiB disk: every state of the last 120 ops (the ESP
    // files, META: where the flushes are), and a cut dropping or keeping the unflushed writes
    // at every 64th op before them (those disks hold no entry yet).
    let all = rec.crash_points(2, 2);
    let ops = rec.log().len();
    let pts: Vec<CrashPoint> = all
        .iter()
        .filter(|p| {
            p.ops_done + 120 >= ops
                || (p.ops_done % 64 == 0
                    && matches!(p.mode, CutMode::DropUnflushed | CutMode::KeepUnflushed))
        })
        .copied()
        .collect();
    let (mut installed, mut blank, mut unreadable) = (0, 0, 0);
    let mut failures = Vec::new();
    for &point in &pts {
        let disk = rec.materialize(point);
        let boot = sdboot(disk);
        // fatfs 0.3 can panic (arithmetic overflow) on a half-formatted FAT; such a volume
        // holds nothing bootable.
        let Ok(status) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| boot.status()))
        else {
            unreadable += 1;
            continue;
        };
        let selected = status
            .ok()
            .and_then(|s| s.selected_file().map(str::to_owned));
        match selected {
            None => blank += 1,
            Some(file) if file == "slate-1+3.efi" => match boot.read_entry(&file) {
                Ok(content) if content == v1 => installed += 1,
                Ok(content) => failures.push(format!(
                    "{point:?}: {file} is {} bytes of something else",
                    content.len()
                )),
                Err(e) => failures.push(format!("{point:?}: reading {file}: {e:?}")),
            },
            Some(file) => failures.push(format!("{point:?}: selects {file}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} install states fail, e.g. {:#?}",
        failures.len(),
        pts.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        installed > 0 && blank > 0,
        "{installed} installed, {blank} blank"
    );
    println!(
        "install crash matrix: {} crash states checked (of {}; {ops} ops): {installed} boot v1 \
         intact, {blank} boot nothing, {unreadable} unreadable half-formatted FAT",
        pts.len(),
        all.len()
    );
}
