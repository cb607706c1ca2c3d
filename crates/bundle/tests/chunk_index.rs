//! The chunk index layer (issue 41): written by `write_installable_bundle_with`, read and
//! checked by `Bundle::chunk_index`, invisible to what older slate reads.

#[path = "support/installable.rs"]
mod installable;

use installable::write;
use slate_bundle::{Bundle, CHUNK_INDEX_MEDIA_TYPE};
use slate_delta::{chunk_blob, ChunkIndex, DEFAULT_PARAMS};

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn index_layer(bundle: &Bundle) -> std::path::PathBuf {
    let manifest: serde_json::Value = serde_json::from_slice(bundle.manifest_bytes()).unwrap();
    let layer = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["mediaType"] == CHUNK_INDEX_MEDIA_TYPE)
        .unwrap();
    let digest = layer["digest"].as_str().unwrap();
    bundle
        .dir()
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

#[test]
fn the_index_lists_the_large_blobs_and_leaves_the_bundle_manifest_alone() {
    let (uki, installer) = (noise(3 << 20, 1), noise(2 << 20, 2));
    let with = tempfile::tempdir().unwrap();
    let without = tempfile::tempdir().unwrap();
    write(with.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    write(without.path(), &uki, &installer, None);
    let bundle = Bundle::open(with.path(), None).unwrap();
    let index = bundle.chunk_index().unwrap().unwrap();
    assert_eq!(
        index,
        ChunkIndex {
            params: DEFAULT_PARAMS,
            blobs: vec![
                chunk_blob(&uki, DEFAULT_PARAMS),
                chunk_blob(&installer, DEFAULT_PARAMS)
            ],
        }
    );
    // What an older slate reads — the bundle manifest, the roles — is the same either way.
    let old = Bundle::open(without.path(), None).unwrap();
    assert_eq!(bundle.manifest(), old.manifest());
    assert_eq!(old.chunk_index().unwrap(), None);
    assert_eq!(bundle.image_blobs().len(), old.image_blobs().len() + 1);
    bundle.verify_blobs().unwrap();
    // A small blob is not listed, and a bundle of small blobs has no index.
    let small = tempfile::tempdir().unwrap();
    write(small.path(), b"uki", b"installer", Some(DEFAULT_PARAMS));
    let small = Bundle::open(small.path(), None).unwrap();
    assert_eq!(small.chunk_index().unwrap(), None);
}

#[test]
fn a_changed_or_foreign_index_is_refused() {
    let (uki, installer) = (noise(3 << 20, 1), noise(2 << 20, 2));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    let path = index_layer(&Bundle::open(dir.path(), None).unwrap());
    let good = std::fs::read(&path).unwrap();

    // A byte changed: the signed manifest's digest no longer matches.
    let mut changed = good.clone();
    changed[100] ^= 1;
    std::fs::write(&path, &changed).unwrap();
    let err = Bundle::open(dir.path(), None)
        .unwrap()
        .chunk_index()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the chunk index does not match its digest"),
        "{err}"
    );

    // An index (re-signed, as a buggy or hostile builder would) listing a blob the bundle
    // does not carry: refused when read, by name.
    let other = tempfile::tempdir().unwrap();
    let foreign = ChunkIndex {
        params: DEFAULT_PARAMS,
        blobs: vec![chunk_blob(&noise(2 << 20, 9), DEFAULT_PARAMS)],
    };
    write(other.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    let bundle = Bundle::open(other.path(), None).unwrap();
    let manifest = String::from_utf8(bundle.manifest_bytes().to_vec()).unwrap();
    let path = index_layer(&bundle);
    let old_digest = format!("sha256:{}", path.file_name().unwrap().to_str().unwrap());
    let bytes = foreign.to_bytes();
    let new_digest = format!("sha256:{}", hex::encode(slate_delta::sha256(&bytes)));
    std::fs::write(
        path.with_file_name(new_digest.strip_prefix("sha256:").unwrap()),
        &bytes,
    )
    .unwrap();
    let manifest = manifest.replace(&old_digest, &new_digest).replace(
        &format!("\"size\": {}", good.len()),
        &format!("\"size\": {}", bytes.len()),
    );
    let manifest_digest = hex::encode(slate_delta::sha256(manifest.as_bytes()));
    std::fs::write(
        other.path().join("blobs/sha256").join(&manifest_digest),
        &manifest,
    )
    .unwrap();
    let index = std::fs::read_to_string(other.path().join("index.json")).unwrap();
    let index = index
        .replace(
            bundle.manifest_digest(),
            &format!("sha256:{manifest_digest}"),
        )
        .replace(
            &format!("\"size\": {}", bundle.manifest_bytes().len()),
            &format!("\"size\": {}", manifest.len()),
        );
    std::fs::write(other.path().join("index.json"), index).unwrap();
    let err = Bundle::open(other.path(), None)
        .unwrap()
        .chunk_index()
        .unwrap_err()
        .to_string();
    assert!(err.contains("which is not a blob of the bundle"), "{err}");
}

/// `slate upgrade --check`'s figure (issue 41): what a node holding the running version's
/// chunks downloads — the changed chunks and the small blobs — against the whole bundle.
#[test]
fn the_download_is_the_chunks_the_node_lacks_and_the_blobs_no_index_lists() {
    let (v1_uki, installer) = (noise(3 << 20, 1), noise(2 << 20, 2));
    let mut v2_uki = v1_uki.clone();
    v2_uki[(1 << 20)..(1 << 20) + 100].fill(0);
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(d1.path(), &v1_uki, &installer, Some(DEFAULT_PARAMS));
    write(d2.path(), &v2_uki, &installer, Some(DEFAULT_PARAMS));
    let (v1, v2) = (
        Bundle::open(d1.path(), None).unwrap(),
        Bundle::open(d2.path(), None).unwrap(),
    );
    let held = v1.chunk_index().unwrap().unwrap();
    let total: u64 = v2.image_blobs().iter().map(|(_, s)| s).sum();
    let d = v2.download(Ok(&held)).unwrap();
    assert_eq!(d.total_bytes, total);
    assert_eq!(d.whole, None);
    // One or two chunks of the UKI (at most 128 KiB each), the index, systemd-boot and the
    // documents: well under 5 % of 5 MiB.
    assert!((1..=3).contains(&d.fetch_chunks), "{d:?}");
    assert!(d.fetch_bytes < total / 20, "{d:?}");
    assert_eq!(
        d.reuse_bytes + d.fetch_bytes - (total - (5 << 20)),
        5 << 20,
        "{d:?}"
    );
    assert!(d
        .text()
        .starts_with(&format!("download: {} of {total} bytes (", d.fetch_bytes)));
    // The same binary: nothing to derive, the figure is exact.
    assert!(!d.derives_root_copy, "{d:?}");

    // A new binary: the node will derive the new root's copy of it, so the figure is a bound.
    let d3 = tempfile::tempdir().unwrap();
    write(d3.path(), &v2_uki, &noise(2 << 20, 4), Some(DEFAULT_PARAMS));
    let v3 = Bundle::open(d3.path(), None).unwrap();
    let d = v3.download(Ok(&held)).unwrap();
    assert!(d.derives_root_copy, "{d:?}");
    assert!(
        d.text().starts_with("download: at most ")
            && d.text().ends_with(
                "derives the new root's copy of it once fetched, so the UKI may fetch less"
            ),
        "{}",
        d.text()
    );

    // A node that does not say, or that holds nothing of it: the whole bundle.
    let d = v2
        .download(Err("the node does not list the chunks it holds"))
        .unwrap();
    assert_eq!((d.fetch_bytes, d.fetch_chunks), (total, 0));
    assert_eq!(
        d.text(),
        format!(
            "download: {total} bytes, the whole bundle (the node does not list the chunks it \
             holds)"
        )
    );
    let nothing = ChunkIndex {
        params: DEFAULT_PARAMS,
        blobs: vec![chunk_blob(&noise(1 << 20, 9), DEFAULT_PARAMS)],
    };
    assert_eq!(v2.download(Ok(&nothing)).unwrap().fetch_bytes, total);
}
