//! An honest fake registry over [`super::http::FakeServer`]: serves a layout as repository `os`,
//! so that a test can answer everything else as a hostile registry would.

use std::path::Path;

use super::http::{header_value, response, Request};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

pub fn find_tag(dir: &Path, tag: &str) -> Option<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .map(|m| m["digest"].as_str().unwrap().to_owned())
}

pub fn blob(dir: &Path, digest: &str) -> Option<Vec<u8>> {
    std::fs::read(
        dir.join("blobs/sha256")
            .join(digest.strip_prefix("sha256:")?),
    )
    .ok()
}

pub fn not_found() -> Vec<u8> {
    response(
        "404 Not Found",
        &[("Content-Type", "application/json")],
        br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
    )
}

/// An honest registry serving the layout at `dir` as repository `os` (with `Range`).
pub fn honest(dir: &Path, req: &Request) -> Vec<u8> {
    if let Some(reference) = req.path.strip_prefix("/v2/os/manifests/") {
        let digest = if reference.starts_with("sha256:") {
            Some(reference.to_owned())
        } else {
            find_tag(dir, reference)
        };
        return match digest.as_deref().and_then(|d| blob(dir, d)) {
            Some(bytes) => response(
                "200 OK",
                &[
                    ("Content-Type", OCI_MANIFEST),
                    ("Docker-Content-Digest", &digest.unwrap()),
                ],
                &bytes,
            ),
            None => not_found(),
        };
    }
    if let Some(digest) = req.path.strip_prefix("/v2/os/blobs/") {
        let Some(bytes) = blob(dir, digest) else {
            return not_found();
        };
        let from = header_value(&req.head, "range")
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse::<usize>().ok());
        return match from {
            Some(from) if from < bytes.len() => {
                let range = format!("bytes {from}-{}/{}", bytes.len() - 1, bytes.len());
                response(
                    "206 Partial Content",
                    &[("Content-Range", &range)],
                    &bytes[from..],
                )
            }
            _ => response("200 OK", &[], &bytes),
        };
    }
    not_found()
}
