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
    let mut again = sdboot(RecordingDisk::new(disk.into_bytes()));
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

/// v1, v2, v3 of 12 MiB each on the 40 MiB ESP; v4 does not fit without pruning.
fn three_big_versions(commit_v3: bool) -> SystemdBoot<MemDisk, MemEfiVars> {
    let mut boot = sdboot(running_v1(&uki(1, BIG)));
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
    let mut boot = SystemdBoot::new(disk, vars).with_source_date_epoch(EPOCH);
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
        (request(&huge, "5", "slate-1.efi"), |e| {
            matches!(e, BootloaderError::NoRoom { .. })
        }),
    ];
    for (req, expected) in cases {
        let mut boot = sdboot(RecordingDisk::new(bytes.clone()));
        let err = boot.upgrade(&req).unwrap_err();
        assert!(expected(&err), "{req:?}: {err:?}");
        assert!(boot.disk().log().is_empty(), "{req:?} wrote");
        assert!(boot.disk().current() == &bytes[..]);
    }
    let mut zero_tries = request(&big, "4", "slate-1.efi");
    zero_tries.tries = 0;
    let mut boot = sdboot(RecordingDisk::new(bytes.clone()));
    assert!(boot.upgrade(&zero_tries).is_err());
    assert!(boot.disk().log().is_empty());
}
