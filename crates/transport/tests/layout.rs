//! Local layouts as sources and destinations: the transport with no server at all.
#![cfg(feature = "client")]

mod support;

use slate_bundle::Bundle;
use slate_transport::{plan_push, pull, push, Reference, TransportError};
use support::{
    add_fake_signature, assert_only_verified_blobs, incoming, manifest_digest, noise,
    write_test_bundle, Counter,
};

fn reference(s: &str) -> Reference {
    Reference::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

fn layout_ref(dir: &std::path::Path, suffix: &str) -> Reference {
    reference(&format!("oci-layout:{}{suffix}", dir.display()))
}

#[test]
fn pull_from_a_layout_takes_its_only_image_and_its_signature() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(1, 10_000), &noise(2, 3_000));
    let sig = add_fake_signature(&bundle, "2.0.0");
    let cache = work.path().join("cache");
    let pulled = pull(&layout_ref(&bundle, ""), &cache, &mut |_| {}).unwrap();
    assert_eq!(pulled.tag, "2.0.0");
    assert_eq!(pulled.signature_tag.as_deref(), Some(sig.as_str()));
    assert_eq!(pulled.manifest_digest, manifest_digest(&bundle, "2.0.0"));
    Bundle::open(&cache, Some("2.0.0")).unwrap();
    Bundle::open(&cache, None).unwrap();
    assert_eq!(
        manifest_digest(&cache, &sig),
        manifest_digest(&bundle, &sig)
    );

    let mut counter = Counter::default();
    let again = pull(&layout_ref(&bundle, ":2.0.0"), &cache, &mut |e| {
        counter.record(e)
    })
    .unwrap();
    assert_eq!((again.fetched_bytes, counter.bytes), (0, 0));
}

#[test]
fn push_into_layouts_keeps_every_tag() {
    let work = tempfile::tempdir().unwrap();
    let (v2, v3, dest) = (
        work.path().join("v2"),
        work.path().join("v3"),
        work.path().join("dest"),
    );
    write_test_bundle(&v2, "2.0.0", b"uki 2", b"installer");
    write_test_bundle(&v3, "3.0.0", b"uki 3", b"installer");
    let sig = add_fake_signature(&v2, "2.0.0");
    let pushed = push(&v2, &layout_ref(&dest, ""), &mut |_| {}).unwrap();
    assert_eq!(
        pushed.references,
        [
            format!("oci-layout:{}:2.0.0", dest.display()),
            format!("oci-layout:{}:{sig}", dest.display())
        ]
    );
    let pushed = push(&v3, &layout_ref(&dest, ""), &mut |_| {}).unwrap();
    assert_eq!(pushed.skipped_bytes, "installer".len() as u64);
    for tag in ["2.0.0", "3.0.0"] {
        let opened = Bundle::open(&dest, Some(tag)).unwrap();
        assert_eq!(opened.manifest().version, tag);
        opened.read_blob(slate_bundle::UKI_ROLE).unwrap();
    }
    assert_eq!(manifest_digest(&dest, &sig), manifest_digest(&v2, &sig));

    push(&v3, &layout_ref(&dest, ":stable"), &mut |_| {}).unwrap();
    assert_eq!(
        Bundle::open(&dest, Some("stable"))
            .unwrap()
            .manifest()
            .version,
        "3.0.0"
    );
    let err = push(
        &dest,
        &layout_ref(&work.path().join("x"), ":nope"),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("2.0.0"), "lists the tags: {err}");
    assert_only_verified_blobs(&dest);
}

#[test]
fn a_push_plan_reads_only_the_layout() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(1, 1000), &noise(2, 500));
    let sig = add_fake_signature(&bundle, "2.0.0");
    // A registry that does not exist: planning never connects.
    let plan = plan_push(&bundle, &reference("registry.invalid:5000/os")).unwrap();
    let names: Vec<_> = plan.images.iter().map(|i| i.destination.as_str()).collect();
    assert_eq!(names, ["2.0.0", sig.as_str()]);
    assert_eq!(
        plan.blobs.len(),
        5,
        "config, uki, installer; signature config and layer"
    );
    assert!(plan.total_bytes() > 1500);
    let err = plan_push(
        &bundle,
        &reference(&format!("registry.invalid/os@sha256:{}", "0".repeat(64))),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not to a digest"), "{err}");
}

