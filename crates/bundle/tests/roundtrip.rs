//! Bundles written by `write_bundle` open and verify; every kind of damage is refused by name.

use std::fs;
use std::path::Path;

use slate_bundle::{
    write_bundle, BlobInput, Bundle, BundleError, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};

fn spec(version: &str) -> BundleSpec<'_> {
    BundleSpec {
        name: "slate",
        version,
        arch: "amd64",
        variant: "demo",
    }
}

fn write(dir: &Path) {
    write_bundle(
        dir,
        spec("2.0.0"),
        &[
            BlobInput {
                role: "uki",
                file_name: "slate-2.0.0.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: b"MZ pretend UKI",
            },
            BlobInput {
                role: "installer",
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: b"\x7fELF pretend slate",
            },
        ],
    )
    .unwrap();
}

fn blob_file(dir: &Path, role: &str) -> std::path::PathBuf {
    let bundle = Bundle::open(dir, None).unwrap();
    let digest = bundle.blob_ref(role).unwrap().digest.clone();
    dir.join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

#[test]
fn a_written_bundle_opens_and_its_blobs_verify() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let bundle = Bundle::open(dir.path(), Some("2.0.0")).unwrap();
    assert_eq!(bundle.manifest().version, "2.0.0");
    assert_eq!(bundle.manifest().variant, "demo");
    assert_eq!(bundle.read_blob("uki").unwrap(), b"MZ pretend UKI");
    assert!(bundle.manifest_digest().starts_with("sha256:"));
    assert!(matches!(
        Bundle::open(dir.path(), Some("9.9.9")),
        Err(BundleError::NoSuchTag(_))
    ));
    assert!(matches!(
        bundle.read_blob("firmware"),
        Err(BundleError::MissingBlob(_))
    ));
}

#[test]
fn bundles_are_byte_reproducible() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(a.path());
    write(b.path());
    for file in ["index.json", "oci-layout"] {
        assert_eq!(
            fs::read(a.path().join(file)).unwrap(),
            fs::read(b.path().join(file)).unwrap()
        );
    }
}

#[test]
fn a_tampered_blob_is_refused_by_digest() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let path = blob_file(dir.path(), "uki");
    fs::write(&path, b"MZ pretend UKX").unwrap();
    let err = Bundle::open(dir.path(), None)
        .unwrap()
        .read_blob("uki")
        .unwrap_err();
    assert!(matches!(err, BundleError::DigestMismatch { .. }), "{err}");
}

#[test]
fn a_truncated_blob_is_refused_by_size() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let path = blob_file(dir.path(), "installer");
    fs::write(&path, b"\x7fELF").unwrap();
    let err = Bundle::open(dir.path(), None)
        .unwrap()
        .read_blob("installer")
        .unwrap_err();
    assert!(matches!(err, BundleError::SizeMismatch { .. }), "{err}");
}

#[test]
fn an_oversize_or_garbage_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    fs::write(dir.path().join("index.json"), vec![b' '; 300 * 1024]).unwrap();
    assert!(matches!(
        Bundle::open(dir.path(), None),
        Err(BundleError::Oversize { .. })
    ));
    fs::write(
        dir.path().join("index.json"),
        b"{\"schemaVersion\": 2, \"manifests\": 7}",
    )
    .unwrap();
    assert!(matches!(
        Bundle::open(dir.path(), None),
        Err(BundleError::Malformed { .. })
    ));
}

#[test]
fn a_manifest_that_does_not_match_its_digest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap();
    let path = dir
        .path()
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.iter().position(|&b| b == b'2').unwrap();
    bytes[at] = b'3';
    fs::write(&path, bytes).unwrap();
    let err = Bundle::open(dir.path(), None).unwrap_err();
    assert!(matches!(err, BundleError::DigestMismatch { .. }), "{err}");
}

#[test]
fn an_exported_image_unpacks_to_a_layout_that_opens_alone() {
    let cache = tempfile::tempdir().unwrap();
    write(cache.path());
    let bundle = Bundle::open(cache.path(), Some("2.0.0")).unwrap();
    let mut tar = Vec::new();
    bundle.export_tar(&mut tar).unwrap();
    let out = tempfile::tempdir().unwrap();
    tar::Archive::new(&tar[..]).unpack(out.path()).unwrap();
    let exported = Bundle::open(out.path(), None).unwrap();
    assert_eq!(exported.manifest_digest(), bundle.manifest_digest());
    assert_eq!(
        exported.read_blob("installer").unwrap(),
        b"\x7fELF pretend slate"
    );
}
