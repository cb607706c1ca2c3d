//! The systemd-boot backend's operations, one story each, checked with its own status model.

mod common;

use common::*;
use slate_bootloader::{
    Bootloader, BootloaderError, EfiVars, MemEfiVars, SystemdBoot, LOADER_ENTRY_DEFAULT,
};
use slate_bootspec::BootState;
use slate_disk::{MemDisk, RecordingDisk};
use slate_layout::MIB;

fn upgraded_to_v2() -> SystemdBoot<MemDisk, MemEfiVars> {
    let mut boot = sdboot(running_v1(&uki(1, 20_000)));
    let out = boot
        .upgrade(&request(&uki(2, 30_000), "2", "slate-1.efi"))
        .unwrap();
    assert_eq!(out.file_name, "slate-2+3.efi");
    assert_eq!(out.fallback, "slate-1.efi");
    assert!(out.removed.is_empty() && out.cleared_vars.is_empty());
    boot
}

fn states(boot: &impl Bootloader) -> Vec<(String, BootState)> {
    let status = boot.status().unwrap();
    status
        .entries
        .iter()
        .map(|e| (e.file_name.clone(), e.state))
        .collect()
}

#[test]
fn upgrade_then_status_picks_v2_with_three_tries() {
    let boot = upgraded_to_v2();
    let status = boot.status().unwrap();
    assert_eq!(status.selected_file(), Some("slate-2+3.efi"));
    assert_eq!(status.upgrade_tag.as_deref(), Some("slate-1.efi"));
    assert!(status.temp_files.is_empty(), "{:?}", status.temp_files);
    let v2 = status
        .entries
        .iter()
        .find(|e| e.file_name == "slate-2+3.efi")
        .unwrap();
    assert_eq!(
        (v2.version.as_deref(), v2.state, v2.len),
        (Some("2"), BootState::Indeterminate, 30_000)
    );
    assert_eq!(boot.read_entry("slate-2+3.efi").unwrap(), uki(2, 30_000));
    assert_eq!(boot.read_entry("slate-1.efi").unwrap(), uki(1, 20_000));
}

#[test]
fn boot_attempt_then_commit_blesses_and_drops_the_tag() {
    let mut boot = upgraded_to_v2();
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-2+2-1.efi")
    );
    let out = boot.commit("slate-2+2-1.efi").unwrap();
    assert_eq!(out.blessed, "slate-2.efi");
    assert_eq!(out.previous.as_deref(), Some("slate-1.efi"));
    let status = boot.status().unwrap();
    assert_eq!(status.upgrade_tag, None);
    assert_eq!(status.selected_file(), Some("slate-2.efi"));
    // Blessed entries are not renamed again; commit is idempotent.
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-2.efi")
    );
    assert_eq!(boot.commit("slate-2.efi").unwrap().previous, None);
    assert_eq!(boot.status().unwrap().selected_file(), Some("slate-2.efi"));
}

#[test]
fn three_failed_attempts_fall_back_to_v1() {
    let mut boot = upgraded_to_v2();
    for expected in ["slate-2+2-1.efi", "slate-2+1-2.efi", "slate-2+0-3.efi"] {
        assert_eq!(
            boot.simulate_boot_attempt().unwrap().as_deref(),
            Some(expected)
        );
    }
    let status = boot.status().unwrap();
    assert_eq!(status.selected_file(), Some("slate-1.efi"));
    assert_eq!(status.upgrade_tag.as_deref(), Some("slate-1.efi"));
    // v1 reaches Running and commits: the tag goes, v2 stays bad.
    boot.commit("slate-1.efi").unwrap();
    assert_eq!(
        states(&boot),
        [
            ("slate-1.efi".into(), BootState::Good),
            ("slate-2+0-3.efi".into(), BootState::Bad)
        ]
    );
}

#[test]
fn revert_marks_v2_bad_and_returns_to_v1() {
    let mut boot = upgraded_to_v2();
    boot.simulate_boot_attempt().unwrap();
    assert_eq!(
        boot.revert("slate-2+2-1.efi").unwrap().as_deref(),
        Some("slate-1.efi")
    );
    let status = boot.status().unwrap();
    assert_eq!(status.selected_file(), Some("slate-1.efi"));
    assert_eq!(status.upgrade_tag, None);
    assert!(states(&boot).contains(&("slate-2+0-1.efi".into(), BootState::Bad)));
    assert_eq!(
        boot.vars().get(LOADER_ENTRY_DEFAULT),
        None,
        "the bad mark suffices"
    );
    // Nothing left to revert: no write at all.
    let (disk, _) = boot.into_parts();
    let mut again = sdboot(RecordingDisk::on(disk));
    assert_eq!(again.revert("slate-1.efi").unwrap(), None);
    assert!(again.disk().log().is_empty());
}

