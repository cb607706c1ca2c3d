use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::Path;

use slate_bundle::{seal_verified, Bundle, Digest, NATIVE_ARCH, UKI_ROLE};
use slate_disk::FileDisk;

use super::*;
use crate::install::tests::{blank_disk, bundle, request as install_request};
use crate::upgrade::tests::request;
use crate::{upgrade, UpgradeModeError, UpgradeRequest};

fn hash(path: &Path) -> Digest {
    Digest::of(&std::fs::read(path).unwrap())
}

/// A disk with 1.0.0 installed, the 2.0.0 bundle, and that bundle's UKI with its digest.
fn installed(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>, Digest) {
    let disk = blank_disk(dir);
    let v1 = bundle(dir, "1.0.0", NATIVE_ARCH);
    crate::install(&disk, &install_request(v1), &mut |_| {}).unwrap();
    let v2 = bundle(dir, "2.0.0", NATIVE_ARCH);
    let opened = Bundle::open(&v2, None).unwrap();
    let uki = opened.read_blob(UKI_ROLE).unwrap();
    let digest = Digest::parse(&opened.blob_ref(UKI_ROLE).unwrap().digest).unwrap();
    (disk, v2, uki, digest)
}

fn esp_file(disk: &Path, name: &str) -> Vec<u8> {
    let mut file = FileDisk::open_read_only(disk).unwrap();
    let esp = slate_layout::open_partition(&mut file, slate_layout::EFI_LABEL).unwrap();
    let fs = slate_esp::fat::mount(esp, 0).unwrap();
    let mut bytes = Vec::new();
    fs.root_dir()
        .open_file(&format!("{}/{name}", slate_esp::UKI_DIR))
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    bytes
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut chain = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    chain
}

fn with_handover(bundle: std::path::PathBuf, handover: UkiHandover) -> UpgradeRequest {
    UpgradeRequest {
        uki_handover: Some(handover),
        ..request(bundle)
    }
}

/// The sealed memfd is what gets written, and the UKI is not hashed in this process: its file
/// in the bundle is even damaged here, and the upgrade neither reads nor minds it.
#[test]
fn a_sealed_handover_is_written_without_hashing_the_uki_again() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, v2, uki, digest) = installed(dir.path());
    let fd = seal_verified("slate-test-uki", &uki).unwrap();
    let blob = v2.join("blobs/sha256").join(digest.hex());
    assert!(blob.exists());
    let mut damaged = uki.clone();
    damaged[10] ^= 1;
    std::fs::write(&blob, &damaged).unwrap();

    let before = slate_bundle::hashed_on_this_thread();
    let report = upgrade(
        &disk,
        &with_handover(v2, UkiHandover::new(fd, digest)),
        &mut |_| {},
    )
    .unwrap();
    let hashed = slate_bundle::hashed_on_this_thread() - before;
    assert!(hashed < uki.len() as u64, "hashed {hashed} bytes");
    let outcome = report.outcome.unwrap();
    assert_eq!(outcome.file_name, "slate-2.0.0+3.efi");
    assert_eq!(esp_file(&disk, "slate-2.0.0+3.efi"), uki);
}

/// A memfd that is not sealed, a sealed one named with another digest than the bundle signs,
/// or one of another size is refused, and the disk is as it was.
#[test]
fn an_unsealed_or_wrong_digest_handover_is_refused_before_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, v2, uki, digest) = installed(dir.path());
    let before = hash(&disk);

    let open =
        rustix::fs::memfd_create("slate-test-open", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    File::from(open.try_clone().unwrap())
        .write_all(&uki)
        .unwrap();
    let mut tampered = uki.clone();
    tampered[0] ^= 1;
    let cases = [
        (UkiHandover::new(open, digest.clone()), "is not sealed"),
        (
            UkiHandover::new(
                seal_verified("slate-test-uki", &tampered).unwrap(),
                Digest::of(&tampered),
            ),
            "was verified as",
        ),
        (
            UkiHandover::new(
                seal_verified("slate-test-uki", &uki[1..]).unwrap(),
                digest.clone(),
            ),
            "the bundle signs",
        ),
    ];
    for (handover, says) in cases {
        let err = upgrade(&disk, &with_handover(v2.clone(), handover), &mut |_| {}).unwrap_err();
        assert!(matches!(err, UpgradeModeError::Bundle(_)), "{err:?}");
        let chain = error_chain(&err);
        assert!(chain.contains(says), "{says}: {chain}");
        assert_eq!(hash(&disk), before, "{says}: something was written");
    }
}

/// The environment's handover: both variables or neither, a number and a canonical digest, a
/// descriptor that is open; a good one reaches the memfd through /proc.
#[test]
fn the_environment_names_a_handover_with_both_variables() {
    let none = UkiHandover::from_vars(None, None).unwrap();
    assert!(none.is_none());
    let digest = Digest::of(b"uki");
    let text = |s: &str| Some(OsString::from(s));
    let digest_text = digest.to_string();
    let err = UkiHandover::from_vars(text("3"), None).unwrap_err();
    assert!(
        matches!(
            err,
            HandoverEnvError::Half {
                set: UKI_FD_ENV,
                ..
            }
        ),
        "{err}"
    );
    let err = UkiHandover::from_vars(None, text(&digest_text)).unwrap_err();
    assert!(
        matches!(
            err,
            HandoverEnvError::Half {
                unset: UKI_FD_ENV,
                ..
            }
        ),
        "{err}"
    );
    let err = UkiHandover::from_vars(text("-1"), text(&digest_text)).unwrap_err();
    assert!(matches!(err, HandoverEnvError::BadFd(_)), "{err}");
    let err = UkiHandover::from_vars(text("3"), text("sha256:ABC")).unwrap_err();
    assert!(matches!(err, HandoverEnvError::BadDigest(_)), "{err}");
    let err = UkiHandover::from_vars(text("999999"), text(&digest_text)).unwrap_err();
    assert!(
        matches!(err, HandoverEnvError::Open { fd: 999999, .. }),
        "{err}"
    );

    let fd = seal_verified("slate-test-uki", b"uki").unwrap();
    let number = fd.as_raw_fd().to_string();
    let handover = UkiHandover::from_vars(text(&number), text(&digest_text))
        .unwrap()
        .unwrap();
    assert_eq!(handover.digest, digest);
    let seals = rustix::fs::fcntl_get_seals(&*handover.fd).unwrap();
    assert!(seals.contains(slate_bundle::HANDOVER_SEALS), "{seals:?}");
}
