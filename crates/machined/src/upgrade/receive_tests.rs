//! machined's side of an upload: the judge (slate-trust against the node's keys, an installer
//! required), the mapping of refusals onto the API's errors, and what is remembered for `plan`
//! and the Upgrade sequence. The tar itself (names, order, sizes) is tested with the importer
//! in `crates/bundle/tests/import.rs`. Hashing is counted with
//! `slate_bundle::hashed_on_this_thread` (the receiver runs on the test's thread).

use std::fs;
use std::path::Path;

use slate_bundle::{
    hashed_on_this_thread, write_bundle, BlobInput, Bundle, BundleSpec, VerifiedBlobs,
    BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};
use slate_trust::{PrivateKey, PublicKey};

use super::super::{check_signed, write_installer};
use super::*;

/// Large enough that reading it by mistake shows; small enough for a unit test.
const UKI_BYTES: usize = 4 << 20;
const INSTALLER: &[u8] = b"\x7fELF pretend slate installer";

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from_scalar(&[seed; 32]).unwrap()
}

fn trusted() -> Vec<PublicKey> {
    vec![key(1).public_key()]
}

fn uki() -> Vec<u8> {
    (0..UKI_BYTES).map(|i| (i * 31 % 251) as u8).collect()
}

/// A bundle in `dir` with a 4 MiB UKI, signed by `signer` when given.
fn bundle(dir: &Path, signer: Option<u8>) -> Bundle {
    bundle_with(dir, signer, true)
}

/// [`bundle`], with or without its installer binary.
fn bundle_with(dir: &Path, signer: Option<u8>, installer: bool) -> Bundle {
    let uki = uki();
    let blobs = [
        BlobInput {
            role: "uki",
            file_name: "slate-2.0.0.efi",
            media_type: UKI_MEDIA_TYPE,
            bytes: &uki,
        },
        BlobInput {
            role: INSTALLER_ROLE,
            file_name: "slate",
            media_type: BINARY_MEDIA_TYPE,
            bytes: INSTALLER,
        },
    ];
    let count = if installer { 2 } else { 1 };
    write_bundle(
        dir,
        BundleSpec {
            name: "slate",
            version: "2.0.0",
            arch: "amd64",
            variant: "demo",
        },
        &blobs[..count],
    )
    .unwrap();
    let bundle = Bundle::open(dir, None).unwrap();
    if let Some(seed) = signer {
        slate_trust::sign(&bundle, &key(seed)).unwrap();
    }
    Bundle::open(dir, None).unwrap()
}

fn export(bundle: &Bundle) -> Vec<u8> {
    let mut tar = Vec::new();
    bundle.export_tar(&mut tar).unwrap();
    tar
}

fn receive(tar: &[u8], staging: &Path) -> Result<Received, BackendError> {
    receive_into(staging, &trusted(), &mut &tar[..])
}

#[test]
fn a_signed_upload_is_hashed_once_and_not_again_before_its_installer_runs() {
    let src = tempfile::tempdir().unwrap();
    let signed = bundle(src.path(), Some(1));
    let tar = export(&signed);
    let upload_blobs: u64 = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(Result::unwrap)
        .filter(|e| e.path().unwrap().starts_with("blobs/sha256"))
        .map(|e| e.size())
        .sum();
    let staging = tempfile::tempdir().unwrap();
    let start = hashed_on_this_thread();
    let received = receive(&tar, staging.path()).unwrap();
    assert_eq!(received.signed, key(1).public_key().id().short());
    assert_eq!(received.bundle.digest(), signed.digest());
    assert_eq!(
        hashed_on_this_thread() - start,
        upload_blobs,
        "every blob of the upload hashed exactly once as it arrived"
    );

    // plan and the Upgrade sequence, in the same boot: the remembered digests are trusted,
    // nothing is hashed again, and the installer comes out whole.
    let id = received.bundle.digest().clone();
    remember(&id, received.bundle.verified_blobs());
    let after_receive = hashed_on_this_thread();
    let (bundle, signer) = check_signed(staging.path(), &id, remembered(&id), &trusted()).unwrap();
    assert_eq!(signer, key(1).public_key().id().short());
    bundle.verify_blobs().unwrap();
    let installer = staging.path().join("installer");
    assert_eq!(
        write_installer(&bundle, &installer).unwrap(),
        INSTALLER.len() as u64
    );
    assert_eq!(fs::read(&installer).unwrap(), INSTALLER);
    assert_eq!(hashed_on_this_thread(), after_receive);

    // After a reboot (a staged upgrade) nothing is remembered: each byte is hashed once more.
    let (bundle, _) = check_signed(staging.path(), &id, VerifiedBlobs::new(), &trusted()).unwrap();
    bundle.verify_blobs().unwrap();
    write_installer(&bundle, &installer).unwrap();
    assert_eq!(
        hashed_on_this_thread() - after_receive,
        bundle.verified_blobs().total_bytes()
    );
}

#[test]
fn a_refused_upload_is_an_invalid_argument_in_the_importers_words() {
    let src = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let err = receive(&export(&bundle(src.path(), None)), staging.path()).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidArgument(m)
            if m.starts_with("the bundle is refused: the bundle is not signed") && m.contains(".sig")),
        "{err:?}"
    );

    let src = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let err = receive(&export(&bundle(src.path(), Some(2))), staging.path()).unwrap_err();
    let untrusted = format!(
        "the bundle is refused: the bundle is signed by key {}, which is not trusted",
        key(2).public_key().id().short()
    );
    assert!(
        matches!(&err, BackendError::InvalidArgument(m) if m.starts_with(&untrusted)),
        "{err:?}"
    );

    let staging = tempfile::tempdir().unwrap();
    let err = receive(b"not a tar", staging.path()).unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
}

#[test]
fn a_signed_bundle_without_an_installer_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle_with(src.path(), Some(1), false));
    let staging = tempfile::tempdir().unwrap();
    let err = receive(&tar, staging.path()).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidArgument(m)
            if m == "the bundle is refused: the bundle carries no installer blob"),
        "{err:?}"
    );
}

#[test]
fn a_staging_directory_that_cannot_be_written_is_a_failure_not_the_uploads_fault() {
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle(src.path(), Some(1)));
    let not_a_dir = tempfile::NamedTempFile::new().unwrap();
    let err = receive(&tar, not_a_dir.path()).unwrap_err();
    assert!(
        matches!(&err, BackendError::Failed(m) if m.starts_with(&not_a_dir.path().display().to_string())),
        "{err:?}"
    );
}