#[test]
fn an_empty_tag_is_just_deleted() {
    let mut boot = sdboot(running_v1(&uki(1, 20_000)));
    let (disk, _) = boot_with_tag(&mut boot, b"");
    let mut boot = sdboot(disk);
    assert_eq!(boot.status().unwrap().upgrade_tag.as_deref(), Some(""));
    assert_eq!(boot.revert("slate-1.efi").unwrap(), None);
    assert_eq!(boot.status().unwrap().upgrade_tag, None);
    assert_eq!(boot.status().unwrap().selected_file(), Some("slate-1.efi"));
}

fn boot_with_tag(boot: &mut SystemdBoot<MemDisk, MemEfiVars>, tag: &[u8]) -> (MemDisk, MemEfiVars) {
    let boot = std::mem::replace(boot, sdboot(MemDisk::zeroed(0)));
    let (mut disk, vars) = boot.into_parts();
    let meta = slate_layout::open_partition(&mut disk, slate_layout::META_LABEL).unwrap();
    let mut store = slate_meta::MetaStore::open(meta).unwrap();
    store.set(slate_meta::tags::UPGRADE, tag.to_vec()).unwrap();
    store.flush().unwrap();
    (disk, vars)
}

#[test]
fn a_stale_efi_default_is_cleared_because_the_model_needs_it() {
    let mut vars = MemEfiVars::new();
    vars.set(LOADER_ENTRY_DEFAULT, "slate-1.efi").unwrap();
    let mut boot =
        SystemdBoot::new(running_v1(&uki(1, 20_000)), vars).with_source_date_epoch(EPOCH);
    // The model: with the variable, v1 stays the default even next to v2.
    assert_eq!(boot.status().unwrap().selected_file(), Some("slate-1.efi"));
    let out = boot
        .upgrade(&request(&uki(2, 1000), "2", "slate-1.efi"))
        .unwrap();
    assert_eq!(out.cleared_vars, [LOADER_ENTRY_DEFAULT]);
    assert_eq!(boot.vars().get(LOADER_ENTRY_DEFAULT), None);
    assert_eq!(
        boot.status().unwrap().selected_file(),
        Some("slate-2+3.efi")
    );
}

const BIG: usize = 12 * MIB as usize;

/// v1, v2, v3 of 12 MiB each on the 40 MiB ESP; v4 does not fit without pruning. The loader
/// keeps up to 16 versions, so only room prunes.
fn three_big_versions(commit_v3: bool) -> SystemdBoot<MemDisk, MemEfiVars> {
    let mut boot = sdboot(running_v1(&uki(1, BIG))).with_keep_versions(16);
    boot.upgrade(&request(&uki(2, BIG), "2", "slate-1.efi"))
        .unwrap();
    boot.commit("slate-2+3.efi").unwrap();
    boot.upgrade(&request(&uki(3, BIG), "3", "slate-2.efi"))
        .unwrap();
    if commit_v3 {
        boot.commit("slate-3+3.efi").unwrap();
    }
    boot
}

#[test]
fn a_full_esp_prunes_the_oldest_but_never_running_or_fallback() {
    let mut boot = three_big_versions(true);
    let free = boot.status().unwrap().free_bytes;
    assert!(free < BIG as u64, "the ESP must be too full: {free}");
    let out = boot
        .upgrade(&request(&uki(4, BIG), "4", "slate-3.efi"))
        .unwrap();
    assert_eq!(out.removed, ["slate-1.efi"]);
    let status = boot.status().unwrap();
    assert_eq!(status.selected_file(), Some("slate-4+3.efi"));
    assert_eq!(boot.read_entry("slate-4+3.efi").unwrap(), uki(4, BIG));

    // Running the oldest (v1) with v2 the pending fallback: only v3 may go.
    let mut boot = three_big_versions(false);
    let (disk, vars) = boot_with_tag(&mut boot, b"slate-2.efi");
    let mut boot = SystemdBoot::new(disk, vars)
        .with_source_date_epoch(EPOCH)
        .with_keep_versions(16);
    let out = boot
        .upgrade(&request(&uki(4, BIG), "4", "slate-1.efi"))
        .unwrap();
    assert_eq!(out.removed, ["slate-3+3.efi"]);
    assert_eq!(boot.read_entry("slate-1.efi").unwrap(), uki(1, BIG));
    assert_eq!(boot.read_entry("slate-2.efi").unwrap(), uki(2, BIG));
}

