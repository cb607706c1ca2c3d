//! Pins on systemd-boot (META `PinnedVersions`): a pinned version's UKI survives every later
//! upgrade's pruning, and is neither counted against `keep_versions` nor offered as room.

mod common;

use common::*;
use slate_bootloader::{Bootloader, MemEfiVars, SystemdBoot};
use slate_disk::{MemDisk, RecordingDisk};

fn upgrade_and_commit(boot: &mut SystemdBoot<MemDisk, MemEfiVars>, v: u32) -> Vec<String> {
    let out = boot
        .upgrade(&request(
            &uki(v, 20_000),
            &v.to_string(),
            &format!("slate-{}.efi", v - 1),
        ))
        .unwrap();
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    boot.commit(&booted).unwrap();
    out.removed
}

#[test]
fn a_pinned_version_survives_later_upgrades_and_unpinned_ones_are_pruned() {
    let mut boot = sdboot(running_v1(&uki(1, 20_000)));
    let pinned = boot.pin("1", true, false).unwrap();
    assert_eq!(
        (pinned.pinned.as_slice(), pinned.changed),
        (&["1".to_owned()][..], true)
    );
    assert_eq!(boot.status().unwrap().pinned, ["1"]);
    let removed: Vec<Vec<String>> = (2..=5).map(|v| upgrade_and_commit(&mut boot, v)).collect();
    // keep_versions 2 counts the new and the running version; v1 is outside the count.
    let none: Vec<String> = Vec::new();
    assert_eq!(
        removed,
        [
            none.clone(),
            none,
            vec!["slate-2.efi".to_owned()],
            vec!["slate-3.efi".to_owned()]
        ]
    );
    assert_eq!(
        entry_files(&boot),
        ["slate-1.efi", "slate-4.efi", "slate-5.efi"]
    );
    let explained = boot.explain().unwrap();
    let pinned: Vec<&str> = explained
        .entries
        .iter()
        .filter(|e| e.pinned)
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(pinned, ["slate-1.efi"]);

    // Pinned and running, it still counts as the running version: the other old one goes.
    let mut running_pinned = sdboot(running_v1(&uki(1, 20_000)));
    assert!(upgrade_and_commit(&mut running_pinned, 2).is_empty());
    running_pinned.pin("2", true, false).unwrap();
    assert_eq!(upgrade_and_commit(&mut running_pinned, 3), ["slate-1.efi"]);

    // Unpinned, it is pruned like any other old version by the next upgrade.
    let unpinned = boot.pin("1", false, false).unwrap();
    assert!(unpinned.changed && unpinned.pinned.is_empty());
    assert_eq!(
        upgrade_and_commit(&mut boot, 6),
        ["slate-1.efi", "slate-4.efi"]
    );
    assert_eq!(entry_files(&boot), ["slate-5.efi", "slate-6.efi"]);
}

#[test]
fn pins_are_refused_or_left_alone_without_a_write() {
    let (disk, _) = sdboot(running_v1(&uki(1, 20_000))).into_parts();
    let mut boot = sdboot(RecordingDisk::on(disk));
    let err = boot.pin("2", true, false).unwrap_err().to_string();
    assert!(
        err.contains("no UKI of version 2 is on the ESP (it holds 1)"),
        "{err}"
    );
    let err = boot.pin("1,2", true, false).unwrap_err().to_string();
    assert!(err.contains("not a version that can be pinned"), "{err}");
    // A dry run answers the pins it would leave; unpinning what is not pinned changes nothing.
    let dry = boot.pin("1", true, true).unwrap();
    assert_eq!((dry.pinned, dry.changed), (vec!["1".to_owned()], true));
    let nothing = boot.pin("7", false, false).unwrap();
    assert!(!nothing.changed && nothing.pinned.is_empty());
    assert!(boot.status().unwrap().pinned.is_empty());
    assert!(boot.into_parts().0.log().is_empty(), "nothing written");
}

#[test]
fn an_unreadable_pin_list_refuses_the_upgrade_rather_than_prune() {
    let (mut disk, _) = sdboot(running_v1(&uki(1, 20_000))).into_parts();
    {
        let meta = slate_layout::open_partition(&mut disk, slate_layout::META_LABEL).unwrap();
        let mut store = slate_meta::MetaStore::open(meta).unwrap();
        store
            .set(slate_meta::tags::PINNED_VERSIONS, b"1,,2".to_vec())
            .unwrap();
        store.flush().unwrap();
    }
    let mut boot = sdboot(RecordingDisk::on(disk));
    let status = boot.status().unwrap();
    assert!(
        status.warnings.iter().any(|w| w.contains("PinnedVersions")),
        "{:?}",
        status.warnings
    );
    let err = boot
        .upgrade(&request(&uki(2, 20_000), "2", "slate-1.efi"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("META PinnedVersions cannot be read"), "{err}");
    assert!(boot.into_parts().0.log().is_empty(), "nothing written");
}
