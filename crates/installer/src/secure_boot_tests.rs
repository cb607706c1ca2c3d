//! A Secure Boot disk refuses, before any write, every UKI its enrolled db would not start:
//! unsigned, signed by another key, signature stripped or cut. Signed UKIs by the db key go on.

use std::path::{Path, PathBuf};

use slate_bootloader::sdboot::EnrollKeys;
use slate_bundle::NATIVE_ARCH;
use slate_disk::FileDisk;
use slate_esp::loader_conf;
use slate_layout::{LayoutParams, MIB};
use slate_secureboot::{sign_pe, signature_list, SigningKey, VerifyError};
use slate_testkit::secureboot::db_key;

use crate::install::tests::write_bundle;
use crate::upgrade::tests::request;
use crate::{upgrade, write_image, ImagePlan, InstallError, SecureBootError, UpgradeModeError};
use crate::{Trust, UpgradeRequest};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
const SYSTEMD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
const DISK_LEN: u64 = 96 * MIB;

/// Which refusal a case expects.
type Expected = fn(&VerifyError) -> bool;

/// A `db.auth` as systemd-boot reads it: an `EFI_VARIABLE_AUTHENTICATION_2` header (its
/// signature is the firmware's business, not read here) and one X.509 signature list.
fn db_auth(cert_der: &[u8]) -> Vec<u8> {
    let mut auth = vec![0; 16]; // EFI_TIME
    auth.extend_from_slice(&24u32.to_le_bytes()); // WIN_CERTIFICATE_UEFI_GUID, no CertData
    auth.extend_from_slice(&0x0200u16.to_le_bytes());
    auth.extend_from_slice(&0x0ef1u16.to_le_bytes());
    auth.extend_from_slice(&[0x11; 16]);
    auth.extend_from_slice(&signature_list(cert_der, [0x22; 16]));
    auth
}

fn uki(version: &str) -> Vec<u8> {
    let stub = std::fs::read(STUB).unwrap();
    slate_uki::UkiBuilder::new(&stub)
        .osrel(&format!("ID=slate\nVERSION_ID={version}\n"))
        .cmdline("console=ttyS0")
        .linux(format!("kernel of {version}").repeat(2000).into_bytes())
        .build()
        .unwrap()
}

fn hash(path: &Path) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

struct Fixture {
    dir: tempfile::TempDir,
    db: SigningKey,
    other: SigningKey,
}

fn fixture() -> Option<Fixture> {
    if !slate_testkit::require_path(STUB, "apt-get install systemd-boot-efi") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = |name| {
        db_key(dir.path(), name).map(|k| SigningKey::from_pem(&k.key_pem(), &k.cert_pem()).unwrap())
    };
    let db = key("owner db")?;
    let other = key("someone else")?;
    Some(Fixture { dir, db, other })
}

fn plan(f: &Fixture, systemd_boot: Vec<u8>, uki: Vec<u8>) -> ImagePlan {
    let auth = db_auth(&f.db.cert_der());
    ImagePlan {
        image_id: "secure-boot".into(),
        layout: LayoutParams {
            esp_size: 40 * MIB,
            state_size: 8 * MIB,
            ..LayoutParams::default()
        },
        source_date_epoch: 1_700_000_000,
        systemd_boot,
        uki,
        uki_name: "slate-1.0.0+3.efi".into(),
        loader_conf: loader_conf("slate-*", 0).unwrap(),
        enroll: Some(EnrollKeys {
            pk: auth.clone(),
            kek: auth.clone(),
            db: auth,
        }),
    }
}

fn blank(f: &Fixture, name: &str) -> PathBuf {
    let path = f.dir.path().join(name);
    FileDisk::create(&path, DISK_LEN).unwrap();
    path
}

#[test]
fn an_image_whose_boot_files_its_own_keys_refuse_is_not_written() {
    let Some(f) = fixture() else { return };
    let boot = std::fs::read(SYSTEMD_BOOT).unwrap();
    let signed_boot = sign_pe(&boot, &f.db).unwrap();
    for (what, systemd_boot, uki) in [
        (
            "unsigned systemd-boot",
            boot.clone(),
            sign_pe(&uki("1.0.0"), &f.db).unwrap(),
        ),
        ("unsigned UKI", signed_boot.clone(), uki("1.0.0")),
        (
            "UKI of another key",
            signed_boot.clone(),
            sign_pe(&uki("1.0.0"), &f.other).unwrap(),
        ),
    ] {
        let disk = blank(&f, "refused.raw");
        let before = hash(&disk);
        let err = write_image(
            &mut FileDisk::open(&disk).unwrap(),
            &plan(&f, systemd_boot, uki),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                InstallError::SecureBoot(SecureBootError::Refused { .. })
            ),
            "{what}: {err}"
        );
        assert_eq!(hash(&disk), before, "{what}: the disk was written");
    }
}

