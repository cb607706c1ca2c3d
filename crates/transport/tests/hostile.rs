//! "Registries" that answer junk, lie about types, sizes and digests, or stop halfway: every
//! pull fails with an error that names the problem, and the cache never holds an unverified
//! blob.
#![cfg(feature = "client")]

mod support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use slate_bundle::Bundle;
use slate_transport::{pull, pull_with, Credentials, Options, Reference, TransportError};
use support::fake::{honest, OCI_MANIFEST};
use support::http::{header_value, response, FakeServer, Request};
use support::{assert_only_verified_blobs, incoming, noise, write_test_bundle};

struct Case {
    _work: tempfile::TempDir,
    bundle: PathBuf,
    cache: PathBuf,
    uki: Vec<u8>,
}

impl Case {
    fn new() -> Self {
        let work = tempfile::tempdir().unwrap();
        let bundle = work.path().join("bundle");
        let uki = noise(1, 100_000);
        write_test_bundle(&bundle, "2.0.0", &uki, &noise(2, 5_000));
        let cache = work.path().join("cache");
        Case {
            _work: work,
            bundle,
            cache,
            uki,
        }
    }

    fn uki_digest(&self) -> String {
        support::sha256(&self.uki)
    }

    /// Pull `os:2.0.0` from a server answering with `answer` (given the honest answer).
    fn pull(
        &self,
        answer: impl Fn(&Request, Vec<u8>) -> Vec<u8> + Send + Sync + 'static,
    ) -> TransportError {
        let bundle = self.bundle.clone();
        let server = FakeServer::start(move |req, _| answer(req, honest(&bundle, req)));
        let reference = Reference::parse(&format!("{}/os:2.0.0", server.host)).unwrap();
        let err = pull(&reference, &self.cache, &mut |_| {}).expect_err("the pull fails");
        println!("{err}");
        assert_only_verified_blobs(&self.cache);
        assert!(
            Bundle::open(&self.cache, Some("2.0.0")).is_err(),
            "a failed pull tags nothing"
        );
        err
    }
}

fn is_manifest(req: &Request) -> bool {
    req.path.contains("/manifests/")
}

#[test]
fn the_honest_fake_serves_a_pull() {
    let case = Case::new();
    let bundle = case.bundle.clone();
    let server = FakeServer::start(move |req, _| honest(&bundle, req));
    let reference = Reference::parse(&format!("{}/os:2.0.0", server.host)).unwrap();
    let pulled = pull(&reference, &case.cache, &mut |_| {}).unwrap();
    assert_eq!(pulled.signature_tag, None);
    Bundle::open(&case.cache, Some("2.0.0")).unwrap();
}

#[test]
fn junk_instead_of_http() {
    let case = Case::new();
    let err =
        case.pull(|_, _| b"SSH-2.0-OpenSSH_9.2\r\n\x00\x01\x02 garbage \xff\xfe\r\n\r\n".to_vec());
    assert!(matches!(err, TransportError::NotHttp { .. }), "{err:?}");
    assert!(err.to_string().starts_with("GET http://"), "{err}");
    assert!(err.to_string().contains("the answer is not HTTP"), "{err}");
}

#[test]
fn a_manifest_of_the_wrong_content_type() {
    let case = Case::new();
    let err = case.pull(|req, honest| {
        if is_manifest(req) {
            response(
                "200 OK",
                &[("Content-Type", "text/html; charset=utf-8")],
                b"<html>login</html>",
            )
        } else {
            honest
        }
    });
    assert!(
        matches!(&err, TransportError::MediaType { actual, .. } if actual == "text/html"),
        "{err:?}"
    );
    assert!(err
        .to_string()
        .contains("expected application/vnd.oci.image.manifest.v1+json"));
}

#[test]
fn a_manifest_that_is_not_json() {
    let case = Case::new();
    let err = case.pull(|req, honest| {
        if is_manifest(req) {
            response("200 OK", &[("Content-Type", OCI_MANIFEST)], b"{not json")
        } else {
            honest
        }
    });
    assert!(matches!(err, TransportError::Malformed { .. }), "{err:?}");
    assert!(err.to_string().contains("it is not JSON"), "{err}");
}

