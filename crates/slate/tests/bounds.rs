//! issue 18, item 3: every number a user gives slate — profile, bundle settings, flags — is
//! bounded, and out of range it is refused naming what was wrong, before anything is written.
//! Each case here was once accepted: a profile whose size wrapped around into a 256 MiB image,
//! a menu timeout that waits forever, and `--tries 3000000000`, which wrote
//! `slate-2.0.0+3000000000.efi` — an entry systemd-boot reads as uncounted, never rolled back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use sha2::{Digest, Sha256};
use slate_bundle::{BundleSpec, InstallDefaults};

mod common;
use common::{ok, s, slate};

const DISK_MIB: u64 = 128;

fn disk_hash(path: &Path) -> Vec<u8> {
    Sha256::digest(fs::read(path).unwrap()).to_vec()
}

fn spec(version: &str) -> BundleSpec<'_> {
    BundleSpec {
        name: "slate",
        version,
        arch: "amd64",
        variant: "demo",
    }
}

/// A bundle of `version` (stand-in UKI and systemd-boot: the installer does not run them).
fn bundle(dir: &Path, version: &str) -> PathBuf {
    let uki = format!("MZ pretend UKI of {version}").repeat(1000);
    common::write_bundle(
        &dir.join(format!("bundle-{version}")),
        spec(version),
        uki.as_bytes(),
        b"MZ pretend systemd-boot",
    )
}

fn blank_disk(dir: &Path) -> PathBuf {
    let disk = dir.join("disk.raw");
    fs::File::create(&disk)
        .unwrap()
        .set_len(DISK_MIB << 20)
        .unwrap();
    disk
}

/// `out` failed, naming every one of `expected` on stderr.
fn refused(what: &str, out: &Output, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: accepted");
    for needle in expected {
        assert!(
            stderr.contains(needle),
            "{what}: {needle:?} not in {stderr}"
        );
    }
}

#[test]
fn installer_upgrade_refuses_tries_out_of_range_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v1 = bundle(dir.path(), "1.0.0");
    ok(&[
        "installer",
        "install",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v1),
        "--no-verify",
    ]);
    let v2 = bundle(dir.path(), "2.0.0");
    let upgrade = |tries: &str| {
        slate(&[
            "installer",
            "upgrade",
            "--disk",
            s(&disk),
            "--bundle",
            s(&v2),
            "--no-verify",
            &format!("--tries={tries}"),
        ])
    };
    let before = disk_hash(&disk);
    let out = upgrade("3000000000");
    refused(
        "--tries 3000000000",
        &out,
        &["--tries", "3000000000 boot-counting tries is not 1 to 15"],
    );
    for tries in ["0", "16", "2147483648", "99999999999", "-1"] {
        refused(&format!("--tries {tries}"), &upgrade(tries), &["--tries"]);
    }
    assert_eq!(disk_hash(&disk), before, "a refused upgrade wrote");

    // The bounds themselves are accepted.
    let out = ok(&[
        "installer",
        "upgrade",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v2),
        "--no-verify",
        "--tries",
        "15",
    ]);
    assert!(out.contains("installed slate-2.0.0+15.efi"), "{out}");
}

