//! Messages a person can act on (issue 44): what a refusal says names the real problem, once.

mod common;

use std::process::Output;

use common::{s, slate};

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// No part of the error's chain (`a: b: c`) is said twice.
fn said_once(err: &str) {
    let first = err.lines().next().unwrap_or("");
    let parts: Vec<&str> = first.split(": ").filter(|p| p.len() > 8).collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(!parts[i + 1..].contains(p), "{p:?} said twice in {err}");
    }
}

#[test]
fn configuring_a_plain_disk_says_it_is_not_a_slate_disk() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("plain.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../machine-config/tests/fixtures/node-v1.toml"
    );
    for dry in [false, true] {
        let mut args = vec![
            "installer",
            "configure",
            "--disk",
            s(&disk),
            "--config",
            config,
        ];
        if dry {
            args.push("--dry-run");
        }
        let err = failed(&slate(&args));
        assert!(
            err.contains(&format!("{} is not a slate disk", disk.display())),
            "{err}"
        );
        assert!(!err.contains("Btrfs"), "{err}");
        said_once(&err);
    }
    assert_eq!(std::fs::read(&disk).unwrap(), vec![0u8; 64 << 20]);
}

#[test]
fn a_profile_syntax_error_shows_its_snippet_once() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.toml");
    std::fs::write(&profile, "[os]\nname = \"x\"\nversion = \n").unwrap();
    let err = failed(&slate(&[
        "imager",
        "build",
        "--profile",
        s(&profile),
        "--output",
        "rootfs",
        "--out",
        s(&dir.path().join("out")),
        "--dry-run",
    ]));
    assert!(err.contains("not valid TOML for a slate profile"), "{err}");
    assert_eq!(err.matches("3 | version =").count(), 1, "{err}");
}

#[test]
fn a_failed_pull_says_why_once_and_leaves_no_cache_behind() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // Nothing listens on port 1: the connection is refused at once.
    let err = failed(&slate(&[
        "pull",
        "--image",
        "127.0.0.1:1/slate/os:1.0.0",
        "--cache",
        s(&cache),
    ]));
    assert!(err.contains("GET "), "{err}");
    said_once(&err);
    assert!(!cache.exists(), "the failed pull left {}", cache.display());
    // A cache that was there before stays.
    std::fs::create_dir(&cache).unwrap();
    failed(&slate(&[
        "pull",
        "--image",
        "127.0.0.1:1/slate/os:1.0.0",
        "--cache",
        s(&cache),
    ]));
    assert!(cache.is_dir());
}
