//! Each blob is hashed at most once per `Bundle` (counted with `hashed_on_this_thread`), and an
//! export puts every document before the first layer so a receiver can check the signature
//! before it reads a large blob.

use std::fs;
use std::path::Path;

mod support;

use slate_bundle::{
    add_signature, hashed_on_this_thread, Bundle, BundleError, Digest, SignatureLayer,
    VerifiedBlobs,
};

const UKI: &[u8] = b"MZ pretend UKI, somewhat longer than the documents around it";
const INSTALLER: &[u8] = b"\x7fELF pretend slate";

fn write(dir: &Path) {
    support::write_test_bundle(dir, UKI, Some(INSTALLER));
}

fn sign(dir: &Path) {
    let bundle = Bundle::open(dir, None).unwrap();
    let layer = SignatureLayer {
        payload: format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"slate"}},"image":{{"docker-manifest-digest":"{}"}},"type":"cosign container image signature"}},"optional":null}}"#,
            bundle.manifest_digest()
        )
        .into_bytes(),
        signature: "MEUCIQ==".into(),
        public_key: None,
    };
    add_signature(dir, bundle.manifest_digest(), &layer).unwrap();
}

/// The size of every file under `blobs/sha256`.
fn blob_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn entries(tar: &[u8]) -> Vec<(String, u64)> {
    tar::Archive::new(tar)
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.path().unwrap().to_string_lossy().into_owned(),
                e.header().size().unwrap(),
            )
        })
        .collect()
}

#[test]
fn open_verify_and_export_hash_each_byte_once() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    sign(dir.path());
    let start = hashed_on_this_thread();
    let bundle = Bundle::open(dir.path(), None).unwrap();
    bundle.verify_blobs().unwrap();
    assert!(bundle.signatures().unwrap().is_some());
    let mut tar = Vec::new();
    bundle.export_tar(&mut tar).unwrap();
    // Again: nothing left to hash.
    let mut again = Vec::new();
    bundle.export_tar(&mut again).unwrap();
    assert_eq!(tar, again);
    assert_eq!(bundle.read_blob("uki").unwrap(), UKI);
    // Every blob in the layout is part of the exported image or its signature: each hashed once.
    assert_eq!(hashed_on_this_thread() - start, blob_bytes(dir.path()));
}

#[test]
fn an_export_alone_hashes_each_byte_once_and_puts_documents_first() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    sign(dir.path());
    let start = hashed_on_this_thread();
    let bundle = Bundle::open(dir.path(), None).unwrap();
    let mut tar = Vec::new();
    bundle.export_tar(&mut tar).unwrap();
    assert_eq!(hashed_on_this_thread() - start, blob_bytes(dir.path()));

    let names = entries(&tar);
    let layer = |bytes: &[u8]| {
        (
            format!("blobs/sha256/{}", Digest::of(bytes).hex()),
            bytes.len() as u64,
        )
    };
    assert_eq!(names[0].0, "oci-layout");
    assert_eq!(names[1].0, "index.json");
    assert_eq!(
        names[2].0,
        format!("blobs/sha256/{}", bundle.digest().hex()),
        "the image manifest comes first"
    );
    let last_two: Vec<_> = names[names.len() - 2..].to_vec();
    assert_eq!(last_two, vec![layer(UKI), layer(INSTALLER)]);
    // Between them: the config, then the signature manifest, its config and its payload.
    assert_eq!(names.len(), 2 + 2 + 3 + 2);
}

#[test]
fn blobs_verified_elsewhere_are_not_hashed_again_but_still_size_checked() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let first = Bundle::open(dir.path(), None).unwrap();
    first.verify_blobs().unwrap();
    let verified: VerifiedBlobs = first.verified_blobs();
    assert_eq!(verified.len(), 4, "manifest, config and two layers");

    let start = hashed_on_this_thread();
    let second = Bundle::open_with(dir.path(), None, verified.clone()).unwrap();
    second.verify_blobs().unwrap();
    assert_eq!(second.read_blob("installer").unwrap(), INSTALLER);
    assert_eq!(hashed_on_this_thread(), start);

    let installer = dir
        .path()
        .join("blobs/sha256")
        .join(Digest::of(INSTALLER).hex());
    fs::write(&installer, b"\x7fELF").unwrap();
    let third = Bundle::open_with(dir.path(), None, verified).unwrap();
    assert!(matches!(
        third.verify_blob("installer"),
        Err(BundleError::SizeMismatch { .. })
    ));
}

#[test]
fn a_layer_that_does_not_match_fails_the_export() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let uki = dir.path().join("blobs/sha256").join(Digest::of(UKI).hex());
    let mut damaged = UKI.to_vec();
    damaged[0] = b'X';
    fs::write(&uki, damaged).unwrap();
    let bundle = Bundle::open(dir.path(), None).unwrap();
    let err = bundle.export_tar(&mut Vec::new()).unwrap_err();
    assert!(matches!(err, BundleError::DigestMismatch { .. }), "{err}");
}

#[test]
fn a_bundle_manifest_naming_an_upper_case_digest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let bundle = Bundle::open(dir.path(), None).unwrap();
    let hex = Digest::of(UKI).hex().to_owned();
    let config = serde_json::to_vec(bundle.manifest()).unwrap();
    let upper = String::from_utf8(config)
        .unwrap()
        .replace(&hex, &hex.to_uppercase());
    assert!(matches!(
        slate_bundle::parse_documents(
            &fs::read(dir.path().join("index.json")).unwrap(),
            None,
            bundle.manifest_bytes(),
            upper.as_bytes(),
        ),
        Err(BundleError::UnsupportedDigest(_) | BundleError::Malformed { .. })
    ));
}