#[test]
fn upgrade_refuses_tries_out_of_range_before_contacting_the_node() {
    let dir = tempfile::tempdir().unwrap();
    // No node listens there and no certificates exist: the refusal must come first.
    let out = slate(&[
        "--node",
        "127.0.0.1:1",
        "--certs",
        s(&dir.path().join("no-pki")),
        "upgrade",
        "--image",
        "bundle:sha256:00",
        "--tries",
        "3000000000",
    ]);
    refused(
        "slate upgrade --tries 3000000000",
        &out,
        &["--tries", "3000000000 boot-counting tries is not 1 to 15"],
    );
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

#[test]
fn install_refuses_a_bundle_whose_settings_are_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    /// One setting changed to a value out of range.
    type Change = fn(&mut InstallDefaults);
    let cases: [(Change, &str); 3] = [
        (|d| d.tries = 3_000_000_000, "tries = 3000000000"),
        (|d| d.menu_timeout = u32::MAX, "menu_timeout = 4294967295"),
        // 2^44 + 256 MiB: in bytes this wrapped around to a 256 MiB ESP.
        (|d| d.esp_mib = (1 << 44) + 256, "esp_mib = 17592186044672"),
    ];
    let before = disk_hash(&disk);
    for (i, (change, expected)) in cases.into_iter().enumerate() {
        let mut defaults = common::TEST_INSTALL;
        change(&mut defaults);
        let out = common::write_bundle_with(
            &dir.path().join(format!("bundle-{i}")),
            spec("1.0.0"),
            defaults,
            b"MZ pretend UKI",
            b"MZ pretend systemd-boot",
        );
        let run = slate(&[
            "installer",
            "install",
            "--disk",
            s(&disk),
            "--bundle",
            s(&out),
            "--no-verify",
        ]);
        refused(expected, &run, &["the bundle's install settings", expected]);
    }
    assert_eq!(disk_hash(&disk), before, "a refused install wrote");
}

#[test]
fn imager_refuses_profile_numbers_out_of_range_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    // The inputs need not exist: the profile is refused before any is looked at.
    let base = r#"name = "slate"
version = "1.0.0"
arch = "amd64"
platform = "qemu"
[kernel]
image = "vmlinuz"
modules_dir = "modules"
[rootfs]
base = "rootfs"
[boot]
stub = "stub.efi"
systemd_boot = "sd.efi"
slate = "slate"
[image]
"#;
    let cases = [
        // 2^44 + 256 MiB is 2^64 + 256 MiB in bytes: it built a 256 MiB image.
        (
            "size_mib = 17592186044672",
            "image.size_mib: 17592186044672 MiB is not 1 to",
        ),
        (
            "esp_mib = 9223372036854775807",
            "image.esp_mib: 9223372036854775807 MiB is not 1 to",
        ),
        (
            "menu_timeout = 4294967295",
            "image.menu_timeout: 4294967295 seconds is not 0 to 600",
        ),
        (
            "tries = 3000000000",
            "image.tries: 3000000000 boot-counting tries is not 1 to 15",
        ),
    ];
    for (i, (line, expected)) in cases.into_iter().enumerate() {
        let profile = dir.path().join(format!("profile-{i}.toml"));
        fs::write(&profile, format!("{base}{line}\n")).unwrap();
        let out_path = dir.path().join(format!("image-{i}.raw"));
        let out = slate(&[
            "imager",
            "build",
            "--profile",
            s(&profile),
            "--output",
            "image",
            "--out",
            s(&out_path),
        ]);
        refused(line, &out, &[expected]);
        assert!(!out_path.exists(), "{line}: an image was written");
    }
}

#[test]
fn installer_rollback_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v1 = bundle(dir.path(), "1.0.0");
    ok(&[
        "installer",
        "install",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v1),
        "--no-verify",
    ]);
    let rollback = |extra: &[&str]| {
        let mut args = vec!["installer", "rollback", "--disk", s(&disk)];
        args.extend_from_slice(extra);
        slate(&args)
    };
    let before = disk_hash(&disk);
    refused("--tries 16", &rollback(&["--tries", "16"]), &["--tries"]);
    // One version only.
    refused(
        "a rollback with one version",
        &rollback(&[]),
        &["nothing to roll back to", "slate-1.0.0"],
    );
    assert_eq!(disk_hash(&disk), before, "a refused rollback wrote");
    // v2 installed offline and not booted yet: its upgrade is pending.
    let v2 = bundle(dir.path(), "2.0.0");
    ok(&[
        "installer",
        "upgrade",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v2),
        "--no-verify",
    ]);
    let before = disk_hash(&disk);
    for extra in [&[][..], &["--dry-run"][..]] {
        refused(
            "a rollback while an upgrade is pending",
            &rollback(extra),
            &["an upgrade is pending", "slate-1.0.0"],
        );
    }
    assert_eq!(disk_hash(&disk), before, "a refused rollback wrote");
}