#[test]
fn refused_upgrades_write_nothing() {
    let mut boot = three_big_versions(false);
    let (disk, _) = boot_with_tag(&mut boot, b"slate-2.efi");
    let bytes = disk.into_bytes();
    let big = uki(4, BIG);
    let huge = uki(5, 30 * MIB as usize);
    type Expect = fn(&BootloaderError) -> bool;
    let cases: Vec<(_, Expect)> = vec![
        (request(&big, "4", "slate-9.efi"), |e| {
            matches!(e, BootloaderError::EntryNotFound(_))
        }),
        (request(&big, "4 x", "slate-1.efi"), |e| {
            matches!(e, BootloaderError::Esp(_))
        }),
        (request(&big, "4+1", "slate-1.efi"), |e| {
            matches!(e, BootloaderError::Esp(_))
        }),
        (request(&big, "3", "slate-3.efi"), |e| {
            matches!(e, BootloaderError::Invalid(_))
        }),
        (request(&big, "2", "slate-1.efi"), |e| {
            matches!(e, BootloaderError::Invalid(_))
        }),
        (request(&[], "4", "slate-1.efi"), |e| {
            matches!(e, BootloaderError::Invalid(_))
        }),
        // Running v1 with fallback v2: pruning v3 frees 12 MiB, not 30.
        (
            request(&huge, "5", "slate-1.efi"),
            |e| matches!(e, BootloaderError::Invalid(m) if m.contains("does not fit")),
        ),
    ];
    for (req, expected) in cases {
        let mut boot = sdboot(RecordingDisk::new(bytes.clone()));
        let err = boot.upgrade(&req).unwrap_err();
        assert!(expected(&err), "{req:?}: {err:?}");
        assert!(boot.disk().log().is_empty(), "{req:?} wrote");
        assert!(boot.disk().current().to_bytes() == bytes);
    }
    let mut zero_tries = request(&big, "4", "slate-1.efi");
    zero_tries.tries = 0;
    let mut boot = sdboot(RecordingDisk::new(bytes.clone()));
    assert!(boot.upgrade(&zero_tries).is_err());
    assert!(boot.disk().log().is_empty());
}

/// Committed upgrades v1 → v2 → … with small UKIs, keeping `keep` versions; the removals of
/// each upgrade, and the entries left.
fn upgrades(keep: u32, to: u32) -> (Vec<Vec<String>>, Vec<(String, BootState)>) {
    let mut boot = sdboot(running_v1(&uki(1, 20_000))).with_keep_versions(keep);
    let mut removed = Vec::new();
    for v in 2..=to {
        let out = boot
            .upgrade(&request(
                &uki(v, 20_000),
                &v.to_string(),
                &format!("slate-{}.efi", v - 1),
            ))
            .unwrap();
        removed.push(out.removed);
        let booted = boot.simulate_boot_attempt().unwrap().unwrap();
        boot.commit(&booted).unwrap();
    }
    (removed, states(&boot))
}

#[test]
fn upgrades_keep_at_most_keep_versions_versions() {
    let good = |files: &[&str]| -> Vec<(String, BootState)> {
        files
            .iter()
            .map(|f| (f.to_string(), BootState::Good))
            .collect()
    };
    // The default, 2: every upgrade prunes the version before the running one.
    let (removed, left) = upgrades(slate_bootloader::sdboot::DEFAULT_KEEP_VERSIONS, 4);
    assert_eq!(removed, [vec![], vec!["slate-1.efi"], vec!["slate-2.efi"]]);
    assert_eq!(left, good(&["slate-3.efi", "slate-4.efi"]));
    // 3: the first two upgrades prune nothing, then the oldest goes.
    let (removed, left) = upgrades(3, 5);
    let none: Vec<String> = vec![];
    assert_eq!(
        removed,
        [
            none.clone(),
            none,
            vec!["slate-1.efi".into()],
            vec!["slate-2.efi".into()]
        ]
    );
    let mut left: Vec<_> = left.into_iter().map(|(f, _)| f).collect();
    left.sort();
    assert_eq!(left, ["slate-3.efi", "slate-4.efi", "slate-5.efi"]);
}

