//! One boot of a chosen entry (`SystemdBoot::boot_once`): `LoaderEntryOneShot` set to its ID
//! after every check, consumed by the boot it chooses, and refused before any write for an
//! entry that is not there, is marked bad, or while an upgrade is pending.

mod common;

use common::*;
use slate_bootloader::LOADER_ENTRY_ONESHOT;
use slate_bootloader::{Bootloader, BootloaderError, EfiVars, MemEfiVars, SystemdBoot};
use slate_disk::MemDisk;

/// v1 and v2 on the ESP, v2 committed and the default.
fn two_committed() -> SystemdBoot<MemDisk, MemEfiVars> {
    let mut boot = sdboot(running_v1(&uki(1, 20_000)));
    boot.upgrade(&request(&uki(2, 20_000), "2", "slate-1.efi"))
        .unwrap();
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    boot.commit(&booted).unwrap();
    boot
}

fn selected(boot: &SystemdBoot<MemDisk, MemEfiVars>) -> Option<String> {
    boot.status().unwrap().selected.map(|s| s.file_name)
}

#[test]
fn the_chosen_entry_boots_once_then_the_default_again() {
    let mut boot = two_committed();
    assert_eq!(selected(&boot).as_deref(), Some("slate-2.efi"));
    assert_eq!(boot.plan_boot_once("slate-1.efi").unwrap(), "slate-1.efi");
    assert_eq!(
        boot.vars().get(LOADER_ENTRY_ONESHOT),
        None,
        "a plan writes nothing"
    );
    assert_eq!(boot.boot_once("slate-1.efi").unwrap(), "slate-1.efi");
    assert_eq!(
        boot.vars().get(LOADER_ENTRY_ONESHOT).as_deref(),
        Some("slate-1.efi")
    );
    assert_eq!(selected(&boot).as_deref(), Some("slate-1.efi"));
    // systemd-boot deletes the variable as it reads it: the boot after is the default's.
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-1.efi")
    );
    assert_eq!(selected(&boot).as_deref(), Some("slate-2.efi"));
}

#[test]
fn missing_bad_and_pending_are_refused_before_any_write() {
    let mut boot = two_committed();
    assert!(matches!(
        boot.boot_once("slate-9.efi"),
        Err(BootloaderError::EntryNotFound(_))
    ));

    // v3 on trial: the trial boot must come next.
    boot.upgrade(&request(&uki(3, 20_000), "3", "slate-2.efi"))
        .unwrap();
    let err = boot.boot_once("slate-1.efi").unwrap_err().to_string();
    assert!(err.contains("an upgrade is pending"), "{err}");
    // v3 fails its boot and is reverted: marked bad.
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    boot.revert(&booted).unwrap();
    let bad = entry_files(&boot)
        .into_iter()
        .find(|f| f.starts_with("slate-3"))
        .unwrap();
    let err = boot.boot_once(&bad).unwrap_err().to_string();
    assert!(err.contains("is marked bad"), "{err}");
    assert_eq!(boot.vars().get(LOADER_ENTRY_ONESHOT), None);
}
