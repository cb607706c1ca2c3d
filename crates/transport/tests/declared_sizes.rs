//! Sizes a registry or a layout declares are checked before they are used, and never overflow
//! (issue 19: a blob declaring 2^64-1 bytes was reported as "is 0 bytes", and a debug build
//! panicked): a descriptor larger than any file, or a manifest declaring more than the pull's
//! limit, is refused before any blob is fetched, stating the declared size.
#![cfg(feature = "client")]

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use slate_transport::{plan_push, pull, Client, Reference, TransportError};
use support::fake::honest;
use support::http::FakeServer;
use support::{noise, sha256, write_test_bundle};

struct Case {
    _work: tempfile::TempDir,
    bundle: PathBuf,
    cache: PathBuf,
}

fn case() -> Case {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(1, 100_000), &noise(2, 5_000));
    let cache = work.path().join("cache");
    Case {
        _work: work,
        bundle,
        cache,
    }
}

/// Rewrite the manifest tagged 2.0.0 in `dir` with `edit` (the index follows).
fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let index_path = dir.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let old = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let blobs = dir.join("blobs/sha256");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blobs.join(&old[7..])).unwrap()).unwrap();
    edit(&mut manifest);
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let digest = sha256(&bytes);
    std::fs::write(blobs.join(&digest[7..]), &bytes).unwrap();
    index["manifests"][0]["digest"] = digest.into();
    index["manifests"][0]["size"] = bytes.len().into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

/// The layout served by a fake registry, counting blob requests.
fn serve(bundle: &Path) -> (FakeServer, Arc<AtomicUsize>) {
    let blob_requests = Arc::new(AtomicUsize::new(0));
    let (counter, bundle) = (blob_requests.clone(), bundle.to_owned());
    let server = FakeServer::start(move |req, _| {
        if req.path.contains("/blobs/") {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        honest(&bundle, req)
    });
    (server, blob_requests)
}

fn reference(server: &FakeServer) -> Reference {
    Reference::parse(&format!("{}/os:2.0.0", server.host)).unwrap()
}

#[test]
fn a_blob_declaring_2_pow_64_minus_1_bytes_is_refused_stating_it() {
    let case = case();
    // The empty blob, declared as 2^64-1 bytes: the old message was "is 0 bytes".
    let empty = sha256(b"");
    std::fs::write(case.bundle.join("blobs/sha256").join(&empty[7..]), b"").unwrap();
    edit_manifest(&case.bundle, |m| {
        m["layers"][0]["digest"] = empty.clone().into();
        m["layers"][0]["size"] = u64::MAX.into();
    });
    let (server, blob_requests) = serve(&case.bundle);
    let err = pull(&reference(&server), &case.cache, &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, TransportError::TooLarge { declared, .. } if declared == u128::from(u64::MAX)),
        "{err:?}"
    );
    assert!(
        text.contains("declares 18446744073709551615 bytes"),
        "{text}"
    );
    assert!(text.contains(&empty), "the blob is named: {text}");
    assert!(!text.contains("is 0 bytes"), "{text}");
    assert_eq!(blob_requests.load(Ordering::SeqCst), 0, "nothing fetched");
    support::assert_only_verified_blobs(&case.cache);
}

#[test]
fn a_manifest_declaring_more_than_the_limit_is_refused_before_any_blob() {
    let case = case();
    let (server, blob_requests) = serve(&case.bundle);
    let client = Client {
        max_image_bytes: 50_000,
        ..Client::default()
    };
    let err = client
        .pull(&reference(&server), &case.cache, &mut |_| {})
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, TransportError::TooLarge { limit: 50_000, .. }),
        "{err:?}"
    );
    assert!(
        text.contains("more than the limit of 50000 bytes"),
        "{text}"
    );
    assert!(text.contains("--max-image-size"), "{text}");
    assert_eq!(blob_requests.load(Ordering::SeqCst), 0, "nothing fetched");
    assert_eq!(support::incoming(&case.cache), []);

    // Layers that add up past 2^64: the sum is exact, not wrapped.
    edit_manifest(&case.bundle, |m| {
        m["layers"][0]["size"] = (i64::MAX as u64).into();
        m["layers"][1]["size"] = (i64::MAX as u64).into();
    });
    let client = Client {
        max_image_bytes: u64::MAX,
        ..Client::default()
    };
    let err = client
        .pull(&reference(&server), &case.cache, &mut |_| {})
        .unwrap_err();
    assert!(
        matches!(err, TransportError::TooLarge { declared, .. } if declared > u128::from(u64::MAX) - 1),
        "{err:?}"
    );
    assert_eq!(blob_requests.load(Ordering::SeqCst), 0);

    // The default limit lets a real bundle through.
    let case = self::case();
    let (server, _) = serve(&case.bundle);
    pull(&reference(&server), &case.cache, &mut |_| {}).unwrap();
}

/// A resumed download whose 206 announces a `Content-Length` past 2^64 (an overflow, and a
/// panic in a debug build) is an error naming the answer.
#[test]
fn a_content_length_past_2_pow_64_is_an_error_not_an_overflow() {
    let case = case();
    let uki = noise(1, 100_000);
    let uki_digest = sha256(&uki);
    // A partial of the UKI from an earlier, interrupted pull.
    std::fs::create_dir_all(case.cache.join("incoming")).unwrap();
    std::fs::create_dir_all(case.cache.join("blobs/sha256")).unwrap();
    std::fs::write(
        case.cache.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(
        case.cache
            .join(format!("incoming/{}.partial", &uki_digest[7..])),
        &uki[..1000],
    )
    .unwrap();
    let bundle = case.bundle.clone();
    let target = format!("/v2/os/blobs/{uki_digest}");
    let server = FakeServer::start(move |req, _| {
        if req.path == target {
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 1000-99999/100000\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                u64::MAX
            );
            return head.into_bytes();
        }
        honest(&bundle, req)
    });
    let err = pull(&reference(&server), &case.cache, &mut |_| {}).unwrap_err();
    println!("{err}");
    assert!(
        err.to_string().contains(&format!(
            "its Content-Length, {} bytes from byte 1000, is more than any blob",
            u64::MAX
        )),
        "{err:?}"
    );
    support::assert_only_verified_blobs(&case.cache);
}

/// `slate push --dry-run` plans from the layout alone: a declared size no file can have is
/// refused there too, stating it (the plan's total used to overflow).
#[test]
fn a_push_plan_refuses_sizes_no_file_can_have() {
    let case = case();
    edit_manifest(&case.bundle, |m| {
        m["layers"][0]["size"] = u64::MAX.into();
        m["layers"][1]["size"] = u64::MAX.into();
    });
    let reference = Reference::parse(&format!("oci-layout:{}", case.cache.display())).unwrap();
    let err = plan_push(&case.bundle, &reference).unwrap_err();
    assert!(
        err.to_string()
            .contains("declares 18446744073709551615 bytes"),
        "{err}"
    );
}
