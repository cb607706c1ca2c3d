//! `[secureboot]`: a key set from `slate gen secureboot-keys` (openssl + efitools) is what a
//! profile names; the root then carries the db certificate; a key that is not the
//! certificate's, or enrolment files that would not trust the signing certificate, stop the
//! build before anything is built.

mod common;

use std::fs;
use std::path::Path;

use slate_imager::{build_rootfs, gen_secureboot_keys, ImagerError, Inputs};
use slate_profile::image_contract::SECURE_BOOT_DB_PATH;

use common::BASE_PROFILE as BASE;

fn tools() -> bool {
    [
        "openssl",
        "cert-to-efi-sig-list",
        "sign-efi-sig-list",
        "unsquashfs",
    ]
    .iter()
    .all(|t| slate_testkit::require_tool(t))
}

fn resolve(dir: &Path, secureboot: &str) -> Result<Inputs, ImagerError> {
    fs::write(
        dir.join("profile.toml"),
        format!("{BASE}[secureboot]\n{secureboot}"),
    )
    .unwrap();
    common::resolve_rootfs(dir)
}

#[test]
fn generated_keys_enrol_the_db_certificate_the_image_carries() {
    if !tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("rootfs/bin")).unwrap();
    fs::write(dir.path().join("rootfs/bin/init"), "#!/bin/sh\n").unwrap();
    let keys = dir.path().join("owner/keys");
    let files = gen_secureboot_keys(&keys, "test owner").unwrap();
    assert_eq!(files.len(), 9);
    for key in ["PK.key", "KEK.key", "db.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(keys.join(key)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    assert!(
        gen_secureboot_keys(&keys, "again").is_err(),
        "an existing key directory is never overwritten"
    );
    // efitools' db.auth holds exactly db.crt.
    let db_pem = fs::read(keys.join("db.crt")).unwrap();
    let db_der = pem_der(&db_pem);
    let certs =
        slate_secureboot::certs_from_auth(&fs::read(keys.join("db.auth")).unwrap()).unwrap();
    assert_eq!(certs, vec![db_der]);

    let inputs = resolve(
        dir.path(),
        "key = \"owner/keys/db.key\"\ncert = \"owner/keys/db.crt\"\nenroll = \"owner/keys\"\n",
    )
    .unwrap();
    let sb = inputs.secure_boot.as_ref().unwrap();
    assert!(sb.enroll.is_some());
    let image = dir.path().join("root.sqsh");
    fs::write(&image, build_rootfs(&inputs, &mut |_| {}).unwrap()).unwrap();
    let out = dir.path().join("x");
    let status = std::process::Command::new("unsquashfs")
        .args(["-no-progress", "-d"])
        .arg(&out)
        .arg(&image)
        .output()
        .unwrap();
    assert!(status.status.success());
    assert_eq!(fs::read(out.join(SECURE_BOOT_DB_PATH)).unwrap(), db_pem);

    // Another owner's enrolment files would refuse this image's boot loader.
    let other = dir.path().join("other");
    gen_secureboot_keys(&other, "other owner").unwrap();
    let err = resolve(
        dir.path(),
        "key = \"owner/keys/db.key\"\ncert = \"owner/keys/db.crt\"\nenroll = \"other\"\n",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("does not hold the signing certificate"),
        "{err}"
    );
    // A key that is not the certificate's.
    let err = resolve(
        dir.path(),
        "key = \"other/db.key\"\ncert = \"owner/keys/db.crt\"\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("does not belong"), "{err}");
}

/// The DER inside a one-certificate PEM file.
fn pem_der(pem: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = String::from_utf8_lossy(pem)
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}