#[test]
fn an_upgrade_the_enrolled_db_would_refuse_writes_nothing() {
    let Some(f) = fixture() else { return };
    let disk = blank(&f, "disk.raw");
    let signed_boot = sign_pe(&std::fs::read(SYSTEMD_BOOT).unwrap(), &f.db).unwrap();
    let v1 = sign_pe(&uki("1.0.0"), &f.db).unwrap();
    write_image(
        &mut FileDisk::open(&disk).unwrap(),
        &plan(&f, signed_boot, v1),
        &mut |_| {},
    )
    .unwrap();
    assert!(crate::enrolled_on(&disk).unwrap().is_some());

    let v2 = uki("2.0.0");
    let signed = sign_pe(&v2, &f.db).unwrap();
    // Stripped: the header no longer points at the table (the bytes stay behind).
    let mut stripped = signed.clone();
    let info = slate_uki::parse_pe(&stripped).unwrap();
    let entry = info.optional_header_offset + 112 + 4 * 8;
    stripped[entry..entry + 8].fill(0);
    // Cut: the table is gone, the header still points at it.
    let cut = signed[..info.security_directory.0 as usize].to_vec();
    let cases: [(&str, Vec<u8>, Expected); 4] = [
        ("unsigned", v2.clone(), |e| *e == VerifyError::NotSigned),
        ("another key", sign_pe(&v2, &f.other).unwrap(), |e| {
            matches!(e, VerifyError::NotTrusted { .. })
        }),
        ("stripped", stripped, |e| *e == VerifyError::NotSigned),
        ("cut", cut, |e| {
            matches!(e, VerifyError::Malformed(_) | VerifyError::NotPe(_))
        }),
    ];
    for (what, uki, expected) in cases {
        let bundle = write_bundle(&f.dir.path().join(what), "2.0.0", NATIVE_ARCH, &uki, 2);
        let before = hash(&disk);
        for dry_run in [true, false] {
            let err = upgrade(
                &disk,
                &UpgradeRequest {
                    dry_run,
                    ..request(bundle.clone())
                },
                &mut |_| {},
            )
            .unwrap_err();
            let UpgradeModeError::SecureBoot(SecureBootError::Refused { source, .. }) = &err else {
                panic!("{what}: {err}");
            };
            assert!(expected(source), "{what}: {source}");
            assert!(err.to_string().contains("CN=owner db"), "{what}: {err}");
        }
        assert_eq!(hash(&disk), before, "{what}: the disk was written");
    }

    // The node's own db certificate says otherwise: the same well-signed UKI is refused.
    let good = write_bundle(&f.dir.path().join("good"), "2.0.0", NATIVE_ARCH, &signed, 2);
    let node_db =
        crate::trusted_from_pem(&std::fs::read(f.dir.path().join("someone else.crt")).unwrap())
            .unwrap();
    let before = hash(&disk);
    let err = upgrade(
        &disk,
        &UpgradeRequest {
            secure_boot_db: Some(node_db),
            ..request(good.clone())
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, UpgradeModeError::SecureBoot(_)), "{err}");
    assert_eq!(hash(&disk), before);

    let report = upgrade(&disk, &request(good), &mut |_| {}).unwrap();
    assert!(report.outcome.is_some());
    assert_ne!(hash(&disk), before, "the signed UKI was installed");
}

#[test]
fn an_install_for_a_secure_boot_machine_refuses_boot_files_its_db_would_not_start() {
    let Some(f) = fixture() else { return };
    let db = crate::trusted_from_pem(&std::fs::read(f.dir.path().join("owner db.crt")).unwrap())
        .unwrap();
    // The test bundle's systemd-boot is a stand-in, not a signed PE: refused before the UKI
    // (signed here) is even looked at, and before the disk is opened for writing.
    let cases = [(
        "unsigned systemd-boot",
        sign_pe(&uki("1.0.0"), &f.db).unwrap(),
    )];
    for (what, uki) in cases {
        let bundle = write_bundle(&f.dir.path().join(what), "1.0.0", NATIVE_ARCH, &uki, 2);
        let disk = blank(&f, "install.raw");
        let before = hash(&disk);
        let request = crate::InstallRequest {
            bundle,
            trust: Trust::NotVerified,
            force: false,
            dry_run: false,
            config: None,
            secure_boot_db: Some(db.clone()),
        };
        let err = crate::install(&disk, &request, &mut |_| {}).unwrap_err();
        assert!(
            matches!(
                err,
                crate::InstallModeError::SecureBoot(SecureBootError::Refused { .. })
            ),
            "{what}: {err}"
        );
        assert!(err.to_string().contains("systemd-boot"), "{what}: {err}");
        assert_eq!(hash(&disk), before, "{what}: the disk was written");
    }
}
