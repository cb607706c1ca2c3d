//! Compressed chunks end to end (issue 41, formats.md §7.8): `slate push` puts the compressed
//! blob beside the image under `sha256-<hex>.zchunks`, and a delta pull fetches the frames it
//! needs from it — fewer bytes than the raw ranges a bundle pushed without it costs, the same
//! blob in the end. A frame served corrupt is refused before zstd reads it.
#![cfg(feature = "client")]

mod support;

use std::path::Path;

use slate_bundle::Bundle;
use slate_transport::{Client, Options, Pulled, Reference};
use support::registry::TestRegistry;
use support::{assert_only_verified_blobs, cached, noise, uki_blob, write_indexed_bundle, Counter};

/// Text that compresses (numbered lines) with stretches of noise that does not.
fn mixed(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut line = 0u64;
    while out.len() < len {
        if (out.len() / 300_000) % 3 == 2 {
            out.extend(noise(seed + line, 4096));
        } else {
            out.extend_from_slice(
                format!("{seed}: line {line}, a delta that compresses\n").as_bytes(),
            );
        }
        line += 1;
    }
    out.truncate(len);
    out
}

/// v1's UKI, and v2's: 300 kB of text inserted at 3 MiB of 6 MiB.
fn ukis() -> (Vec<u8>, Vec<u8>) {
    let v1 = mixed(7, 6 << 20);
    let mut v2 = v1.clone();
    v2.splice(3 << 20..3 << 20, mixed(8, 300_000));
    (v1, v2)
}

fn pull(reference: &Reference, cache: &Path) -> (Pulled, Counter) {
    let mut counter = Counter::default();
    let pulled = Client::new(Options::default())
        .pull_with_seeds(reference, cache, Vec::new(), &mut |e| counter.record(e))
        .unwrap();
    (pulled, counter)
}

/// The bundle's compressed blob, removed from its directory: pushed so, it has no `.zchunks`.
fn drop_compressed_blob(bundle: &Bundle) {
    let (_, z) = bundle.zchunk_table().unwrap().unwrap();
    std::fs::remove_file(
        bundle
            .dir()
            .join("blobs/sha256")
            .join(z.blob.strip_prefix("sha256:").unwrap()),
    )
    .unwrap();
}

fn zchunks_tag(bundle: &Bundle) -> String {
    slate_bundle::zchunks_tag_of(bundle.digest())
}

#[test]
fn a_registry_delta_fetches_compressed_frames_and_falls_back_to_raw_ranges_without_them() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let (v1_uki, v2_uki) = ukis();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    write_indexed_bundle(dirs[0].path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(dirs[1].path(), "2.0.0", &v2_uki);
    // The same v2 without its compressed blob: a bundle pushed without `.zchunks`.
    let raw = write_indexed_bundle(dirs[2].path(), "2.0.0", &v2_uki);
    assert_eq!(
        raw.digest(),
        v2.digest(),
        "the same signed image either way"
    );
    drop_compressed_blob(&raw);

    let image = |r: &str| Reference::parse(&registry.image(r)).unwrap();
    slate_transport::push(dirs[0].path(), &image("z/os:1.0.0"), &mut |_| {}).unwrap();
    let pushed = slate_transport::push(dirs[1].path(), &image("z/os:2.0.0"), &mut |_| {}).unwrap();
    assert!(
        pushed
            .references
            .iter()
            .any(|r| r.ends_with(&format!(":{}", zchunks_tag(&v2)))),
        "{:?}",
        pushed.references
    );
    slate_transport::push(dirs[0].path(), &image("r/os:1.0.0"), &mut |_| {}).unwrap();
    let pushed = slate_transport::push(dirs[2].path(), &image("r/os:2.0.0"), &mut |_| {}).unwrap();
    assert!(
        !pushed.references.iter().any(|r| r.contains(".zchunks")),
        "{:?}",
        pushed.references
    );

    let mut fetched = Vec::new();
    for repo in ["z/os", "r/os"] {
        let cache = tempfile::tempdir().unwrap();
        pull(&image(&format!("{repo}:1.0.0")), cache.path());
        let (pulled, counter) = pull(&image(&format!("{repo}:2.0.0")), cache.path());
        assert!(counter.fallbacks.is_empty(), "{:?}", counter.fallbacks);
        assert_eq!(counter.deltas.len(), 1, "{:?}", counter.deltas);
        // The bytes the plan announced are the bytes that came for the UKI's chunks.
        let (_, announced, _) = &counter.deltas[0];
        assert!(
            pulled.fetched_bytes >= *announced && pulled.fetched_bytes < announced + 80_000,
            "{pulled:?} {:?}",
            counter.deltas
        );
        assert!(cached(cache.path(), &uki_blob(&v2)) == Some(v2_uki.clone()));
        assert_only_verified_blobs(cache.path());
        fetched.push(*announced);
    }
    let (compressed, raw) = (fetched[0], fetched[1]);
    eprintln!("the UKI's missing chunks: {compressed} bytes compressed, {raw} bytes raw");
    // 300 kB of numbered lines: raw, the insertion and the chunks around it; compressed, a
    // small part of that.
    assert!(raw >= 300_000, "raw ranges: {raw}");
    assert!(compressed * 4 < raw, "compressed {compressed}, raw {raw}");
}

