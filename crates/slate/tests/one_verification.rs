//! Issue 44, item 2: one verification for every reader of a bundle. `slate verify` passed a
//! re-signed bundle whose `dev.slate.chunk-digests` annotation was wrong, which `installer
//! upgrade` then refused; `installer upgrade` installed from a bundle whose installer blob was a
//! symbolic link, which `verify` refused. Each broken bundle of the table is given to `slate
//! verify`, `slate installer upgrade` (what the node runs, as the bundle's own installer) and
//! `slate installer install`: all three must refuse it for the same reason, and write nothing.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use slate_bundle::BundleSpec;

mod common;
use common::{ok, s, slate};

/// Above `CHUNKED_MIN` (16 MiB): the UKI's layer carries chunk digests.
const UKI_BYTES: usize = 17 << 20;

fn spec(version: &str) -> BundleSpec<'_> {
    BundleSpec {
        name: "slate",
        version,
        arch: "amd64",
        variant: "demo",
    }
}

fn bundle(dir: &Path, version: &str) -> PathBuf {
    let mut uki = format!("MZ pretend UKI of {version} ").into_bytes();
    uki.resize(UKI_BYTES, 0x5a);
    common::write_bundle(
        &dir.join(format!("bundle-{version}")),
        spec(version),
        &uki,
        b"MZ pretend systemd-boot",
    )
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn blob(b: &Path, digest: &str) -> PathBuf {
    b.join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// The image manifest's descriptor in index.json (the one that is not a signature).
fn image_manifest(b: &Path) -> (serde_json::Value, String) {
    let index = json(&b.join("index.json"));
    let digest = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| {
            !d["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap_or("")
                .ends_with(".sig")
        })
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    (json(&blob(b, &digest)), digest)
}

/// The blob of `role` named by the bundle manifest (the image's config).
fn role_digest(b: &Path, role: &str) -> String {
    let (image, _) = image_manifest(b);
    let config = json(&blob(b, image["config"]["digest"].as_str().unwrap()));
    config["blobs"][role]["digest"].as_str().unwrap().to_owned()
}

/// Replace the image manifest with `image` (written as a new blob, index.json pointed at it)
/// and sign the result again with the trusted key: a bundle its signer vouches for.
fn resign(b: &Path, image: &serde_json::Value, key: &Path) {
    let (_, old) = image_manifest(b);
    let bytes = serde_json::to_vec(image).unwrap();
    let digest = sha256(&bytes);
    fs::write(blob(b, &digest), &bytes).unwrap();
    let mut index = json(&b.join("index.json"));
    for d in index["manifests"].as_array_mut().unwrap() {
        if d["digest"] == old.as_str() {
            d["digest"] = digest.clone().into();
            d["size"] = bytes.len().into();
        }
    }
    fs::write(b.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    // Through the library: `slate sign` checks the blobs first and would refuse to.
    let bundle = slate_bundle::Bundle::open(b, None).unwrap();
    slate_trust::sign(&bundle, &slate_trust::read_private_key(key).unwrap()).unwrap();
}

/// A copy of `good` at `to` (blob files copied, so breaking one leaves `good` whole).
fn copy_bundle(good: &Path, to: &Path) -> PathBuf {
    let status = std::process::Command::new("cp")
        .args(["-a", s(good), s(to)])
        .status()
        .unwrap();
    assert!(status.success());
    to.to_owned()
}

fn hash_file(path: &Path) -> Vec<u8> {
    Sha256::digest(fs::read(path).unwrap()).to_vec()
}

#[test]
fn verify_and_both_installers_refuse_the_same_broken_bundles_for_the_same_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(&["keygen", "--out", s(&d.join("signer"))]);
    let (key, key_pub) = (d.join("signer/slate.key"), d.join("signer/slate.pub"));
    // The installers take a directory of keys; the private key stays out of it.
    let trusted = d.join("trusted");
    fs::create_dir(&trusted).unwrap();
    fs::copy(&key_pub, trusted.join("slate.pub")).unwrap();

    let v1 = bundle(d, "1.0.0");
    ok(&["sign", "--bundle", s(&v1), "--key", s(&key)]);
    let v2 = bundle(d, "2.0.0");
    ok(&["sign", "--bundle", s(&v2), "--key", s(&key)]);
    let disk = d.join("disk.raw");
    fs::File::create(&disk).unwrap().set_len(128 << 20).unwrap();
    ok(&[
        "installer",
        "install",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v1),
        "--trusted-keys",
        s(&trusted),
    ]);
    // The good v2 passes all three (install onto a scratch disk, dry run).
    ok(&["verify", "--bundle", s(&v2), "--trusted-key", s(&key_pub)]);
    let upgrade = |b: &Path| {
        slate(&[
            "installer",
            "upgrade",
            "--disk",
            s(&disk),
            "--bundle",
            s(b),
            "--trusted-keys",
            s(&trusted),
            "--dry-run",
        ])
    };
    let scratch = d.join("scratch.raw");
    fs::File::create(&scratch)
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    let install = |b: &Path| {
        slate(&[
            "installer",
            "install",
            "--disk",
            s(&scratch),
            "--bundle",
            s(b),
            "--trusted-keys",
            s(&trusted),
            "--dry-run",
        ])
    };
    assert!(upgrade(&v2).status.success());
    assert!(install(&v2).status.success());

    type Break = Box<dyn Fn(&Path)>;
    let uki = role_digest(&v2, "uki");
    let installer = role_digest(&v2, "installer");
    let systemd_boot = role_digest(&v2, "systemd-boot");
    let key2 = key.clone();
    let cases: Vec<(&str, Break, String)> = vec![
        (
            "a wrong chunk digest, re-signed",
            Box::new(move |b: &Path| {
                let (mut image, _) = image_manifest(b);
                let layer = image["layers"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|l| l["annotations"]["dev.slate.chunk-digests"].is_string())
                    .expect("the UKI's layer has chunk digests");
                let digests = layer["annotations"]["dev.slate.chunk-digests"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let mut parts: Vec<String> = digests.split(',').map(str::to_owned).collect();
                parts[1] = sha256(b"not this chunk");
                layer["annotations"]["dev.slate.chunk-digests"] = parts.join(",").into();
                resign(b, &image, &key2);
            }) as Break,
            "chunk 1 (bytes 8388608..16777216) does not match its digest".to_owned(),
        ),
        (
            "the installer blob a symbolic link",
            Box::new({
                let installer = installer.clone();
                move |b: &Path| {
                    let path = blob(b, &installer);
                    fs::remove_file(&path).unwrap();
                    std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
                }
            }),
            "it is a symbolic link, not a regular file: refused".to_owned(),
        ),
        (
            "a truncated UKI",
            Box::new({
                let uki = uki.clone();
                move |b: &Path| {
                    let f = fs::OpenOptions::new()
                        .write(true)
                        .open(blob(b, &uki))
                        .unwrap();
                    f.set_len((UKI_BYTES - 1) as u64).unwrap();
                }
            }),
            format!(
                "is {} bytes, its descriptor says {UKI_BYTES}",
                UKI_BYTES - 1
            ),
        ),
        (
            "a flipped byte in the installer blob",
            Box::new({
                let installer = installer.clone();
                move |b: &Path| {
                    let path = blob(b, &installer);
                    let mut bytes = fs::read(&path).unwrap();
                    bytes[0] ^= 1;
                    fs::write(&path, bytes).unwrap();
                }
            }),
            "the installer blob does not match its digest".to_owned(),
        ),
        (
            "the systemd-boot blob missing (upgrade never reads it)",
            Box::new(move |b: &Path| fs::remove_file(blob(b, &systemd_boot)).unwrap()),
            "No such file or directory".to_owned(),
        ),
    ];

    for (n, (name, break_it, reason)) in cases.iter().enumerate() {
        let b = copy_bundle(&v2, &d.join(format!("broken-{n}")));
        break_it(&b);
        let before = (hash_file(&disk), hash_file(&scratch));
        let verify = slate(&["verify", "--bundle", s(&b), "--trusted-key", s(&key_pub)]);
        for (who, out) in [
            ("verify", verify),
            ("installer upgrade", upgrade(&b)),
            ("installer install", install(&b)),
        ] {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{name}: {who} accepted it");
            assert!(
                stderr.contains(reason.as_str()),
                "{name}: {who} refused it otherwise: {stderr}"
            );
        }
        assert_eq!(
            (hash_file(&disk), hash_file(&scratch)),
            before,
            "{name}: a disk was written"
        );
    }
}
