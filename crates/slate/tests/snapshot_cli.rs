//! `slate snapshot` at the CLI edge: arguments refused before anything runs, `install-units`
//! end to end, and a dry run naming what it would write. (The engine's steps on a real Btrfs
//! pool are `crates/snapshot-engine/tests`.)

use std::process::{Command, Output};

fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .output()
        .expect("run slate")
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    let out = slate(&["snapshot", "--esp-disk", "/nonexistent", "upgrade"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--command"));
    let out = slate(&["snapshot", "upgrade", "--command", "true", "--tree", "/x"]);
    assert!(!out.status.success());
    let out = slate(&["snapshot", "generate-manifest", "root-2026"]);
    assert!(!out.status.success());
    let out = slate(&["snapshot", "rollback", "--verify-on-rollback", "sometimes"]);
    assert!(!out.status.success());
}

#[test]
fn install_units_writes_into_the_root() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path().to_str().unwrap();
    let out = slate(&[
        "snapshot",
        "--root",
        r,
        "--esp-disk",
        "/dev/vda",
        "install-units",
        "--dry-run",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("would write"));
    assert!(!root.path().join("etc").exists());
    let out = slate(&[
        "snapshot",
        "--root",
        r,
        "--esp-disk",
        "/dev/vda",
        "install-units",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unit = std::fs::read_to_string(
        root.path()
            .join("etc/systemd/system/slate-snapshot-mark-good.service"),
    )
    .unwrap();
    assert!(
        unit.contains("snapshot --esp-disk /dev/vda commit"),
        "{unit}"
    );
    let out = slate(&[
        "snapshot",
        "--root",
        r,
        "--esp-disk",
        "/dev/my disk",
        "install-units",
    ]);
    assert!(!out.status.success());
}

#[test]
fn with_node_what_runs_only_on_the_machine_is_refused_before_any_certificate_is_read() {
    let nowhere = tempfile::tempdir().unwrap();
    let certs = nowhere.path().join("no-pki");
    for args in [
        &["upgrade", "--tree", "/srv/root"][..],
        &["commit"][..],
        &["prune", "--dry-run"][..],
    ] {
        let mut all = vec![
            "snapshot",
            "--node",
            "127.0.0.1:9",
            "--certs",
            certs.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        let out = slate(&all);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("runs `upgrade --command` and `list` only"),
            "{args:?}: {err}"
        );
    }
    // `list` does go on to the client, and says what is missing.
    let out = slate(&[
        "snapshot",
        "--node",
        "127.0.0.1:9",
        "--certs",
        certs.to_str().unwrap(),
        "list",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-pki"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
