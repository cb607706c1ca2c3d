//! Signing and verifying real PE files (systemd-boot, a UKI), with sbsigntool as the
//! independent judge: what slate signs, `sbverify` accepts; what `sbsign` signs, slate accepts.

use std::path::Path;
use std::process::Command;

use slate_secureboot::{sign_pe, verify_pe, SigningKey, TrustedCerts, VerifyError};
use slate_testkit::secureboot::{db_key, TestKey};
use slate_testkit::{require_path, require_tool};

const SYSTEMD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

fn signing_key(k: &TestKey) -> SigningKey {
    SigningKey::from_pem(&k.key_pem(), &k.cert_pem()).unwrap()
}

fn trusted(k: &TestKey) -> TrustedCerts {
    TrustedCerts::from_pem(&k.cert_pem()).unwrap()
}

fn sbverify(cert: &Path, image: &Path) -> (bool, String) {
    let out = Command::new("sbverify")
        .arg("--cert")
        .arg(cert)
        .arg(image)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A small UKI: the stub with an .osrel, a .cmdline and a fake kernel.
fn uki() -> Vec<u8> {
    let stub = std::fs::read(STUB).unwrap();
    slate_uki::UkiBuilder::new(&stub)
        .osrel("ID=slate\nVERSION_ID=1.0.0\n")
        .cmdline("console=ttyS0")
        .linux(vec![0x4d; 100_000])
        .build()
        .unwrap()
}

fn setup() -> Option<(tempfile::TempDir, TestKey, TestKey)> {
    if !require_tool("sbverify") || !require_path(SYSTEMD_BOOT, "apt-get install systemd-boot-efi")
    {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = db_key(dir.path(), "slate test db")?;
    let other = db_key(dir.path(), "someone else")?;
    Some((dir, db, other))
}

#[test]
fn slate_signs_what_sbverify_accepts_and_the_same_bytes_every_time() {
    let Some((dir, db, other)) = setup() else {
        return;
    };
    let key = signing_key(&db);
    for (name, image) in [
        ("systemd-boot", std::fs::read(SYSTEMD_BOOT).unwrap()),
        ("uki", uki()),
    ] {
        let signed = sign_pe(&image, &key).unwrap();
        assert_eq!(
            signed,
            sign_pe(&image, &key).unwrap(),
            "{name}: reproducible"
        );
        assert!(
            slate_uki::verify_checksum(&signed).unwrap(),
            "{name}: checksum"
        );
        let path = dir.path().join(format!("{name}.signed.efi"));
        std::fs::write(&path, &signed).unwrap();
        let (ok, out) = sbverify(&db.cert, &path);
        assert!(ok, "{name}: sbverify refused slate's signature: {out}");
        assert!(out.contains("Signature verification OK"), "{out}");
        let (ok, _) = sbverify(&other.cert, &path);
        assert!(!ok, "{name}: sbverify accepted another key's certificate");

        let signer = verify_pe(&signed, &trusted(&db)).unwrap();
        assert_eq!(signer.subject, "CN=slate test db");
        assert!(matches!(
            verify_pe(&signed, &trusted(&other)),
            Err(VerifyError::NotTrusted { .. })
        ));
        assert_eq!(
            verify_pe(&image, &trusted(&db)),
            Err(VerifyError::NotSigned)
        );
        assert!(sign_pe(&signed, &key).is_err(), "{name}: signed twice");
    }
}

#[test]
fn one_flipped_byte_anywhere_signed_is_refused_by_slate_and_sbverify() {
    let Some((dir, db, _)) = setup() else {
        return;
    };
    let image = std::fs::read(SYSTEMD_BOOT).unwrap();
    let signed = sign_pe(&image, &signing_key(&db)).unwrap();
    let info = slate_uki::parse_pe(&signed).unwrap();
    let table = info.security_directory.0 as usize;
    // In a section, in the headers (a section's size), and in the signature itself.
    let text = info.sections[0].pointer_to_raw_data as usize + 100;
    let header = info.section_table_offset + 16;
    let signature = signed.len() - 40;
    for (what, at) in [
        ("section", text),
        ("header", header),
        ("signature", signature),
    ] {
        let mut bad = signed.clone();
        bad[at] ^= 0x01;
        let err = verify_pe(&bad, &trusted(&db)).unwrap_err();
        let path = dir.path().join(format!("{what}.efi"));
        std::fs::write(&path, &bad).unwrap();
        let (ok, out) = sbverify(&db.cert, &path);
        assert!(!ok, "{what}: sbverify accepted a flipped byte: {out}");
        match what {
            "signature" => assert!(
                matches!(
                    err,
                    VerifyError::BadSignature(_) | VerifyError::Malformed(_)
                ),
                "{err}"
            ),
            _ => assert_eq!(err, VerifyError::ImageModified, "{what}"),
        }
        assert!(at < table || what == "signature");
    }
}

#[test]
fn what_sbsign_signs_slate_verifies() {
    let Some((dir, db, other)) = setup() else {
        return;
    };
    if !require_tool("sbsign") {
        return;
    }
    let out = dir.path().join("sbsigned.efi");
    let status = Command::new("sbsign")
        .arg("--key")
        .arg(&db.key)
        .arg("--cert")
        .arg(&db.cert)
        .arg("--output")
        .arg(&out)
        .arg(SYSTEMD_BOOT)
        .output()
        .unwrap();
    assert!(status.status.success());
    let signed = std::fs::read(&out).unwrap();
    assert_eq!(
        verify_pe(&signed, &trusted(&db)).unwrap().subject,
        "CN=slate test db"
    );
    assert!(verify_pe(&signed, &trusted(&other)).is_err());
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let Some((_dir, db, other)) = setup() else {
        return;
    };
    let err = SigningKey::from_pem(&db.key_pem(), &other.cert_pem()).unwrap_err();
    assert!(err.to_string().contains("someone else"), "{err}");
}