#[test]
fn a_corrupt_source_blob_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    let uki = noise(1, 10_000);
    write_test_bundle(&bundle, "2.0.0", &uki, b"installer");
    let digest = support::sha256(&uki);
    std::fs::write(
        bundle.join("blobs/sha256").join(&digest[7..]),
        noise(2, 10_000),
    )
    .unwrap();
    let cache = work.path().join("cache");
    let err = pull(&layout_ref(&bundle, ""), &cache, &mut |_| {}).unwrap_err();
    assert!(
        matches!(&err, TransportError::DigestMismatch { expected, .. } if *expected == digest),
        "{err:?}"
    );
    assert_only_verified_blobs(&cache);
    assert!(incoming(&cache).is_empty());

    std::fs::write(bundle.join("blobs/sha256").join(&digest[7..]), b"short").unwrap();
    let err = pull(&layout_ref(&bundle, ""), &cache, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::SizeMismatch {
                expected: 10_000,
                actual: 5,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_bad_partial_is_retried_from_the_start_and_a_bad_cached_blob_refetched() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    let uki = noise(1, 10_000);
    write_test_bundle(&bundle, "2.0.0", &uki, b"installer");
    let digest = support::sha256(&uki);
    let cache = work.path().join("cache");
    std::fs::create_dir_all(cache.join("incoming")).unwrap();
    std::fs::create_dir_all(cache.join("blobs/sha256")).unwrap();
    std::fs::write(
        cache.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(
        cache
            .join("incoming")
            .join(format!("{}.partial", &digest[7..])),
        noise(3, 1000),
    )
    .unwrap();
    let mut counter = Counter::default();
    pull(&layout_ref(&bundle, ""), &cache, &mut |e| counter.record(e)).unwrap();
    let starts: Vec<u64> = counter
        .starts
        .iter()
        .filter(|(d, ..)| *d == digest)
        .map(|s| s.2)
        .collect();
    assert_eq!(
        starts,
        [1000, 0],
        "resumed, failed the digest, started over"
    );
    assert_eq!(
        Bundle::open(&cache, None)
            .unwrap()
            .read_blob("uki")
            .unwrap(),
        uki
    );

    // A cached blob of the wrong size is not that blob.
    std::fs::write(cache.join("blobs/sha256").join(&digest[7..]), b"x").unwrap();
    let again = pull(&layout_ref(&bundle, ""), &cache, &mut |_| {}).unwrap();
    assert_eq!(again.fetched_bytes, 10_000);
    assert_only_verified_blobs(&cache);
}

#[test]
fn caches_and_sources_are_checked_before_use() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", b"uki", b"installer");
    std::fs::write(work.path().join("notes.txt"), b"mine").unwrap();
    let err = pull(&layout_ref(&bundle, ""), work.path(), &mut |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("neither an OCI image layout"),
        "{err}"
    );
    assert!(!work.path().join("blobs").exists(), "nothing written");

    let err = pull(
        &layout_ref(&work.path().join("missing"), ""),
        &work.path().join("cache"),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("has no index.json"), "{err}");

    write_test_bundle(&work.path().join("v3"), "3.0.0", b"uki3", b"installer");
    push(
        &work.path().join("v3"),
        &layout_ref(&bundle, ""),
        &mut |_| {},
    )
    .unwrap();
    let err = pull(
        &layout_ref(&bundle, ""),
        &work.path().join("cache"),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("several images"), "{err}");
    let err = pull(
        &layout_ref(&bundle, ":4.0.0"),
        &work.path().join("cache"),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, TransportError::NotFound { .. }), "{err}");
}

/// The bytes of every blob file in the layout at `dir`.
fn blob_file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn a_pulled_image_is_hashed_once_and_exported_without_hashing_it_again() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(7, 300_000), &noise(8, 20_000));
    add_fake_signature(&bundle, "2.0.0");
    let cache = work.path().join("cache");
    let start = slate_bundle::hashed_on_this_thread();
    let pulled = pull(&layout_ref(&bundle, ""), &cache, &mut |_| {}).unwrap();
    let after_pull = slate_bundle::hashed_on_this_thread();
    assert_eq!(
        after_pull - start,
        blob_file_bytes(&cache),
        "the pull hashes every byte it stores once"
    );

    let opened = pulled.open().unwrap();
    let mut tar = Vec::new();
    opened.export_tar(&mut tar).unwrap();
    assert_eq!(
        slate_bundle::hashed_on_this_thread(),
        after_pull,
        "opening and exporting the pulled image hash nothing again"
    );

    let out = work.path().join("exported");
    tar::Archive::new(&tar[..]).unpack(&out).unwrap();
    let exported = Bundle::open(&out, None).unwrap();
    assert_eq!(exported.digest(), opened.digest());
    exported.verify_blobs().unwrap();
    assert!(exported.signatures().unwrap().is_some());
}

#[test]
fn a_cached_blob_of_the_wrong_size_is_still_refused() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    let uki = noise(9, 5_000);
    write_test_bundle(&bundle, "2.0.0", &uki, &noise(10, 500));
    let cache = work.path().join("cache");
    let pulled = pull(&layout_ref(&bundle, ""), &cache, &mut |_| {}).unwrap();
    let path = cache
        .join("blobs/sha256")
        .join(&support::sha256(&uki)["sha256:".len()..]);
    std::fs::write(&path, &uki[..100]).unwrap();
    let err = pulled
        .open()
        .unwrap()
        .export_tar(&mut Vec::new())
        .unwrap_err();
    assert!(
        matches!(err, slate_bundle::BundleError::SizeMismatch { .. }),
        "{err}"
    );
}
