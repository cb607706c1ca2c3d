//! Integrity manifests and rollback on a real Btrfs pool: `verify` catches a changed file under
//! /usr, `generate-manifest` re-stamps, a manifest with a wrong HMAC is refused, and `rollback`
//! under each `--verify-on-rollback` policy.

mod common;

use std::fs;

use common::*;
use slate_snapshot::SnapshotName;
use slate_snapshot_engine::{rollback, verify, VerifyPolicy};

const R1: &str = "root-20260102-000000";
const R2: &str = "root-20260102-010000";

/// R0 → R1 (booted, committed) → R2 (booted, committed): R2 runs, R1 is the rollback target.
fn two_upgrades() -> Env {
    let env = Env::new();
    for hour in 0..2 {
        let r = env
            .command(&format!("echo {hour} > /usr/share/doc/version"), hour)
            .unwrap();
        env.reboot();
        slate_snapshot_engine::commit(&env.pool(), false).unwrap();
        assert_eq!(
            env.pool()
                .running
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some(&*r.snapshot)
        );
    }
    env
}

fn result_of(env: &Env, snap: &str) -> (String, Vec<String>) {
    let out = verify(&env.pool(), Some(&SnapshotName::parse(snap).unwrap())).unwrap();
    (out[0].result.clone(), out[0].detail.clone())
}

#[test]
fn verify_catches_a_changed_file_and_generate_manifest_restamps() {
    if !available() {
        return;
    }
    let env = two_upgrades();
    assert_eq!(result_of(&env, R1).0, "verified");
    assert_eq!(result_of(&env, R0).0, "no-manifest");
    fs::write(env.top().join(R1).join("usr/bin/hello"), "tampered\n").unwrap();
    let (result, detail) = result_of(&env, R1);
    assert_eq!(result, "mismatch");
    assert_eq!(detail, ["changed: /usr/bin/hello"]);
    // Every snapshot but the running root.
    let all = verify(&env.pool(), None).unwrap();
    let names: Vec<&str> = all.iter().map(|o| o.snapshot.as_str()).collect();
    assert_eq!(names, [R0, R1]);
    // Re-stamped after an intended change, it verifies again.
    let n = slate_snapshot_engine::generate_manifest(
        &env.pool(),
        &SnapshotName::parse(R1).unwrap(),
        false,
    )
    .unwrap();
    assert!(n > 10);
    assert_eq!(result_of(&env, R1).0, "verified");
    // A changed ESP copy is caught too.
    let disk_path = env.esp.clone();
    {
        let mut disk = slate_disk::FileDisk::open(&disk_path).unwrap();
        let parts = slate_layout::partitions(&mut disk).unwrap();
        let view = slate_disk::PartitionView::new(&mut disk, parts[0].start, parts[0].len).unwrap();
        let fs = slate_esp::fat::mount(view, 0).unwrap();
        slate_esp::fat::write_file_atomically(&fs, &format!("slate/{R1}/vmlinuz"), b"evil")
            .unwrap();
        slate_esp::fat::unmount(fs).unwrap();
    }
    assert_eq!(
        result_of(&env, R1).1,
        [format!("changed: ESP:/slate/{R1}/vmlinuz")]
    );
}

#[test]
fn a_manifest_with_a_wrong_hmac_is_refused() {
    if !available() {
        return;
    }
    let env = two_upgrades();
    let path = env.top().join(format!(".slate/manifests/{R1}.manifest"));
    let text = fs::read_to_string(&path).unwrap();
    // Forge: drop a record (hiding a file) and keep the old tag.
    let forged: String = text
        .lines()
        .filter(|l| !l.ends_with(" usr/bin/hello"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(forged, text);
    fs::write(&path, forged).unwrap();
    let (result, detail) = result_of(&env, R1);
    assert_eq!(result, "bad-manifest");
    assert!(detail[0].contains("HMAC"), "{detail:?}");
    // A key other than the pool's does not verify it either.
    fs::write(&path, &text).unwrap();
    assert_eq!(result_of(&env, R1).0, "verified");
    fs::write(env.top().join(".slate/manifest.key"), [9u8; 32]).unwrap();
    assert_eq!(result_of(&env, R1).0, "bad-manifest");
}

#[test]
fn rollback_under_each_policy() {
    if !available() {
        return;
    }
    let env = two_upgrades();
    fs::write(env.top().join(R1).join("usr/bin/hello"), "tampered\n").unwrap();

    // strict: R1 does not verify and R0 has no entry: refused before any write.
    let before = env.entries();
    let err = rollback(&env.pool(), VerifyPolicy::Strict, false).unwrap_err();
    assert!(err.to_string().contains("no candidate verifies"), "{err}");
    assert_eq!(env.entries(), before);

    // warn: rolls back, loudly.
    let out = rollback(&env.pool(), VerifyPolicy::Warn, true).unwrap();
    let (target, notes, to, from) = (out.target, out.notes, out.to_entry, out.from_entry);
    assert_eq!(target, R1);
    assert!(notes[0].starts_with("SLATE-VERIFY-WARN"), "{notes:?}");
    assert_eq!(
        (to.as_str(), from.as_str()),
        (&*format!("{R1}+3.conf"), &*format!("{R2}+0.conf"))
    );
    assert_eq!(env.entries(), before, "a dry run writes nothing");

    // off: no verification at all.
    let notes = rollback(&env.pool(), VerifyPolicy::Off, true)
        .unwrap()
        .notes;
    assert!(notes[0].contains("not verified"), "{notes:?}");

    // strict, once R1 is re-stamped: accepted, and R1 boots next on trial.
    slate_snapshot_engine::generate_manifest(&env.pool(), &SnapshotName::parse(R1).unwrap(), false)
        .unwrap();
    let out = rollback(&env.pool(), VerifyPolicy::Strict, false).unwrap();
    let (target, notes) = (out.target, out.notes);
    assert_eq!(target, R1);
    assert!(notes[0].contains("verified"), "{notes:?}");
    assert_eq!(env.next_boot().as_deref(), Some(&*format!("{R1}+3.conf")));
    assert_eq!(env.reboot(), format!("{R1}+2-1.conf"));

    // warn with a real write from R1 when R0 has no entry: nothing older to go to.
    let err = rollback(&env.pool(), VerifyPolicy::Warn, false).unwrap_err();
    assert!(err.to_string().contains("no older snapshot"), "{err}");
}
