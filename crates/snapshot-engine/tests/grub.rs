//! The snapshot engine on a GRUB ESP (docs/formats.md §12.9), on a real Btrfs pool: the
//! upgrade's one-shot `next_entry` with `saved_entry` kept, commit moving `saved_entry`, a
//! trial that is not committed (GRUB's one-shot consumed: the next boot is the old default,
//! and the snapshot is listed bad), rollback, and pruning with the menu entries. grubenv is
//! read back with the real `grub-editenv`.

mod common;

use common::*;
use slate_snapshot_engine::{commit, list, prune, rollback, VerifyPolicy};

fn grub_available() -> bool {
    available() && slate_testkit::require_tool("grub-editenv")
}

fn state(env: &Env, snapshot: &str) -> (String, bool, bool) {
    let listing = list(&env.pool()).unwrap();
    let s = listing
        .snapshots
        .iter()
        .find(|s| s.name == snapshot)
        .unwrap_or_else(|| panic!("{snapshot} not listed: {listing:?}"));
    (s.state.clone(), s.boots_next, s.fallback)
}

/// GRUB starts a new snapshot once: asking for more tries is refused before anything is
/// written, and 1 is what it does anyway.
#[test]
fn grub_refuses_more_than_one_try() {
    if !grub_available() {
        return;
    }
    let env = Env::new_grub();
    let opts = |tries| slate_snapshot_engine::UpgradeOptions {
        change: slate_snapshot_engine::Change::Command("true".into()),
        dry_run: false,
        cmdline: "quiet".into(),
        now: Some(T1),
        tries,
    };
    let err = slate_snapshot_engine::upgrade(&env.pool(), &opts(Some(3)), &mut |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("GRUB starts a new snapshot once"),
        "{err}"
    );
    assert_eq!(env.subvolumes(), [R0]);
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={R0}")]
    );
    let report = slate_snapshot_engine::upgrade(&env.pool(), &opts(Some(1)), &mut |_| {}).unwrap();
    assert_eq!(report.entry, "menuentry root-20260102-000000");
}

#[test]
fn grub_upgrade_sets_next_entry_and_commit_moves_saved_entry() {
    if !grub_available() {
        return;
    }
    let env = Env::new_grub();
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={R0}")]
    );
    let dry = slate_snapshot_engine::upgrade(
        &env.pool(),
        &slate_snapshot_engine::UpgradeOptions {
            change: slate_snapshot_engine::Change::Command("true".into()),
            dry_run: true,
            cmdline: "quiet".into(),
            now: Some(T1),
            tries: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert!(
        dry.plan
            .iter()
            .any(|l| l.contains("grubenv next_entry=root-20260102-000000")),
        "{:?}",
        dry.plan
    );
    assert_eq!(env.subvolumes(), [R0], "a dry run writes nothing");
    let report = env.command("echo 2 > /usr/share/doc/version", 0).unwrap();
    let new = "root-20260102-000000";
    assert_eq!(report.entry, format!("menuentry {new}"));
    // Step 4: the menu gains the entry (newest first), which boots the snapshot's own /boot.
    assert_eq!(env.grub_menu(), [new, R0]);
    let disk = slate_disk::FileDisk::open_read_only(&env.esp).unwrap();
    let menu = slate_esp::session::read_file(&disk, "grub/snapshots.cfg")
        .unwrap()
        .unwrap();
    let menu = String::from_utf8(menu).unwrap();
    assert!(
        menu.contains(&format!(
            "menuentry 'Test OS 1 2026-01-02 00:00:00 ({new})' --id {new} {{\n  \
             search --no-floppy --fs-uuid --set=root {uuid}\n  \
             linux /{new}/boot/vmlinuz-6.1.0-1-amd64 root=UUID={uuid} rootflags=subvol={new} \
             rootfstype=btrfs rw quiet\n  initrd /{new}/boot/initrd.img-6.1.0-1-amd64\n}}\n",
            uuid = env.uuid
        )),
        "{menu}"
    );
    // No kernel copies on the ESP; the manifest covers /boot in the pool only.
    assert_eq!(env.esp_files(new), 0);
    assert!(env.entries().is_empty(), "no Type #1 entries");
    // Step 6: the one-shot, the permanent default unchanged.
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={R0}"), format!("next_entry={new}")]
    );
    assert_eq!(state(&env, new), ("indeterminate".into(), true, false));
    assert_eq!(state(&env, R0).0, "good");
    assert!(env.top().join(format!(".slate/grub/{new}")).exists());

    // The trial boot consumes the one-shot; the commit makes the new snapshot the default.
    assert_eq!(env.grub_reboot(), new);
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={R0}"), "next_entry=".to_owned()]
    );
    assert_eq!(state(&env, new).0, "indeterminate", "running its trial");
    let out = commit(&env.pool(), false).unwrap();
    assert_eq!(out.saved_entry, Some((R0.to_owned(), new.to_owned())));
    assert_eq!(out.renamed, None);
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={new}")]
    );
    assert_eq!(
        env.grub_editenv("grub/slate-default.env"),
        [format!("saved_entry={new}")]
    );
    assert_eq!(state(&env, new), ("good".into(), true, false));
    assert_eq!(state(&env, R0), ("good".into(), false, true));
    assert!(!env.top().join(format!(".slate/grub/{new}")).exists());
    // Committing again changes nothing.
    assert_eq!(commit(&env.pool(), false).unwrap().saved_entry, None);
    assert_eq!(env.grub_reboot(), new);
}

