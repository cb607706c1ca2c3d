//! The documented vector (docs/formats.md §7.6) and the bad-input table.

use super::*;

fn key() -> PrivateKey {
    PrivateKey::from_scalar(&[1; 32]).unwrap()
}

fn manifest() -> ExtensionManifest {
    ExtensionManifest {
        name: "containerd".into(),
        version: "1.6.20-1".into(),
        image: "containerd-1.6.20-1.sqsh".into(),
        size: 16,
        digest: sha256_digest(b"pretend squashfs"),
    }
}

/// The vector of docs/formats.md §7.6: scalar 0x01 × 32, the image the 16 bytes
/// `pretend squashfs`.
const VECTOR: &str = include_str!("vector.ext");

#[test]
fn the_documented_vector() {
    let bytes = manifest().sign(&key()).unwrap();
    assert_eq!(String::from_utf8(bytes.clone()).unwrap(), VECTOR);
    let parsed = SignedExtension::parse(&bytes).unwrap();
    assert_eq!(parsed.manifest, manifest());
    assert_eq!(parsed.key_id, key().public_key().id().to_hex());
    assert_eq!(parsed.verify(&[key().public_key()]).unwrap(), &manifest());
    manifest().check_image(b"pretend squashfs").unwrap();
}

#[test]
fn a_changed_byte_or_another_key_is_refused() {
    let bytes = manifest().sign(&key()).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let altered = text.replace("1.6.20-1\n", "1.6.20-2\n");
    let err = SignedExtension::parse(altered.as_bytes())
        .unwrap()
        .verify(&[key().public_key()])
        .unwrap_err();
    assert!(matches!(err, ExtensionError::BadSignature { .. }), "{err}");
    let other = PrivateKey::from_scalar(&[2; 32]).unwrap().public_key();
    let err = SignedExtension::parse(text.as_bytes())
        .unwrap()
        .verify(&[other])
        .unwrap_err()
        .to_string();
    assert!(err.contains("not trusted"), "{err}");
    let err = SignedExtension::parse(text.as_bytes())
        .unwrap()
        .verify(&[])
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("(trusted: none)"), "{err}");
}

#[test]
fn an_image_of_another_size_or_content_is_refused() {
    let m = manifest();
    let err = m.check_image(b"pretend squashfs!").unwrap_err().to_string();
    assert!(err.contains("17 bytes, its manifest says 16"), "{err}");
    let err = m.check_image(b"pretend squashfz").unwrap_err().to_string();
    assert!(err.contains("has digest sha256:"), "{err}");
}

#[test]
fn bad_inputs_are_refused_naming_the_problem() {
    let good = String::from_utf8(manifest().sign(&key()).unwrap()).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "newline"),
        (good.trim_end().to_string(), "newline"),
        (
            good.replace("slate-extension 1", "slate-extension 2"),
            "line 1",
        ),
        (format!("{good}extra x\n"), "9 lines"),
        (
            good.replace("name containerd", "name Containerd"),
            "name \"Containerd\"",
        ),
        (good.replace("name containerd", "name -c"), "name \"-c\""),
        (
            good.replace("name containerd", "name  containerd"),
            "line 2",
        ),
        (good.replace("name containerd", "nam containerd"), "line 2"),
        (
            good.replace("version 1.6.20-1", "version 1.6/20"),
            "version",
        ),
        (good.replace("version 1.6.20-1", "version "), "line 3"),
        (
            good.replace("containerd-1.6.20-1.sqsh", "../x.sqsh"),
            "image",
        ),
        (good.replace("containerd-1.6.20-1.sqsh", "c.img"), "image"),
        (good.replace("size 16", "size 016"), "leading zeros"),
        (good.replace("size 16", "size -1"), "size"),
        (
            good.replace("size 16", "size 99999999999999999999"),
            "out of range",
        ),
        (good.replace("digest sha256:", "digest sha512:"), "digest"),
        (good.replace("digest sha256:", "digest SHA256:"), "digest"),
        (good.replace("\nkey ", "\nkey X"), "key"),
        (good.replace("\nsignature ", "\nsignature !"), "base64"),
        (good.replace('\n', "\r\n"), "line"),
        (format!("{}\n", "x".repeat(5000)), "more than 4096"),
    ];
    for (input, expected) in cases {
        let err = SignedExtension::parse(input.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(expected),
            "{input:?}: {err} (wanted {expected:?})"
        );
    }
    let err = SignedExtension::parse(&[0xff, b'\n'])
        .unwrap_err()
        .to_string();
    assert!(err.contains("UTF-8"), "{err}");
}

#[test]
fn names_and_versions() {
    for good in ["containerd", "a", "0x", "my_ext-2"] {
        assert!(valid_extension_name(good), "{good}");
    }
    for bad in ["", "-a", "_a", "A", "a.b", "a b", &"a".repeat(65)] {
        assert!(!valid_extension_name(bad), "{bad}");
    }
    for good in ["1", "1.6.20-1", "2~rc1", "1+b2^x_y"] {
        assert!(valid_extension_version(good), "{good}");
    }
    for bad in ["", "1 2", "1/2", "1:2", &"1".repeat(65)] {
        assert!(!valid_extension_version(bad), "{bad}");
    }
}
