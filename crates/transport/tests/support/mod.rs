//! Shared by the transport tests: bundles, signatures, progress counting, cache checks.
#![allow(dead_code)]

pub mod fake;
pub mod http;
pub mod registry;

use std::path::Path;

use sha2::Digest as _;
use slate_bundle::{BlobInput, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE};
use slate_transport::Event;

/// Deterministic bytes that do not compress.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// The digest of `bundle`'s UKI.
pub fn uki_blob(bundle: &slate_bundle::Bundle) -> String {
    bundle
        .blob_ref(slate_bundle::UKI_ROLE)
        .unwrap()
        .digest
        .clone()
}

/// The blob `digest` as the pull left it in the layout at `cache`, if there.
pub fn cached(cache: &Path, digest: &str) -> Option<Vec<u8>> {
    std::fs::read(
        cache
            .join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap()),
    )
    .ok()
}

/// A bundle of `version` at `dir` with a UKI and an installer of the given contents.
pub fn write_test_bundle(dir: &Path, version: &str, uki: &[u8], installer: &[u8]) {
    slate_bundle::write_bundle(
        dir,
        BundleSpec {
            name: "demo",
            version,
            arch: "x86_64",
            variant: "generic",
        },
        &[
            BlobInput {
                role: slate_bundle::UKI_ROLE,
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: uki,
            },
            BlobInput {
                role: slate_bundle::INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: installer,
            },
        ],
    )
    .expect("the bundle is written");
}

/// A bundle as the imager writes it, with a chunk index (issue 41): `uki` and a 2 MiB
/// installer that is the same in every version.
pub fn write_indexed_bundle(dir: &Path, version: &str, uki: &[u8]) -> slate_bundle::Bundle {
    write_indexed_bundle_of(dir, version, uki, &noise(99, 2 << 20))
}

/// [`write_indexed_bundle`] with the installer binary `installer`.
pub fn write_indexed_bundle_of(
    dir: &Path,
    version: &str,
    uki: &[u8],
    installer: &[u8],
) -> slate_bundle::Bundle {
    slate_bundle::write_installable_bundle_with(
        dir,
        BundleSpec {
            name: "slate",
            version,
            arch: "amd64",
            variant: "demo",
        },
        slate_bundle::InstallDefaults {
            esp_mib: 64,
            state_mib: 32,
            tries: 3,
            menu_timeout: 1,
            keep_versions: 2,
        },
        &[
            BlobInput {
                role: slate_bundle::UKI_ROLE,
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: uki,
            },
            BlobInput {
                role: slate_bundle::INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: installer,
            },
        ],
        slate_delta::DEFAULT_PARAMS,
    )
    .unwrap();
    slate_bundle::Bundle::open(dir, None).unwrap()
}

/// The digest of the manifest tagged `tag` in the layout at `dir`.
pub fn manifest_digest(dir: &Path, tag: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .map(|m| m["digest"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no tag {tag} in {}", dir.display()))
}

fn put_blob(dir: &Path, bytes: &[u8]) -> (String, usize) {
    let digest = sha256(bytes);
    let path = dir.join("blobs/sha256").join(&digest["sha256:".len()..]);
    std::fs::write(path, bytes).unwrap();
    (digest, bytes.len())
}

/// Add a cosign-shaped signature manifest for the image tagged `tag` (a config, one
/// simple-signing layer), tagged `sha256-<hex>.sig`. Returns that tag.
pub fn add_fake_signature(dir: &Path, tag: &str) -> String {
    let subject = manifest_digest(dir, tag);
    let payload = serde_json::to_vec(&serde_json::json!({
        "critical": {"image": {"docker-manifest-digest": subject}, "type": "cosign container image signature"}
    }))
    .unwrap();
    let (layer, layer_size) = put_blob(dir, &payload);
    let (config, config_size) = put_blob(
        dir,
        br#"{"architecture":"","os":"","rootfs":{"type":"layers","diff_ids":[]}}"#,
    );
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
        "layers": [{
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": layer, "size": layer_size,
            "annotations": {"dev.cosignproject.cosign/signature": "c2lnbmF0dXJl"}
        }]
    }))
    .unwrap();
    let (digest, size) = put_blob(dir, &manifest);
    let sig_tag = format!("sha256-{}.sig", &subject["sha256:".len()..]);
    let path = dir.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    index["manifests"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": size,
            "annotations": {"org.opencontainers.image.ref.name": sig_tag}
        }));
    std::fs::write(&path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    sig_tag
}

/// Counts what a transfer reports.
#[derive(Debug, Default)]
pub struct Counter {
    pub bytes: u64,
    /// `(digest, size, from)` of every blob transfer that started.
    pub starts: Vec<(String, u64, u64)>,
    pub present: Vec<String>,
    pub done: Vec<String>,
    pub manifests: Vec<(String, String)>,
    /// `(digest, fetch_bytes, reuse_bytes)` of every delta planned.
    pub deltas: Vec<(String, u64, u64)>,
    /// `(digest, reason)` of every delta given up for a whole download.
    pub fallbacks: Vec<(String, String)>,
    /// `(target digest, seed digest, offset, end)` of every seed chunk refused by its digest.
    pub refused: Vec<(String, String, u64, u64)>,
}

impl Counter {
    pub fn record(&mut self, event: Event<'_>) {
        match event {
            Event::Bytes(n) => self.bytes += n,
            Event::BlobStart { digest, size, from } => {
                self.starts.push((digest.to_owned(), size, from))
            }
            Event::BlobPresent { digest, .. } => self.present.push(digest.to_owned()),
            Event::BlobDone { digest } => self.done.push(digest.to_owned()),
            Event::Manifest { name, digest } => {
                self.manifests.push((name.to_owned(), digest.to_owned()))
            }
            Event::DeltaStart {
                digest,
                fetch_bytes,
                reuse_bytes,
                ..
            } => self
                .deltas
                .push((digest.to_owned(), fetch_bytes, reuse_bytes)),
            Event::DeltaFallback { digest, reason } => {
                self.fallbacks.push((digest.to_owned(), reason.to_owned()))
            }
            Event::SeedChunkRefused {
                digest,
                seed,
                offset,
                end,
            } => self
                .refused
                .push((digest.to_owned(), seed.to_owned(), offset, end)),
        }
    }
}

/// Every file under `blobs/sha256` hashes to its name (no unverified blob in the cache).
pub fn assert_only_verified_blobs(layout: &Path) {
    let dir = layout.join("blobs/sha256");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        assert_eq!(
            sha256(&bytes),
            format!("sha256:{name}"),
            "{} is not the blob its name says",
            entry.path().display()
        );
    }
}

/// Files in `incoming/` (partials and temporaries).
pub fn incoming(layout: &Path) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(layout.join("incoming"))
        .map(|entries| {
            entries
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().into_string().unwrap(),
                        e.metadata().unwrap().len(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Run `f` on another thread and wait at most `seconds` for it: a hang fails the test instead
/// of stalling the run (the stuck thread is left behind).
pub fn within_seconds<T: Send + 'static>(
    seconds: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(seconds))
        .unwrap_or_else(|_| panic!("no answer within {seconds} s: it waits on something"))
}

/// Replace the file at `path` with a FIFO.
pub fn make_fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Every file under `dir` with its bytes (symlinks as their target), sorted: for checking
/// that something wrote nothing.
pub fn snapshot(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.push((path.clone(), b"<dir>".to_vec()));
                walk(&path, out);
            } else if meta.file_type().is_symlink() {
                out.push((
                    path.clone(),
                    std::fs::read_link(&path)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                ));
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}
