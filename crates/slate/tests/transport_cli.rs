//! `slate push` and `slate pull` end to end: through local layouts, and through a real registry
//! (Debian's docker-registry, started by the transport tests' harness).

#[path = "../../transport/tests/support/registry.rs"]
mod registry;

use std::path::Path;
use std::process::{Command, Output};

use slate_bundle::{
    write_bundle, BlobInput, Bundle, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};

fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .env_remove("SLATE_REGISTRY_USERNAME")
        .output()
        .expect("run slate")
}

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

fn bundle(dir: &Path, version: &str) {
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
                bytes: &vec![0x5a; 200_000],
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

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn push_and_pull_through_layouts() {
    let work = tempfile::tempdir().unwrap();
    let (src, dest, cache) = (
        work.path().join("src"),
        work.path().join("dest"),
        work.path().join("cache"),
    );
    bundle(&src, "2.0.0");
    let (src_s, dest_s, cache_s) = (
        src.to_str().unwrap(),
        dest.to_str().unwrap(),
        cache.to_str().unwrap(),
    );

    let out = ok(&slate(&[
        "push",
        "--bundle",
        src_s,
        "--image",
        &format!("oci-layout:{dest_s}"),
        "--dry-run",
    ]));
    assert!(out.contains("would push 2.0.0 (sha256:"), "{out}");
    assert!(out.contains("3 blobs"), "{out}");
    assert!(!dest.exists(), "a dry run writes nothing");

    let out = ok(&slate(&[
        "push",
        "--bundle",
        src_s,
        "--image",
        &format!("oci-layout:{dest_s}"),
    ]));
    assert!(
        out.contains(&format!("pushed oci-layout:{dest_s}:2.0.0")),
        "{out}"
    );

    let out = ok(&slate(&[
        "pull",
        "--image",
        &format!("oci-layout:{dest_s}:2.0.0"),
        "--cache",
        cache_s,
        "--output",
        "json",
    ]));
    let pulled = json(&out);
    assert_eq!(pulled["layout"], cache_s);
    assert_eq!(pulled["tag"], "2.0.0");
    assert_eq!(pulled["version"], "2.0.0");
    assert_eq!(pulled["signature_tag"], serde_json::Value::Null);
    let opened = Bundle::open(&cache, Some("2.0.0")).unwrap();
    assert_eq!(pulled["digest"], opened.manifest_digest());
}

#[test]
fn push_and_pull_through_a_registry() {
    let Some(registry) = registry::TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (src, cache) = (work.path().join("src"), work.path().join("cache"));
    bundle(&src, "2.0.0");
    let image = registry.image("slate/installer:2.0.0");
    let out = ok(&slate(&[
        "push",
        "--bundle",
        src.to_str().unwrap(),
        "--image",
        &image,
    ]));
    assert!(out.contains(&format!("pushed {image}")), "{out}");

    let pull = |output: &str| {
        ok(&slate(&[
            "pull",
            "--image",
            &image,
            "--cache",
            cache.to_str().unwrap(),
            "--output",
            output,
        ]))
    };
    let first = json(&pull("json"));
    assert_eq!(first["version"], "2.0.0");
    assert!(first["fetched_bytes"].as_u64().unwrap() > 200_000);
    let text = pull("text");
    assert!(
        text.contains(&format!("layout:    {}", cache.display())),
        "{text}"
    );
    assert!(text.contains(first["digest"].as_str().unwrap()), "{text}");
    assert!(text.contains("fetched:   0 bytes"), "{text}");

    let out = ok(&slate(&[
        "push",
        "--bundle",
        cache.to_str().unwrap(),
        "--image",
        &registry.image("slate/installer"),
    ]));
    assert!(out.contains("0 bytes sent"), "{out}");
}

#[test]
fn bad_references_are_refused_before_anything_happens() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let err = fails(&slate(&[
        "pull",
        "--image",
        "os:1.0",
        "--cache",
        cache.to_str().unwrap(),
    ]));
    assert!(err.contains("no registry host"), "{err}");
    let err = fails(&slate(&[
        "pull",
        "--image",
        "https://r.example/os:1",
        "--cache",
        cache.to_str().unwrap(),
    ]));
    assert!(err.contains("drop the `https://`"), "{err}");
    assert!(!cache.exists());
}
