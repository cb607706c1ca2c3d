//! `slate pull` hardened (issue 19), end to end through the built binary against Debian's
//! `docker-registry`: `--dry-run` writes nothing, `--gc` keeps the last pulls, `--ca-file`
//! trusts a registry's private CA (the registry served over TLS with a CA and certificate made
//! here by `slate_api::gen_certs`), and `slate verify` refuses a FIFO `index.json` at once
//! instead of hanging.

mod common;
#[path = "../../transport/tests/support/registry.rs"]
mod registry;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{s, slate};
use registry::TestRegistry;
use slate_bundle::{write_bundle, BlobInput, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE};

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "slate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn fails(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "slate succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn bundle(dir: &Path, version: &str, uki_byte: u8) {
    write_bundle(
        dir,
        BundleSpec {
            name: "demo",
            version,
            arch: "x86_64",
            variant: "generic",
        },
        &[
            BlobInput {
                role: slate_bundle::UKI_ROLE,
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: &vec![uki_byte; 200_000],
            },
            BlobInput {
                role: slate_bundle::INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: b"installer",
            },
        ],
    )
    .unwrap();
}

/// Every file under `dir` with its bytes, sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path.clone());
                out.push((path.display().to_string(), Vec::new()));
            } else {
                out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Push versions 1.0 and 2.0 of `slate/os` to the registry.
fn push_two(registry: &TestRegistry, work: &Path) {
    for (v, byte) in [("1.0", 1u8), ("2.0", 2)] {
        let dir = work.join(format!("bundle-{v}"));
        bundle(&dir, v, byte);
        let image = registry.image(&format!("slate/os:{v}"));
        ok(&slate(&["push", "--bundle", s(&dir), "--image", &image]));
    }
}

/// issue 19: `slate upgrade --image REF --dry-run` pulled 33 MB into the cache. `slate pull
/// --dry-run` resolves the image and writes nothing: a missing cache stays missing, an
/// existing one byte for byte as it was.
#[test]
fn pull_dry_run_writes_nothing() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    push_two(&registry, work.path());
    let image = registry.image("slate/os:2.0");
    let cache = work.path().join("cache");

    let out = ok(&slate(&[
        "pull",
        "--image",
        &image,
        "--cache",
        s(&cache),
        "--dry-run",
    ]));
    assert!(out.contains("dry run: nothing written"), "{out}");
    assert!(out.contains("bundle:    demo 2.0"), "{out}");
    assert!(out.contains("0 bytes already cached"), "{out}");
    assert!(!cache.exists(), "the dry run created {}", cache.display());

    ok(&slate(&[
        "pull",
        "--image",
        &registry.image("slate/os:1.0"),
        "--cache",
        s(&cache),
    ]));
    let before = tree(&cache);
    let out = ok(&slate(&[
        "pull",
        "--image",
        &image,
        "--cache",
        s(&cache),
        "--dry-run",
        "--output",
        "json",
    ]));
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["dry_run"], true);
    assert_eq!(value["version"], "2.0");
    assert_eq!(value["blobs"].as_array().unwrap().len(), 3);
    // The installer blob is shared with 1.0.
    assert_eq!(value["cached_bytes"], "installer".len());
    assert_eq!(tree(&cache), before, "the cache is byte for byte as it was");
}

/// `slate pull --gc --keep N`: the dry run lists what would go and changes nothing; the real
/// one removes it, and the kept image still verifies.
#[test]
fn pull_gc_keeps_the_last_pulls() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    push_two(&registry, work.path());
    let cache = work.path().join("cache");
    for v in ["1.0", "2.0"] {
        let image = registry.image(&format!("slate/os:{v}"));
        ok(&slate(&["pull", "--image", &image, "--cache", s(&cache)]));
    }
    let before = tree(&cache);
    let out = ok(&slate(&[
        "pull",
        "--gc",
        "--keep",
        "1",
        "--dry-run",
        "--cache",
        s(&cache),
    ]));
    assert!(out.contains("would remove image 1.0"), "{out}");
    assert!(out.contains("would remove blob sha256:"), "{out}");
    assert!(out.contains("kept 2.0"), "{out}");
    assert_eq!(tree(&cache), before, "a dry run changes nothing");

    let out = ok(&slate(&[
        "pull",
        "--gc",
        "--keep",
        "1",
        "--cache",
        s(&cache),
        "--output",
        "json",
    ]));
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["gc"]["removed_images"], serde_json::json!(["1.0"]));
    assert!(value["gc"]["freed_bytes"].as_u64().unwrap() >= 200_000);
    let bundle = slate_bundle::Bundle::open(&cache, Some("2.0")).unwrap();
    bundle.verify_blobs().unwrap();
    assert!(slate_bundle::Bundle::open(&cache, Some("1.0")).is_err());

    // --keep without --gc is a usage error; --image or --gc is needed.
    let err = fails(&slate(&["pull", "--keep", "1", "--cache", s(&cache)]));
    assert!(err.contains("--gc"), "{err}");
}

