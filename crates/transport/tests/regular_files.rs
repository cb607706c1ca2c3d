//! A layout is read through regular files only (issue 19): a FIFO, socket or symbolic link where
//! a layout has `index.json` or a blob is refused at once, saying what it is — never waited on
//! (a FIFO `index.json` made `slate verify` hang).
#![cfg(feature = "client")]

mod support;

use std::path::{Path, PathBuf};

use slate_transport::{plan_push, pull, Reference, TransportError};
use support::{make_fifo, noise, within_seconds, write_test_bundle};

fn layout_reference(dir: &Path) -> Reference {
    Reference::parse(&format!("oci-layout:{}:2.0.0", dir.display())).unwrap()
}

fn case() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(1, 50_000), &noise(2, 5_000));
    let cache = work.path().join("cache");
    (work, bundle, cache)
}

/// The path of the UKI blob in `bundle`.
fn uki_path(bundle: &Path) -> PathBuf {
    let digest = support::sha256(&noise(1, 50_000));
    bundle.join("blobs/sha256").join(&digest[7..])
}

fn refused(err: &TransportError, kind: &str) -> bool {
    matches!(err, TransportError::NotRegularFile { kind: k, .. } if *k == kind)
}

#[test]
fn a_fifo_index_is_refused_not_waited_on() {
    let (_work, bundle, cache) = case();
    make_fifo(&bundle.join("index.json"));
    let reference = layout_reference(&bundle);
    let err = within_seconds(10, move || {
        pull(&reference, &cache, &mut |_| {}).unwrap_err()
    });
    assert!(refused(&err, "a FIFO (named pipe)"), "{err:?}");
    assert!(
        err.to_string()
            .ends_with("index.json is a FIFO (named pipe), not a regular file: refused"),
        "{err}"
    );
    let dir = bundle.clone();
    let err = within_seconds(10, move || {
        plan_push(&dir, &layout_reference(&dir)).unwrap_err()
    });
    assert!(refused(&err, "a FIFO (named pipe)"), "{err:?}");
}

#[test]
fn a_fifo_blob_is_refused_not_waited_on() {
    let (_work, bundle, cache) = case();
    make_fifo(&uki_path(&bundle));
    let reference = layout_reference(&bundle);
    let cache2 = cache.clone();
    let err = within_seconds(10, move || {
        pull(&reference, &cache2, &mut |_| {}).unwrap_err()
    });
    assert!(refused(&err, "a FIFO (named pipe)"), "{err:?}");
    support::assert_only_verified_blobs(&cache);
}

#[test]
fn links_and_sockets_in_a_layout_are_refused() {
    let (work, bundle, cache) = case();
    let uki = uki_path(&bundle);
    let copy = work.path().join("uki");
    std::fs::rename(&uki, &copy).unwrap();
    std::os::unix::fs::symlink(&copy, &uki).unwrap();
    let err = pull(&layout_reference(&bundle), &cache, &mut |_| {}).unwrap_err();
    assert!(refused(&err, "a symbolic link"), "{err:?}");

    std::fs::remove_file(&uki).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(&uki).unwrap();
    let err = pull(&layout_reference(&bundle), &cache, &mut |_| {}).unwrap_err();
    assert!(refused(&err, "a socket"), "{err:?}");

    // The index as a link.
    std::fs::remove_file(&uki).unwrap();
    std::fs::rename(&copy, &uki).unwrap();
    let index = bundle.join("index.json");
    let moved = work.path().join("index.json");
    std::fs::rename(&index, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &index).unwrap();
    let err = pull(&layout_reference(&bundle), &cache, &mut |_| {}).unwrap_err();
    assert!(refused(&err, "a symbolic link"), "{err:?}");
    std::fs::remove_file(&index).unwrap();
    std::fs::rename(&moved, &index).unwrap();
    pull(&layout_reference(&bundle), &cache, &mut |_| {}).unwrap();
}

/// Something that is not a regular file under a blob's name in the cache is not that blob: it
/// is replaced by the real one.
#[test]
fn a_fifo_in_the_cache_is_replaced_by_the_blob() {
    let (_work, bundle, cache) = case();
    pull(&layout_reference(&bundle), &cache, &mut |_| {}).unwrap();
    let cached = uki_path(&cache);
    make_fifo(&cached);
    let reference = layout_reference(&bundle);
    let cache2 = cache.clone();
    let pulled = within_seconds(10, move || pull(&reference, &cache2, &mut |_| {}).unwrap());
    assert_eq!(pulled.fetched_bytes, 50_000);
    support::assert_only_verified_blobs(&cache);
    slate_transport::open_cached(&cache, "2.0.0")
        .unwrap()
        .verify_blobs()
        .unwrap();
}