#[test]
fn bad_entries_are_pruned_before_good_ones() {
    // v1, v2 committed; v3 fails and is reverted (bad); running v2, keep 3, upgrade to v4: the
    // one place besides v2 and v4 goes to the good v1, the bad v3 is pruned.
    let mut boot = sdboot(running_v1(&uki(1, 20_000))).with_keep_versions(3);
    boot.upgrade(&request(&uki(2, 20_000), "2", "slate-1.efi"))
        .unwrap();
    boot.commit("slate-2+3.efi").unwrap();
    boot.upgrade(&request(&uki(3, 20_000), "3", "slate-2.efi"))
        .unwrap();
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    assert_eq!(
        boot.revert(&booted).unwrap().as_deref(),
        Some("slate-2.efi")
    );
    let out = boot
        .upgrade(&request(&uki(4, 20_000), "4", "slate-2.efi"))
        .unwrap();
    assert_eq!(out.removed, ["slate-3+0-1.efi"]);
    let mut left: Vec<_> = states(&boot).into_iter().map(|(f, _)| f).collect();
    left.sort();
    assert_eq!(left, ["slate-1.efi", "slate-2.efi", "slate-4+3.efi"]);
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

#[test]
fn a_refusal_for_room_names_the_numbers_and_writes_nothing() {
    // v1 and v2 of 12 MiB, v2 committed and running; the default keep_versions would prune v1,
    // but a 30 MiB v3 does not fit even then.
    let mut boot = sdboot(running_v1(&uki(1, BIG)));
    boot.upgrade(&request(&uki(2, BIG), "2", "slate-1.efi"))
        .unwrap();
    boot.commit("slate-2+3.efi").unwrap();
    let free = boot.status().unwrap().free_bytes;
    let bytes = boot.into_parts().0.into_bytes();
    let huge = uki(3, 30 * MIB as usize);

    let mut boot = sdboot(RecordingDisk::new(bytes.clone()));
    let plan = boot.plan_upgrade(&request(&huge, "3", "slate-2.efi"));
    let err = boot
        .upgrade(&request(&huge, "3", "slate-2.efi"))
        .unwrap_err()
        .to_string();
    assert_eq!(plan.unwrap_err().to_string(), err, "the plan refuses alike");
    let reclaimable = BIG as u64; // v1's clusters: 12 MiB is a whole number of them
    assert!(
        err.contains(&format!(
            "the new UKI slate-3+3.efi ({}) does not fit the EFI partition ({}): {} free, {} \
             reclaimable by pruning slate-1.efi; the running entry slate-2.efi is kept",
            mib(huge.len() as u64),
            mib(40 * MIB),
            mib(free),
            mib(reclaimable)
        )),
        "{err}"
    );
    assert!(boot.disk().log().is_empty(), "the refusal wrote");
    assert!(boot.disk().current().to_bytes() == bytes);
}

#[test]
fn another_os_entries_are_never_pruned() {
    let mut disk = running_v1(&uki(1, 20_000));
    {
        let esp = slate_esp::session::open(&mut disk).unwrap();
        let fs = slate_esp::fat::mount(esp, EPOCH).unwrap();
        let dir = fs.root_dir().open_dir("EFI/Linux").unwrap();
        for name in ["debian-12.efi", "slate-rescue-1.efi"] {
            let mut f = dir.create_file(name).unwrap();
            std::io::Write::write_all(&mut f, b"MZ another OS").unwrap();
        }
        drop(dir);
        slate_esp::fat::unmount(fs).unwrap();
    }
    let mut boot = sdboot(disk);
    for v in 2..=3u32 {
        let out = boot
            .upgrade(&request(
                &uki(v, 20_000),
                &v.to_string(),
                &format!("slate-{}.efi", v - 1),
            ))
            .unwrap();
        let booted = boot.simulate_boot_attempt().unwrap().unwrap();
        assert_eq!(booted, format!("slate-{v}+2-1.efi"));
        boot.commit(&booted).unwrap();
        if v == 3 {
            assert_eq!(out.removed, ["slate-1.efi"]);
        }
    }
    let mut left: Vec<_> = states(&boot).into_iter().map(|(f, _)| f).collect();
    left.sort();
    assert_eq!(
        left,
        [
            "debian-12.efi",
            "slate-2.efi",
            "slate-3.efi",
            "slate-rescue-1.efi"
        ]
    );
}

/// v1 and v2 committed, v2 running.
fn v2_committed() -> SystemdBoot<MemDisk, MemEfiVars> {
    let mut boot = upgraded_to_v2();
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    boot.commit(&booted).unwrap();
    assert_eq!(boot.status().unwrap().selected_file(), Some("slate-2.efi"));
    boot
}

#[test]
fn rollback_puts_the_previous_version_on_trial_and_its_commit_keeps_it() {
    let mut boot = v2_committed();
    let plan = boot.plan_rollback("slate-2.efi", 3).unwrap();
    assert_eq!(
        boot.status().unwrap().selected_file(),
        Some("slate-2.efi"),
        "planning writes nothing"
    );
    assert_eq!(boot.rollback("slate-2.efi", 3).unwrap(), plan);
    assert_eq!(
        (
            plan.to.as_str(),
            plan.to_on_trial.as_str(),
            plan.version.as_str()
        ),
        ("slate-1.efi", "slate-1+3.efi", "1")
    );
    let status = boot.status().unwrap();
    assert_eq!(status.selected_file(), Some("slate-1+3.efi"));
    assert_eq!(status.upgrade_tag.as_deref(), Some("slate-2.efi"));
    assert_eq!(boot.read_entry("slate-2+0.efi").unwrap(), uki(2, 30_000));
    // v1 boots on trial and its Running commits it: from then on v1 is the default.
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-1+2-1.efi")
    );
    let out = boot.commit("slate-1+2-1.efi").unwrap();
    assert_eq!(out.blessed, "slate-1.efi");
    assert_eq!(out.previous.as_deref(), Some("slate-2.efi"));
    for _ in 0..3 {
        assert_eq!(
            boot.simulate_boot_attempt().unwrap().as_deref(),
            Some("slate-1.efi")
        );
    }
    // Nothing left to go back to: v2 is marked bad.
    let err = boot.rollback("slate-1.efi", 3).unwrap_err().to_string();
    assert!(err.contains("nothing to roll back to"), "{err}");
}