#[test]
fn a_layout_push_tags_the_compressed_blob_and_a_corrupt_frame_is_refused_before_zstd() {
    let (v1_uki, v2_uki) = ukis();
    let (d1, d2, store) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_indexed_bundle(d1.path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(d2.path(), "2.0.0", &v2_uki);
    let store = store.path().join("store");
    let at =
        |tag: &str| Reference::parse(&format!("oci-layout:{}:{tag}", store.display())).unwrap();
    slate_transport::push(d1.path(), &at("1.0.0"), &mut |_| {}).unwrap();
    slate_transport::push(d2.path(), &at("2.0.0"), &mut |_| {}).unwrap();
    assert!(support::fake::find_tag(&store, &zchunks_tag(&v2)).is_some());

    let cache = tempfile::tempdir().unwrap();
    pull(&at("1.0.0"), cache.path());
    let (_, counter) = pull(&at("2.0.0"), cache.path());
    let compressed = counter.deltas[0].1;
    assert!(counter.fallbacks.is_empty(), "{:?}", counter.fallbacks);
    assert!(compressed < 100_000, "{:?}", counter.deltas);

    // One byte of every frame of the store's compressed blob changed: each needed frame fails
    // its signed digest, the delta gives up, and the raw blob comes whole.
    let (_, z) = v2.zchunk_table().unwrap().unwrap();
    let path = store
        .join("blobs/sha256")
        .join(z.blob.strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    for b in bytes.iter_mut().step_by(1000) {
        *b ^= 0x20;
    }
    std::fs::write(&path, bytes).unwrap();
    let cache = tempfile::tempdir().unwrap();
    pull(&at("1.0.0"), cache.path());
    let (pulled, counter) = pull(&at("2.0.0"), cache.path());
    let (digest, reason) = &counter.fallbacks[0];
    assert_eq!(*digest, uki_blob(&v2));
    assert!(
        reason.contains("do not match their signed digest")
            && reason.contains("refused before decompression"),
        "{reason}"
    );
    assert!(pulled.fetched_bytes > v2_uki.len() as u64, "{pulled:?}");
    assert!(cached(cache.path(), &uki_blob(&v2)) == Some(v2_uki));
    assert_only_verified_blobs(cache.path());
    // Nothing half-assembled is left where a blob would be taken from.
    assert!(
        support::incoming(cache.path())
            .iter()
            .all(|(name, _)| !name.ends_with(".partial")),
        "{:?}",
        support::incoming(cache.path())
    );
}
