//! A profile's `[trust] keys` reach the image as `/etc/slate/trusted-keys/<key id>.pub` (read
//! back with the real `unsquashfs` and loaded with `slate_trust::load_trusted_keys`), replacing
//! whatever the base rootfs had there; a key that does not parse stops the build before anything
//! is built.

mod common;

use std::fs;
use std::process::Command;

use slate_imager::{build_rootfs, ImagerError};
use slate_profile::image_contract::TRUSTED_KEYS_PATH as TRUSTED_KEYS_DIR;
use slate_trust::{load_trusted_keys, PrivateKey};

use common::BASE_PROFILE as BASE;

fn fixture(keys: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::write(root.join("bin/init"), "#!/bin/sh\n").unwrap();
    fs::create_dir_all(dir.path().join("keys")).unwrap();
    for seed in [1u8, 2] {
        let key = PrivateKey::from_scalar(&[seed; 32]).unwrap().public_key();
        fs::write(dir.path().join(format!("keys/k{seed}.pub")), key.to_pem()).unwrap();
    }
    fs::write(
        dir.path().join("profile.toml"),
        format!("{BASE}[trust]\nkeys = [{keys}]\n"),
    )
    .unwrap();
    dir
}

#[test]
fn the_profiles_keys_and_only_they_reach_the_image() {
    let dir = fixture(r#""keys/k2.pub", "keys/k1.pub", "keys/k2.pub""#);
    // A stale key in the base is not trusted by the image.
    let stale = dir.path().join("rootfs").join(TRUSTED_KEYS_DIR);
    fs::create_dir_all(&stale).unwrap();
    let old = PrivateKey::from_scalar(&[3; 32]).unwrap().public_key();
    fs::write(stale.join("old.pub"), old.to_pem()).unwrap();

    let inputs = common::resolve_rootfs(dir.path()).unwrap();
    assert_eq!(inputs.trusted_keys.len(), 2, "duplicates dropped");
    let image = dir.path().join("root.sqsh");
    fs::write(&image, build_rootfs(&inputs, &mut |_| {}).unwrap()).unwrap();
    let extract = dir.path().join("x");
    let out = Command::new("unsquashfs")
        .args(["-no-progress", "-d"])
        .arg(&extract)
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let keys = load_trusted_keys(&extract.join(TRUSTED_KEYS_DIR)).unwrap();
    let mut expected: Vec<_> = [1u8, 2]
        .map(|s| PrivateKey::from_scalar(&[s; 32]).unwrap().public_key().id())
        .into();
    expected.sort();
    assert_eq!(keys.iter().map(|k| k.id()).collect::<Vec<_>>(), expected);
    let mut names: Vec<String> = fs::read_dir(extract.join(TRUSTED_KEYS_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        expected
            .iter()
            .map(|id| format!("{}.pub", id.to_hex()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_key_that_does_not_parse_is_refused_before_anything_is_built() {
    let dir = fixture(r#""keys/k1.pub", "keys/bad.pub""#);
    fs::write(
        dir.path().join("keys/bad.pub"),
        "-----BEGIN PUBLIC KEY-----\nAAAA\n",
    )
    .unwrap();
    let err = common::resolve_rootfs(dir.path()).unwrap_err().to_string();
    assert!(err.starts_with("trust.keys: the public key "), "{err}");
    assert!(
        err.contains("bad.pub: not an SPKI PEM P-256 public key"),
        "{err}"
    );
    // A private key where a public one belongs is refused too, and so is a missing file.
    fs::write(
        dir.path().join("keys/bad.pub"),
        PrivateKey::from_scalar(&[1; 32]).unwrap().to_pem(),
    )
    .unwrap();
    assert!(common::resolve_rootfs(dir.path()).is_err());
    fs::remove_file(dir.path().join("keys/bad.pub")).unwrap();
    let err = common::resolve_rootfs(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            ImagerError::MissingInput {
                what: "the trusted key",
                ..
            }
        ),
        "{err}"
    );
}