#[test]
fn a_grub_trial_that_is_not_committed_boots_the_old_default_next() {
    if !grub_available() {
        return;
    }
    let env = Env::new_grub();
    let new = env.command("true", 0).unwrap().snapshot;
    assert_eq!(env.grub_reboot(), new, "the one try");
    // It dies before its commit (a kernel panic, a hang): GRUB's one-shot is spent.
    assert_eq!(env.grub_reboot(), R0, "the next boot is the old default");
    assert_eq!(
        env.grub_editenv("grub/grubenv")[0],
        format!("saved_entry={R0}")
    );
    assert_eq!(state(&env, &new), ("bad".into(), false, false));
    // machined commits the old root after its health checks; the failed trial stays bad, and
    // is the first to go when pruning.
    assert_eq!(commit(&env.pool(), false).unwrap().saved_entry, None);
    assert_eq!(state(&env, &new).0, "bad");
    // A rollback from the old root has nothing older to go to.
    assert!(rollback(&env.pool(), VerifyPolicy::Off, false).is_err());
}

#[test]
fn grub_rollback_makes_the_previous_snapshot_the_default() {
    if !grub_available() {
        return;
    }
    let env = Env::new_grub();
    let new = env.command("true", 0).unwrap().snapshot;
    assert_eq!(env.grub_reboot(), new);
    commit(&env.pool(), false).unwrap();
    let dry = rollback(&env.pool(), VerifyPolicy::Warn, true).unwrap();
    assert_eq!(dry.target, R0);
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={new}")]
    );
    let out = rollback(&env.pool(), VerifyPolicy::Warn, false).unwrap();
    assert_eq!(out.target, R0);
    assert_eq!(out.to_entry, format!("grubenv saved_entry={R0}"));
    assert_eq!(out.from_entry, format!(".slate/grub/{new}"));
    assert_eq!(
        std::fs::read_to_string(env.top().join(out.from_entry)).unwrap(),
        "bad\n"
    );
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [format!("saved_entry={R0}")]
    );
    assert_eq!(
        env.grub_editenv("grub/slate-default.env"),
        [format!("saved_entry={R0}")]
    );
    assert_eq!(state(&env, &new).0, "bad");
    // R0 boots next, and is the running snapshot's fallback.
    assert_eq!(state(&env, R0), ("good".into(), true, true));
    assert_eq!(env.grub_reboot(), R0);
}

#[test]
fn grub_pruning_removes_menu_entries_bad_ones_first() {
    if !grub_available() {
        return;
    }
    let env = Env::new_grub();
    // 1: committed. 2: its trial fails. 3: four snapshots with it, so one goes: the failed
    // trial, not the oldest good root.
    let first = env.command("true", 0).unwrap().snapshot;
    assert_eq!(env.grub_reboot(), first);
    commit(&env.pool(), false).unwrap();
    let failed = env.command("true", 1).unwrap().snapshot;
    assert_eq!(env.grub_reboot(), failed);
    assert_eq!(env.grub_reboot(), first);
    assert_eq!(prune(&env.pool(), true).unwrap(), Vec::<String>::new());
    let third = env.command("true", 2).unwrap();
    assert_eq!(third.pruned, [failed.as_str()]);
    let third = third.snapshot;
    assert_eq!(env.grub_menu(), [third.as_str(), first.as_str(), R0]);
    assert_eq!(env.subvolumes(), [R0, first.as_str(), third.as_str()]);
    assert!(!env.top().join(format!(".slate/grub/{failed}")).exists());
    assert!(!env
        .top()
        .join(format!(".slate/manifests/{failed}.manifest"))
        .exists());
    assert_eq!(env.grub_reboot(), third);
    assert_eq!(
        commit(&env.pool(), false).unwrap().pruned,
        Vec::<String>::new()
    );
    // A fourth upgrade prunes the oldest that is neither running, the default nor the new one.
    let fourth = env.command("true", 3).unwrap();
    assert_eq!(fourth.pruned, [R0]);
    assert_eq!(
        env.grub_menu(),
        [fourth.snapshot.as_str(), third.as_str(), first.as_str()]
    );
    assert_eq!(
        env.grub_editenv("grub/grubenv"),
        [
            format!("saved_entry={third}"),
            format!("next_entry={}", fourth.snapshot)
        ]
    );
}