#[test]
fn a_rollback_whose_version_fails_returns_to_the_running_one() {
    let mut boot = v2_committed();
    boot.rollback("slate-2.efi", 3).unwrap();
    let tried = boot.simulate_boot_attempt().unwrap().unwrap();
    assert_eq!(tried, "slate-1+2-1.efi");
    // Its health check failed: machined's revert returns to v2.
    assert_eq!(boot.revert(&tried).unwrap().as_deref(), Some("slate-2.efi"));
    // Both are marked bad now; among bad entries the newer version sorts first.
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-2+0-1.efi")
    );
    // And v2's Running commits it again (the counter-bearing name is blessed).
    assert_eq!(
        boot.commit("slate-2+0-1.efi").unwrap().blessed,
        "slate-2.efi"
    );
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-2.efi")
    );
}

#[test]
fn rollback_is_refused_before_any_write() {
    // Only one version on the disk.
    let disk = running_v1(&uki(1, 20_000));
    let mut boot = sdboot(RecordingDisk::on(disk));
    let err = boot.rollback("slate-1.efi", 3).unwrap_err().to_string();
    assert!(err.contains("nothing to roll back to"), "{err}");
    assert!(boot.into_parts().0.log().is_empty());
    // An upgrade pending.
    let pending = upgraded_to_v2().into_parts().0;
    let mut boot = sdboot(RecordingDisk::on(pending));
    let err = boot.rollback("slate-1.efi", 3).unwrap_err().to_string();
    assert!(err.contains("an upgrade is pending"), "{err}");
    assert!(boot.into_parts().0.log().is_empty());
    // An entry that is not on the disk.
    let mut boot = sdboot(RecordingDisk::on(v2_committed().into_parts().0));
    assert!(matches!(
        boot.rollback("slate-9.efi", 3),
        Err(BootloaderError::EntryNotFound(_))
    ));
    assert!(boot.into_parts().0.log().is_empty());
}

#[test]
fn rollback_below_the_version_floor_is_refused() {
    let (mut disk, _) = v2_committed().into_parts();
    {
        let meta = slate_layout::open_partition(&mut disk, slate_layout::META_LABEL).unwrap();
        let mut store = slate_meta::MetaStore::open(meta).unwrap();
        store
            .set(slate_meta::tags::VERSION_FLOOR, b"2".to_vec())
            .unwrap();
        store.flush().unwrap();
    }
    let mut boot = sdboot(RecordingDisk::on(disk));
    let err = boot.rollback("slate-2.efi", 3).unwrap_err().to_string();
    assert!(err.contains("below this disk's version floor 2"), "{err}");
    assert!(boot.into_parts().0.log().is_empty());
}