#[test]
fn json_that_is_not_a_manifest() {
    let case = Case::new();
    let err = case.pull(|req, honest| {
        if is_manifest(req) {
            response(
                "200 OK",
                &[("Content-Type", OCI_MANIFEST)],
                br#"{"hello":1}"#,
            )
        } else {
            honest
        }
    });
    assert!(
        err.to_string().contains("it is not an OCI image manifest"),
        "{err}"
    );
}

#[test]
fn an_image_index_is_refused_by_name() {
    let case = Case::new();
    let err = case.pull(|req, honest| {
        if is_manifest(req) {
            response(
                "200 OK",
                &[("Content-Type", "application/vnd.oci.image.index.v1+json")],
                br#"{"schemaVersion":2,"manifests":[]}"#,
            )
        } else {
            honest
        }
    });
    assert!(err.to_string().contains("an image index"), "{err}");
}

#[test]
fn an_oversized_manifest() {
    let case = Case::new();
    let err = case.pull(|req, honest| {
        if is_manifest(req) {
            response(
                "200 OK",
                &[("Content-Type", OCI_MANIFEST)],
                &vec![b' '; 300 * 1024],
            )
        } else {
            honest
        }
    });
    assert!(
        matches!(err, TransportError::Oversize { limit: 262144, .. }),
        "{err:?}"
    );
}

#[test]
fn a_manifest_that_is_not_what_the_registry_says() {
    let case = Case::new();
    let err = case.pull(|req, honest| {
        if is_manifest(req) {
            let text = String::from_utf8_lossy(&honest).replace(
                "Docker-Content-Digest: sha256:",
                "Docker-Content-Digest: sha256:0000",
            );
            text.into_bytes()
        } else {
            honest
        }
    });
    assert!(
        matches!(err, TransportError::DigestMismatch { .. }),
        "{err:?}"
    );
}

#[test]
fn a_blob_with_the_wrong_digest_never_enters_the_cache() {
    let case = Case::new();
    let uki = case.uki_digest();
    let len = case.uki.len();
    let err = case.pull(move |req, honest| {
        if req.path.ends_with(&uki) {
            response("200 OK", &[], &noise(99, len))
        } else {
            honest
        }
    });
    assert!(
        matches!(&err, TransportError::DigestMismatch { expected, .. } if *expected == case.uki_digest()),
        "{err:?}"
    );
    assert!(
        incoming(&case.cache).is_empty(),
        "the partial is deleted: {:?}",
        incoming(&case.cache)
    );
    assert!(!case
        .cache
        .join("blobs/sha256")
        .join(&case.uki_digest()[7..])
        .exists());
}

