//! `slate snapshot install-units`: the files and the enable link land in the root, and
//! systemd itself accepts the units (`systemd-analyze verify`).

use std::fs;

use slate_snapshot::units::{UnitsSpec, DEFAULT_HEALTH_CHECK, MARK_GOOD, ROLLBACK};

#[test]
fn install_units_writes_systemd_valid_units() {
    let root = tempfile::tempdir().unwrap();
    let spec = UnitsSpec {
        // An existing program, so systemd-analyze finds every ExecStart's binary.
        slate: "/bin/true".into(),
        esp_disk: "/dev/vda".into(),
        health_check: DEFAULT_HEALTH_CHECK.into(),
        timeout_secs: 120,
        watchdog_secs: 30,
    };
    let dry = slate_snapshot_engine::install_units(root.path(), &spec, true).unwrap();
    assert_eq!(dry.len(), 4);
    assert!(!dry[0].exists(), "a dry run writes nothing");
    let written = slate_snapshot_engine::install_units(root.path(), &spec, false).unwrap();
    let units = root.path().join("etc/systemd/system");
    assert!(units.join(MARK_GOOD).is_file() && units.join(ROLLBACK).is_file());
    assert_eq!(
        fs::read_link(units.join("multi-user.target.wants").join(MARK_GOOD)).unwrap(),
        std::path::Path::new("/etc/systemd/system").join(MARK_GOOD)
    );
    let dropin = fs::read_to_string(
        root.path()
            .join("etc/systemd/system.conf.d/50-slate-watchdog.conf"),
    )
    .unwrap();
    assert!(dropin.contains("RuntimeWatchdogSec=30s"));
    // Installing again replaces, never duplicates.
    assert_eq!(
        slate_snapshot_engine::install_units(root.path(), &spec, false).unwrap(),
        written
    );

    if !slate_testkit::require_tool("systemd-analyze") {
        return;
    }
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(units.join(MARK_GOOD))
        .arg(units.join(ROLLBACK))
        .env("SYSTEMD_UNIT_PATH", format!("{}:", units.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("slate-snapshot"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}
