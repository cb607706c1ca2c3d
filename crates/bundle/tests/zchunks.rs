//! The compressed chunks (issue 41, formats.md §7.8) as the bundle writer lays them out: the
//! table a signed layer, the compressed blob and its manifest under `blobs/sha256` with no
//! `index.json` entry, so what an older slate reads is unchanged.

#[path = "support/installable.rs"]
mod installable;

use std::path::Path;

use installable::write;
use slate_bundle::{zchunks_manifest, Bundle, Digest};
use slate_delta::zchunks::{inflate, ZChunk};
use slate_delta::DEFAULT_PARAMS;

/// Half text (compresses), half xorshift noise (does not): both kinds of chunk.
fn mixed(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    let mut line = 0u64;
    while out.len() < len {
        if (out.len() / 200_000) % 2 == 0 {
            out.extend_from_slice(format!("line {line} of seed {seed}: slate delta\n").as_bytes());
            line += 1;
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push(x as u8);
        }
    }
    out.truncate(len);
    out
}

fn blob(dir: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(
        dir.join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap()),
    )
    .unwrap()
}

#[test]
fn the_table_is_signed_and_each_frame_gives_its_chunk_back() {
    let (uki, installer) = (mixed(1 << 20, 1), mixed(600 << 10, 2));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    let bundle = Bundle::open(dir.path(), None).unwrap();
    let index = bundle.chunk_index().unwrap().unwrap();
    let (table, chunks) = bundle.zchunk_table().unwrap().unwrap();
    assert_eq!(chunks.blob, Digest::from_raw(table.blob).to_string());
    let compressed = blob(dir.path(), &chunks.blob);
    assert_eq!(compressed.len() as u64, table.blob_size);
    let (mut raw, mut zstd) = (0, 0);
    for listed in &index.blobs {
        let bytes = if listed.oci_digest() == Digest::of(&uki).to_string() {
            &uki
        } else {
            &installer
        };
        for c in &listed.chunks {
            let range = c.offset as usize..(c.offset + u64::from(c.length)) as usize;
            match chunks.by_raw[&c.digest] {
                ZChunk::Raw => raw += 1,
                ZChunk::Zstd { offset, length, .. } => {
                    zstd += 1;
                    let frame = &compressed[offset as usize..(offset + u64::from(length)) as usize];
                    assert_eq!(inflate(frame, c.length as usize).unwrap(), bytes[range]);
                }
            }
        }
    }
    assert!(raw > 0 && zstd > 0, "{raw} raw, {zstd} compressed");
    // The manifest `slate push` tags `.zchunks` is in the layout, rebuilt from the table alone.
    let manifest = zchunks_manifest(&table).unwrap();
    assert_eq!(blob(dir.path(), Digest::of(&manifest).as_str()), manifest);
    // Every layer, the table included, verifies as any blob.
    bundle.verify_blobs().unwrap();
}

#[test]
fn what_an_older_slate_reads_is_unchanged() {
    let (uki, installer) = (mixed(1 << 20, 1), mixed(600 << 10, 2));
    let with = tempfile::tempdir().unwrap();
    let without = tempfile::tempdir().unwrap();
    write(with.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    write(without.path(), &uki, &installer, None);
    // An older reader takes the only index.json entry that is not a signature: there is one.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(with.path().join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    let new = Bundle::open(with.path(), None).unwrap();
    let old = Bundle::open(without.path(), None).unwrap();
    assert_eq!(new.manifest(), old.manifest());
    // The index and the table: two layers no role names, which older readers pass over.
    assert_eq!(new.image_blobs().len(), old.image_blobs().len() + 2);
    let oci: serde_json::Value = serde_json::from_slice(new.manifest_bytes()).unwrap();
    let types: Vec<&str> = oci["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap())
        .collect();
    assert_eq!(
        types[2..],
        [
            slate_delta::CHUNK_INDEX_MEDIA_TYPE,
            slate_delta::zchunks::ZTABLE_MEDIA_TYPE
        ]
    );
    // A bundle without a table reads as none.
    assert_eq!(old.zchunk_table().unwrap(), None);
}

#[test]
fn a_changed_table_is_refused_by_the_signed_digest() {
    let (uki, installer) = (mixed(1 << 20, 1), mixed(600 << 10, 2));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    let bundle = Bundle::open(dir.path(), None).unwrap();
    let oci: serde_json::Value = serde_json::from_slice(bundle.manifest_bytes()).unwrap();
    let layer = oci["layers"][3]["digest"].as_str().unwrap().to_owned();
    let path = dir
        .path()
        .join("blobs/sha256")
        .join(layer.strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[90] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = Bundle::open(dir.path(), None)
        .unwrap()
        .zchunk_table()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the compressed chunk table does not match its digest"),
        "{err}"
    );
}

#[test]
fn two_writes_give_the_same_bytes() {
    let (uki, installer) = (mixed(1 << 20, 3), mixed(600 << 10, 4));
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    write(a.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    write(b.path(), &uki, &installer, Some(DEFAULT_PARAMS));
    let list = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir.join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    assert_eq!(list(a.path()), list(b.path()));
    for file in ["index.json", "oci-layout"] {
        assert_eq!(
            std::fs::read(a.path().join(file)).unwrap(),
            std::fs::read(b.path().join(file)).unwrap()
        );
    }
}

#[test]
fn the_download_up_front_counts_compressed_frames() {
    let v1_uki = mixed(1 << 20, 5);
    let mut v2_uki = v1_uki.clone();
    // 100 kB of new text in the compressible half.
    v2_uki.splice(50_000..50_000, mixed(100_000, 6).iter().copied());
    let installer = mixed(600 << 10, 2);
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(d1.path(), &v1_uki, &installer, Some(DEFAULT_PARAMS));
    write(d2.path(), &v2_uki, &installer, Some(DEFAULT_PARAMS));
    let v1 = Bundle::open(d1.path(), None).unwrap();
    let v2 = Bundle::open(d2.path(), None).unwrap();
    let held = v1.chunk_index().unwrap().unwrap();
    let d = v2.download(Ok(&held)).unwrap();
    assert!(d.compressed && d.whole.is_none(), "{d:?}");
    assert!(
        d.text().contains("chunks by range requests, compressed;"),
        "{}",
        d.text()
    );
    // Raw, the same chunks cost their lengths.
    let raw = slate_delta::estimate(&v2.chunk_index().unwrap().unwrap(), &[&held]);
    let raw_chunks: u64 = raw.blobs.iter().map(|b| b.fetch_bytes).sum();
    let whole: u64 = d.total_bytes - raw.full_bytes();
    assert_eq!(d.fetch_chunks, raw.fetch_chunks());
    assert!(raw_chunks >= 100_000, "{raw_chunks}");
    assert!(
        d.fetch_bytes - whole < raw_chunks / 4,
        "compressed {} of raw {raw_chunks}",
        d.fetch_bytes - whole
    );
}