#[test]
fn a_truncated_download_is_kept_and_resumed() {
    let case = Case::new();
    let uki = case.uki_digest();
    let err = case.pull(move |req, honest| {
        if req.path.ends_with(&uki) {
            // Announce the whole blob, send 30 000 bytes of it, close.
            let head_end = honest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            honest[..head_end + 30_000].to_vec()
        } else {
            honest
        }
    });
    assert!(
        matches!(
            err,
            TransportError::Truncated {
                received: 30_000,
                expected: 100_000,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        incoming(&case.cache),
        [(format!("{}.partial", &case.uki_digest()[7..]), 30_000)]
    );

    let bundle = case.bundle.clone();
    let ranges = Arc::new(AtomicUsize::new(0));
    let seen = ranges.clone();
    let server = FakeServer::start(move |req, _| {
        if header_value(&req.head, "range") == Some("bytes=30000-") {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        honest(&bundle, req)
    });
    let reference = Reference::parse(&format!("{}/os:2.0.0", server.host)).unwrap();
    let pulled = pull(&reference, &case.cache, &mut |_| {}).unwrap();
    assert_eq!(ranges.load(Ordering::SeqCst), 1);
    assert_eq!(pulled.fetched_bytes, 70_000 + 5_000);
    let opened = Bundle::open(&case.cache, Some("2.0.0")).unwrap();
    assert_eq!(opened.read_blob(slate_bundle::UKI_ROLE).unwrap(), case.uki);
}

#[test]
fn a_blob_announced_larger_than_its_descriptor() {
    let case = Case::new();
    let uki = case.uki_digest();
    let len = case.uki.len();
    let err = case.pull(move |req, honest| {
        if req.path.ends_with(&uki) {
            response("200 OK", &[], &noise(1, len + 10))
        } else {
            honest
        }
    });
    assert!(
        matches!(
            err,
            TransportError::SizeMismatch {
                expected: 100_000,
                actual: 100_010,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(incoming(&case.cache).is_empty());
}

#[test]
fn a_blob_that_runs_past_its_descriptor() {
    let case = Case::new();
    let uki = case.uki_digest();
    let len = case.uki.len();
    let err = case.pull(move |req, honest| {
        if req.path.ends_with(&uki) {
            // No Content-Length: the body ends when the connection closes.
            let mut out = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
            out.extend(noise(1, len + 10));
            out
        } else {
            honest
        }
    });
    assert!(
        matches!(err, TransportError::Oversize { limit: 100_000, .. }),
        "{err:?}"
    );
    assert!(incoming(&case.cache).is_empty());
}

#[test]
fn a_partial_answer_from_the_wrong_offset() {
    let case = Case::new();
    let uki = case.uki_digest();
    // Leave a partial, then answer the range request from the wrong place.
    let first = uki.clone();
    case.pull(move |req, honest| {
        if req.path.ends_with(&first) {
            let head_end = honest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            honest[..head_end + 10].to_vec()
        } else {
            honest
        }
    });
    let err = case.pull(move |req, honest| {
        if req.path.ends_with(&uki) {
            response(
                "206 Partial Content",
                &[("Content-Range", "bytes 0-99999/100000")],
                &[0; 100_000],
            )
        } else {
            honest
        }
    });
    assert!(
        err.to_string().contains("starts at byte 0, not at 10"),
        "{err}"
    );
}

#[test]
fn a_server_error_is_reported_with_its_code() {
    let case = Case::new();
    let err = case.pull(|_, _| {
        response(
            "500 Internal Server Error",
            &[("Content-Type", "application/json")],
            br#"{"errors":[{"code":"UNKNOWN","message":"storage is on fire"}]}"#,
        )
    });
    assert!(
        matches!(err, TransportError::Status { status: 500, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .ends_with("the registry answered 500: UNKNOWN: storage is on fire"),
        "{err}"
    );
}

#[test]
fn credentials_are_asked_for_by_name() {
    let case = Case::new();
    let err = case.pull(|_, _| {
        response(
            "401 Unauthorized",
            &[("WWW-Authenticate", r#"Basic realm="registry""#)],
            b"",
        )
    });
    assert!(
        matches!(err, TransportError::Unauthorized { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("SLATE_REGISTRY_USERNAME"), "{err}");
}

/// The bearer-token dance: 401 with a challenge, a token from the realm (with basic
/// credentials), the request again with the token.
#[test]
fn bearer_tokens_are_fetched_from_the_realm() {
    let case = Case::new();
    let bundle = case.bundle.clone();
    let server = FakeServer::start(move |req, host| {
        if req.path.starts_with("/token?") {
            assert!(
                req.path.contains("scope=repository%3Aos%3Apull"),
                "{}",
                req.path
            );
            assert!(req.path.contains("service=fake"), "{}", req.path);
            // "user:secret"
            assert_eq!(
                header_value(&req.head, "authorization"),
                Some("Basic dXNlcjpzZWNyZXQ=")
            );
            return response("200 OK", &[], br#"{"token":"t0k3n"}"#);
        }
        if header_value(&req.head, "authorization") != Some("Bearer t0k3n") {
            let challenge = format!(
                r#"Bearer realm="http://{host}/token",service="fake",scope="repository:os:pull""#
            );
            return response("401 Unauthorized", &[("WWW-Authenticate", &challenge)], b"");
        }
        honest(&bundle, req)
    });
    let reference = Reference::parse(&format!("{}/os:2.0.0", server.host)).unwrap();
    let options = Options {
        credentials: Some(Credentials {
            username: "user".into(),
            password: "secret".into(),
        }),
        ..Options::default()
    };
    pull_with(&reference, &case.cache, &options, &mut |_| {}).unwrap();
    Bundle::open(&case.cache, Some("2.0.0")).unwrap();
}
