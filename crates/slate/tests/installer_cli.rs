//! `slate installer install|upgrade` end to end on disk image files: a blank disk installed
//! from a bundle, then upgraded; and every refusal — not blank, not slate's, unsigned, untrusted,
//! tampered, wrong arch or variant, downgrade, below the version floor — leaves the disk
//! bit-identical (compared by SHA-256).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};
use slate_bundle::BundleSpec;

mod common;
use common::{ok, s, slate};

const DISK_MIB: u64 = 128;

fn disk_hash(path: &Path) -> Vec<u8> {
    Sha256::digest(fs::read(path).unwrap()).to_vec()
}

/// A bundle of `version` (fake UKI and systemd-boot bytes: the installer does not execute
/// them), `arch`/`variant` as given.
fn bundle(dir: &Path, version: &str, arch: &str, variant: &str) -> PathBuf {
    let out = dir.join(format!("bundle-{version}-{arch}-{variant}"));
    let uki = format!("MZ pretend UKI of {version}").repeat(1000);
    common::write_bundle(
        &out,
        BundleSpec {
            name: "slate",
            version,
            arch,
            variant,
        },
        uki.as_bytes(),
        b"MZ pretend systemd-boot",
    )
}

struct Fixture {
    dir: tempfile::TempDir,
    keys: PathBuf,
    disk: PathBuf,
}

impl Fixture {
    /// Keys, and a disk with v1.0.0 installed from a signed bundle.
    fn installed() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        ok(&["keygen", "--out", s(&keys)]);
        let disk = dir.path().join("disk.raw");
        fs::File::create(&disk)
            .unwrap()
            .set_len(DISK_MIB << 20)
            .unwrap();
        let fx = Fixture { dir, keys, disk };
        let v1 = fx.signed("1.0.0", "amd64", "demo");
        let out = fx.install(&v1, &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        fx
    }

    fn signed(&self, version: &str, arch: &str, variant: &str) -> PathBuf {
        let b = bundle(self.dir.path(), version, arch, variant);
        ok(&[
            "sign",
            "--bundle",
            s(&b),
            "--key",
            s(&self.keys.join("slate.key")),
        ]);
        b
    }

    fn install(&self, bundle: &Path, extra: &[&str]) -> Output {
        let mut args = vec!["installer", "install", "--disk", s(&self.disk), "--bundle"];
        args.push(s(bundle));
        args.extend(["--trusted-keys", s(&self.keys)]);
        args.extend(extra);
        slate(&args)
    }

    fn upgrade(&self, bundle: &Path, extra: &[&str]) -> Output {
        let mut args = vec!["installer", "upgrade", "--disk", s(&self.disk), "--bundle"];
        args.push(s(bundle));
        args.extend(["--trusted-keys", s(&self.keys)]);
        args.extend(extra);
        slate(&args)
    }

    /// `run` must fail naming `expected`, and the disk must not change.
    fn refused(&self, what: &str, expected: &str, run: impl FnOnce() -> Output) {
        let before = disk_hash(&self.disk);
        let out = run();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(stderr.contains(expected), "{what}: {stderr}");
        assert_eq!(disk_hash(&self.disk), before, "{what}: the disk changed");
    }
}

#[test]
fn a_blank_disk_is_installed_then_upgraded() {
    let fx = Fixture::installed();
    let listing = ok(&["meta", "list", "--disk", s(&fx.disk)]);
    assert!(!listing.contains("Upgrade"), "{listing}");
    let v2 = fx.signed("2.0.0", "amd64", "demo");
    let before = disk_hash(&fx.disk);
    let plan = fx.upgrade(&v2, &["--dry-run"]);
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.contains("would upgrade")
            && plan.contains("slate-1.0.0+3.efi to slate 2.0.0")
            && plan.contains("keeping at most 2 versions)\n"),
        "{plan}"
    );
    assert_eq!(disk_hash(&fx.disk), before, "--dry-run wrote");
    let out = fx.upgrade(&v2, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("signed by key"), "{stdout}");
    assert!(
        stdout.contains("installed slate-2.0.0+3.efi (fallback slate-1.0.0+3.efi)"),
        "{stdout}"
    );
    assert_eq!(
        ok(&["meta", "get", "Upgrade", "--disk", s(&fx.disk)]).trim(),
        "slate-1.0.0+3.efi"
    );
}

