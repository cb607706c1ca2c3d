//! A large layer carries chunk digests in the image manifest and is verified by them; a small
//! one carries none (its bundle is what slate wrote before); malformed chunk annotations refuse
//! the bundle when its manifest is read, before any blob is.

use std::fs;
use std::path::Path;

mod support;

use slate_bundle::{
    hashed_on_this_thread, parse_documents, Bundle, BundleError, ChunkDigests, Digest,
    CHUNK_DIGESTS_ANNOTATION, CHUNK_SIZE, CHUNK_SIZE_ANNOTATION, UKI_ROLE,
};

/// 17 MiB and a bit: three chunks of 8 MiB.
fn large_uki() -> Vec<u8> {
    (0..(17u32 << 20) + 5)
        .map(|i| (i ^ (i >> 13)) as u8)
        .collect()
}

fn layers(manifest: &[u8]) -> Vec<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_slice(manifest).unwrap();
    value["layers"].as_array().unwrap().clone()
}

#[test]
fn a_large_layer_is_chunked_and_verified_by_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let uki = large_uki();
    support::write_test_bundle(dir.path(), &uki, Some(b"\x7fELF pretend slate"));
    let bundle = Bundle::open(dir.path(), None).unwrap();
    let layers = layers(bundle.manifest_bytes());
    let annotations = &layers[0]["annotations"];
    assert_eq!(annotations[CHUNK_SIZE_ANNOTATION], CHUNK_SIZE.to_string());
    let expected = ChunkDigests::of(&uki, CHUNK_SIZE);
    let listed: Vec<&str> = annotations[CHUNK_DIGESTS_ANNOTATION]
        .as_str()
        .unwrap()
        .split(',')
        .collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[2], Digest::of(&uki[16 << 20..]).as_str());
    assert_eq!(
        listed,
        expected
            .digests()
            .iter()
            .map(Digest::as_str)
            .collect::<Vec<_>>()
    );
    // The installer layer is small: no chunk digests.
    assert!(layers[1]["annotations"]
        .get(CHUNK_SIZE_ANNOTATION)
        .is_none());

    let before = hashed_on_this_thread();
    let mapped = bundle.map_blob(UKI_ROLE).unwrap();
    assert!(*mapped == *uki);
    assert_eq!(hashed_on_this_thread() - before, uki.len() as u64);
}

/// The image manifest of a bundle with its UKI layer's annotation `key` set to `value`.
fn with_annotation(dir: &Path, key: &str, value: &str) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let bundle = Bundle::open(dir, None).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(bundle.manifest_bytes()).unwrap();
    manifest["layers"][0]["annotations"][key] = serde_json::Value::from(value);
    let config = serde_json::to_vec(bundle.manifest()).unwrap();
    (
        fs::read(dir.join("index.json")).unwrap(),
        serde_json::to_vec(&manifest).unwrap(),
        config,
    )
}

#[test]
fn malformed_chunk_digests_refuse_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    support::write_test_bundle(dir.path(), &large_uki(), None);
    let one = Digest::of(b"one").to_string();
    let cases = [
        (CHUNK_SIZE_ANNOTATION, "1000", "is not a power of two"),
        (CHUNK_SIZE_ANNOTATION, "eight", "is not a decimal number"),
        (CHUNK_DIGESTS_ANNOTATION, one.as_str(), "lists 1 digests"),
        (CHUNK_DIGESTS_ANNOTATION, "sha512:00", "not supported"),
    ];
    for (key, value, fault) in cases {
        let (index, manifest, config) = with_annotation(dir.path(), key, value);
        let err = parse_documents(&index, None, &manifest, &config).unwrap_err();
        assert!(
            matches!(&err, BundleError::Malformed { what, reason }
                if what == "the image manifest" && reason.contains("its layer sha256:")
                    && reason.contains(fault)),
            "{key}={value}: {err}"
        );
    }
}