/// `--ca-file`: a registry whose certificate comes from a private CA is trusted with that CA's
/// certificate, and refused without it, with an error that says so.
#[test]
fn ca_file_trusts_a_private_registry_ca() {
    let ip = registry::non_loopback_ip();
    // A loopback registry is spoken to in plain HTTP: TLS needs another address of this
    // machine.
    if !slate_testkit::require(
        ip.is_some(),
        "an address of this machine that is not loopback",
        "a network interface with a default route",
    ) {
        return;
    }
    let ip = ip.unwrap().to_string();
    let work = tempfile::tempdir().unwrap();
    let certs = work.path().join("certs");
    slate_api::gen_certs(&certs, std::slice::from_ref(&ip)).unwrap();
    let Some(registry) = TestRegistry::start_tls(
        &ip,
        &certs.join(slate_api::SERVICE_CERT),
        &certs.join(slate_api::SERVICE_KEY),
    ) else {
        return;
    };
    let ca = certs.join(slate_api::CA_CERT);
    let dir = work.path().join("bundle");
    bundle(&dir, "1.0", 1);
    let image = registry.image("slate/os:1.0");
    assert!(!image.starts_with("127."), "{image}");

    ok(&slate(&[
        "push",
        "--bundle",
        s(&dir),
        "--image",
        &image,
        "--ca-file",
        s(&ca),
    ]));
    let cache = work.path().join("cache");
    let out = ok(&slate(&[
        "pull",
        "--image",
        &image,
        "--cache",
        s(&cache),
        "--ca-file",
        s(&ca),
    ]));
    assert!(out.contains("bundle:    demo 1.0"), "{out}");

    let err = fails(&slate(&[
        "pull",
        "--image",
        &image,
        "--cache",
        s(&work.path().join("cache2")),
    ]));
    assert!(
        err.contains("the registry's TLS certificate is not trusted"),
        "{err}"
    );
    assert!(err.contains("--ca-file"), "{err}");
    assert!(err.contains("UnknownIssuer"), "{err}");

    // Not a CA file: refused by name before anything is contacted.
    let err = fails(&slate(&[
        "pull",
        "--image",
        &image,
        "--cache",
        s(&work.path().join("cache3")),
        "--ca-file",
        s(&certs.join(slate_api::SERVICE_KEY)),
    ]));
    assert!(err.contains("not a PEM CA certificate file"), "{err}");
}

/// issue 19: a bundle whose `index.json` is a FIFO made `slate verify` hang; it is refused at
/// once, saying what the file is.
#[test]
fn verify_refuses_a_fifo_index_at_once() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("bundle");
    bundle(&dir, "1.0", 1);
    let keys = work.path().join("keys");
    ok(&slate(&["keygen", "--out", s(&keys)]));
    let index = dir.join("index.json");
    std::fs::remove_file(&index).unwrap();
    let made = Command::new("mkfifo").arg(&index).status().unwrap();
    assert!(made.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_slate"))
        .args([
            "verify",
            "--bundle",
            s(&dir),
            "--trusted-key",
            s(&keys.join("slate.pub")),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("slate verify still runs after 20 s: it waits on the FIFO");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("index.json: it is a FIFO (named pipe), not a regular file: refused"),
        "{err}"
    );
}

#[test]
fn upgrade_dry_run_from_a_registry_pulls_nothing() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    push_two(&registry, work.path());
    let pki = work.path().join("pki");
    ok(&slate(&["gen", "certs", "--out", s(&pki)]));
    let cache = work.path().join("cache");
    // No node listens there: a dry run resolves the image and contacts nothing else.
    let out = ok(&slate(&[
        "--node",
        "127.0.0.1:1",
        "--certs",
        s(&pki),
        "upgrade",
        "--image",
        &registry.image("slate/os:2.0"),
        "--cache",
        s(&cache),
        "--dry-run",
    ]));
    assert!(out.contains("would pull"), "{out}");
    assert!(out.contains("0 already in"), "{out}");
    assert!(out.contains("would upload demo 2.0 (sha256:"), "{out}");
    assert!(!cache.exists(), "the dry run created {}", cache.display());
}