#[test]
fn install_refuses_a_disk_in_use_unless_forced() {
    let fx = Fixture::installed();
    let v1 = fx.signed("1.0.0", "amd64", "demo");
    fx.refused("install over an installed disk", "is not blank", || {
        fx.install(&v1, &[])
    });
    let out = fx.install(&v1, &["--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("--force: wiping it"));
}

#[test]
fn bad_bundles_and_foreign_disks_are_refused_before_any_write() {
    let fx = Fixture::installed();
    let dir = fx.dir.path();

    let unsigned = bundle(dir, "2.0.1", "amd64", "demo");
    fx.refused("unsigned", "the bundle is not signed", || {
        fx.upgrade(&unsigned, &[])
    });

    let other_keys = dir.join("other-keys");
    ok(&["keygen", "--out", s(&other_keys)]);
    let foreign = bundle(dir, "2.0.2", "amd64", "demo");
    ok(&[
        "sign",
        "--bundle",
        s(&foreign),
        "--key",
        s(&other_keys.join("slate.key")),
    ]);
    fx.refused("untrusted key", "which is not trusted", || {
        fx.upgrade(&foreign, &[])
    });

    let tampered = fx.signed("2.0.3", "amd64", "demo");
    flip_a_bit_of_the_largest_blob(&tampered, |_| 10);
    fx.refused("tampered blob", "does not match its digest", || {
        fx.upgrade(&tampered, &[])
    });

    let arm = fx.signed("2.0.4", "arm64", "demo");
    fx.refused("wrong arch", "arm64", || fx.upgrade(&arm, &[]));

    let variant = fx.signed("2.0.5", "amd64", "other");
    fx.refused("wrong variant", "other", || {
        fx.upgrade(&variant, &["--variant", "demo"])
    });

    let older = fx.signed("0.9.0", "amd64", "demo");
    fx.refused("downgrade", "0.9.0", || fx.upgrade(&older, &[]));
    ok(&[
        "meta",
        "set",
        "VersionFloor",
        "0.9.5",
        "--disk",
        s(&fx.disk),
    ]);
    fx.refused("below the version floor", "0.9.5", || {
        fx.upgrade(&older, &["--allow-downgrade"])
    });

    let not_slate = dir.join("foreign.raw");
    fs::write(&not_slate, vec![0x5a; 8 << 20]).unwrap();
    let v2 = fx.signed("2.0.0", "amd64", "demo");
    let before = disk_hash(&not_slate);
    let out = slate(&[
        "installer",
        "upgrade",
        "--disk",
        s(&not_slate),
        "--bundle",
        s(&v2),
        "--trusted-keys",
        s(&fx.keys),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reading the boot entries"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(disk_hash(&not_slate), before);
}

/// A UKI large enough to be mapped from its blob file instead of read (16 MiB and up, the
/// file private to the caller) and to carry chunk digests: upgraded to, and refused with the
/// disk unchanged when one byte in its middle is flipped.
#[test]
fn a_large_uki_is_upgraded_to_and_refused_when_tampered() {
    let fx = Fixture::installed();
    let large = |version: &str| {
        let mut uki = b"MZ".to_vec();
        uki.extend((0..17u32 << 20).map(|i| (i ^ (i >> 13)) as u8));
        let out = common::write_bundle(
            &fx.dir.path().join(format!("large-{version}")),
            BundleSpec {
                name: "slate",
                version,
                arch: "amd64",
                variant: "demo",
            },
            &uki,
            b"MZ pretend systemd-boot",
        );
        ok(&[
            "sign",
            "--bundle",
            s(&out),
            "--key",
            s(&fx.keys.join("slate.key")),
        ]);
        out
    };
    let good = large("2.0.0");
    let out = fx.upgrade(&good, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("installed slate-2.0.0+3.efi"), "{stdout}");

    // 17 MiB carries chunk digests (8 MiB chunks, checked on every core): the flipped byte in
    // the middle is found in chunk 1.
    let tampered = large("3.0.0");
    flip_a_bit_of_the_largest_blob(&tampered, |len| len / 2);
    fx.refused(
        "tampered large blob",
        "chunk 1 (bytes 8388608..16777216) does not match its digest",
        || fx.upgrade(&tampered, &[]),
    );
}

/// Flips one bit, at `at(length)`, of the bundle's largest blob (its UKI).
fn flip_a_bit_of_the_largest_blob(bundle: &Path, at: impl Fn(usize) -> usize) {
    let uki = fs::read_dir(bundle.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = fs::read(&uki).unwrap();
    let offset = at(bytes.len());
    bytes[offset] ^= 1;
    fs::write(&uki, bytes).unwrap();
}

/// `slate gen config`'s document with `from` replaced by `to`.
fn edited_config(config: &str, from: &str, to: &str) -> String {
    assert!(
        config.contains(from),
        "{from:?} not in the generated config"
    );
    config.replacen(from, to, 1)
}

/// The bytes of the file `path` inside the ext4 filesystem of STATE on `disk` (`debugfs`).
fn state_file(dir: &Path, disk: &Path, path: &str) -> String {
    let mut file = slate_disk::FileDisk::open_read_only(disk).unwrap();
    let state = slate_layout::find_partition(&mut file, "STATE").unwrap();
    let image = dir.join("state.ext4");
    let bytes = fs::read(disk).unwrap();
    fs::write(
        &image,
        &bytes[state.start as usize..(state.start + state.len) as usize],
    )
    .unwrap();
    let out = Command::new("debugfs")
        .args(["-R", &format!("cat {path}")])
        .arg(&image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_machine_configuration_goes_to_state_and_bad_ones_are_refused_before_any_write() {
    // mke2fs makes STATE's filesystem; debugfs reads it back.
    if !slate_testkit::require_tool("mke2fs") || !slate_testkit::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    ok(&["gen", "certs", "--out", s(&pki)]);
    let config = ok(&["gen", "config", "--name", "node1", "--pki", s(&pki)]);
    let other = dir.path().join("other");
    ok(&["gen", "certs", "--out", s(&other)]);
    let other_key = fs::read_to_string(other.join("ca.key")).unwrap();
    let own_key = slate_machine_config::parse(&config)
        .unwrap()
        .config
        .api
        .ca_key;
    // The shape `slate gen certs` made before issue 36: the node's CA is the client CA.
    let shared = {
        let mut c = slate_machine_config::parse(&config).unwrap().config;
        c.api.ca_cert = fs::read_to_string(pki.join("client-ca.crt")).unwrap();
        c.api.ca_key = fs::read_to_string(pki.join("client-ca.key")).unwrap();
        c.api.fleet_ca = None;
        c.to_toml()
    };
    let keys = dir.path().join("keys");
    ok(&["keygen", "--out", s(&keys)]);
    let v1 = bundle(dir.path(), "1.0.0", "amd64", "demo");
    ok(&[
        "sign",
        "--bundle",
        s(&v1),
        "--key",
        s(&keys.join("slate.key")),
    ]);
    let disk = dir.path().join("disk.raw");
    fs::File::create(&disk)
        .unwrap()
        .set_len(DISK_MIB << 20)
        .unwrap();

    let bad: &[(&str, String, &str)] = &[
        (
            "an unknown key",
            edited_config(&config, "[node]\n", "[node]\nnmae = \"x\"\n"),
            "node.nmae",
        ),
        (
            "a CA key that is not the CA's",
            edited_config(&config, own_key.trim(), other_key.trim()),
            "api.ca_key: is not the key of api.ca_cert",
        ),
        (
            "a CA key that signs client certificates (a shared CA)",
            shared,
            "no node may hold a key that signs for others (api.ca_key is the key of \
             api.client_ca's certificate 1",
        ),
        (
            "a wrong version",
            edited_config(&config, "version = 1", "version = 2"),
            "version: 2 is not a version this slate reads",
        ),
        (
            "a hostname that is not one",
            edited_config(
                &config,
                "name = \"node1\"",
                "name = \"node1\"\nhostname = \"no_way!\"",
            ),
            "node.hostname",
        ),
        (
            "a window that does not parse",
            format!(
                "{}\n[[update.windows]]\ndays = [\"mon\"]\nstart = \"7pm\"\nlength = \"1h\"\n",
                config
            ),
            "update.windows[0].start",
        ),
    ];
    let blank = disk_hash(&disk);
    let bad_file = dir.path().join("bad.toml");
    for (what, text, field) in bad {
        fs::write(&bad_file, text).unwrap();
        let out = slate(&[
            "installer",
            "install",
            "--disk",
            s(&disk),
            "--bundle",
            s(&v1),
            "--trusted-keys",
            s(&keys),
            "--config",
            s(&bad_file),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: installed");
        assert!(
            err.contains(field),
            "{what}: the error names {field:?}: {err}"
        );
        assert_eq!(disk_hash(&disk), blank, "{what}: the disk changed");
        let out = slate(&["config", "validate", s(&bad_file)]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains(field));
    }

    // A good one lands on STATE, readable by e2fsprogs.
    let good = dir.path().join("node1.toml");
    fs::write(&good, &config).unwrap();
    ok(&[
        "installer",
        "install",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v1),
        "--trusted-keys",
        s(&keys),
        "--config",
        s(&good),
    ]);
    assert_eq!(
        state_file(dir.path(), &disk, "/config/machine.toml"),
        config
    );
    // Configuring again would destroy the node's key and /etc: refused without --force.
    let installed = disk_hash(&disk);
    let out = slate(&[
        "installer",
        "configure",
        "--disk",
        s(&disk),
        "--config",
        s(&good),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(disk_hash(&disk), installed);
    let renamed = dir.path().join("node2.toml");
    fs::write(
        &renamed,
        ok(&["gen", "config", "--name", "node2", "--pki", s(&pki)]),
    )
    .unwrap();
    ok(&[
        "installer",
        "configure",
        "--disk",
        s(&disk),
        "--config",
        s(&renamed),
        "--force",
    ]);
    assert!(state_file(dir.path(), &disk, "/config/machine.toml").contains("name = \"node2\""));
}
