//! Pulls by delta (issue 41 part 2): a pull into a cache that holds the previous version, or
//! with the running blobs as seeds, fetches only the chunks it lacks; a seed's rotten chunk is
//! fetched rather than used; a chunk the source serves corrupt is refused by its digest, and
//! nothing unverified reaches the cache.
#![cfg(feature = "client")]

mod support;

use std::path::Path;

use slate_bundle::Bundle;
use slate_transport::{Client, MemSeed, Options, Pulled, Reference, SeedBlob};
use support::registry::TestRegistry;
use support::{assert_only_verified_blobs, cached, noise, uki_blob, write_indexed_bundle, Counter};

/// v1's UKI, and v2's: 300 kB inserted at 3 MiB of 6 MiB.
fn ukis() -> (Vec<u8>, Vec<u8>) {
    let v1 = noise(7, 6 << 20);
    let mut v2 = v1.clone();
    v2.splice(3 << 20..3 << 20, noise(8, 300_000));
    (v1, v2)
}

fn layout_ref(dir: &Path, tag: &str) -> Reference {
    Reference::parse(&format!("oci-layout:{}:{tag}", dir.display())).unwrap()
}

fn pull(
    reference: &Reference,
    cache: &Path,
    seeds: Vec<SeedBlob>,
) -> (Result<Pulled, slate_transport::TransportError>, Counter) {
    let mut counter = Counter::default();
    let pulled =
        Client::new(Options::default())
            .pull_with_seeds(reference, cache, seeds, &mut |e| counter.record(e));
    (pulled, counter)
}

/// The running UKI as a seed, listed by the running bundle's own index.
fn uki_seed(running: &Bundle, bytes: Vec<u8>) -> SeedBlob {
    let index = running.chunk_index().unwrap().unwrap();
    SeedBlob {
        chunks: index.blob(&uki_blob(running)).unwrap().clone(),
        file: Box::new(MemSeed(bytes)),
    }
}

#[test]
fn a_pull_into_a_cache_holding_the_previous_version_fetches_only_the_delta() {
    let (v1_uki, v2_uki) = ukis();
    let (d1, d2, cache) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_indexed_bundle(d1.path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(d2.path(), "2.0.0", &v2_uki);
    let cache = cache.path().join("cache");

    let (first, counter) = pull(&layout_ref(d1.path(), "1.0.0"), &cache, Vec::new());
    let first = first.unwrap();
    // Nothing to reuse: each indexed blob's plan says so, and it is downloaded whole.
    assert_eq!(first.reused_bytes, 0);
    assert!(first.fetched_bytes > 8 << 20, "{first:?}");
    assert!(
        counter.deltas.iter().all(|d| d.2 == 0),
        "{:?}",
        counter.deltas
    );
    assert_eq!(counter.fallbacks.len(), 2, "{:?}", counter.fallbacks);

    let (second, counter) = pull(&layout_ref(d2.path(), "2.0.0"), &cache, Vec::new());
    let second = second.unwrap();
    // The insertion and a chunk or two around it, the index and the small documents; the
    // installer is the same blob and is not fetched at all.
    assert!(
        second.fetched_bytes < 300_000 + 4 * 128 * 1024 + 64 * 1024,
        "{second:?}"
    );
    assert!(second.reused_bytes > 5 << 20, "{second:?}");
    assert_eq!(counter.deltas.len(), 1, "{:?}", counter.deltas);
    assert_eq!(counter.deltas[0].0, uki_blob(&v2));
    assert!(counter.fallbacks.is_empty(), "{:?}", counter.fallbacks);
    assert!(cached(&cache, &uki_blob(&v2)) == Some(v2_uki));
    assert_only_verified_blobs(&cache);
    assert!(!cache.join("incoming/chunks").exists());
    slate_transport::open_cached(&cache, "2.0.0")
        .unwrap()
        .verify_blobs()
        .unwrap();
}

#[test]
fn a_seed_chunk_that_rotted_is_fetched_not_reused() {
    let (v1_uki, v2_uki) = ukis();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v1 = write_indexed_bundle(d1.path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(d2.path(), "2.0.0", &v2_uki);
    let reference = layout_ref(d2.path(), "2.0.0");

    let clean = tempfile::tempdir().unwrap();
    let (pulled, _) = pull(
        &reference,
        clean.path(),
        vec![uki_seed(&v1, v1_uki.clone())],
    );
    let clean_fetch = pulled.unwrap().fetched_bytes;

    // The running UKI on the ESP with one byte flipped in its first chunk (which v2 has too).
    let first = v1
        .chunk_index()
        .unwrap()
        .unwrap()
        .blob(&uki_blob(&v1))
        .unwrap()
        .chunks[0];
    let mut rotten = v1_uki.clone();
    rotten[100] ^= 0x40;
    let dir = tempfile::tempdir().unwrap();
    let (pulled, counter) = pull(&reference, dir.path(), vec![uki_seed(&v1, rotten)]);
    let pulled = pulled.unwrap();
    assert_eq!(
        pulled.fetched_bytes,
        clean_fetch + u64::from(first.length),
        "exactly the rotten chunk is fetched besides the delta"
    );
    assert!(counter.fallbacks.iter().all(|(d, _)| *d != uki_blob(&v2)));
    // The pull says which bytes of the running UKI it refused.
    assert_eq!(
        counter.refused,
        [(
            uki_blob(&v2),
            uki_blob(&v1),
            first.offset,
            first.offset + u64::from(first.length)
        )]
    );
    assert!(cached(dir.path(), &uki_blob(&v2)) == Some(v2_uki));
    assert_only_verified_blobs(dir.path());
}

#[test]
fn a_chunk_the_source_serves_corrupt_is_refused_and_nothing_unverified_is_kept() {
    let (v1_uki, v2_uki) = ukis();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v1 = write_indexed_bundle(d1.path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(d2.path(), "2.0.0", &v2_uki);
    // The source's UKI blob damaged inside the inserted bytes: a chunk the node must fetch.
    let blob = d2
        .path()
        .join("blobs/sha256")
        .join(uki_blob(&v2).strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[(3 << 20) + 1000] ^= 1;
    std::fs::write(&blob, bytes).unwrap();

    let cache = tempfile::tempdir().unwrap();
    let (pulled, counter) = pull(
        &layout_ref(d2.path(), "2.0.0"),
        cache.path(),
        vec![uki_seed(&v1, v1_uki)],
    );
    let err = pulled.unwrap_err();
    // The delta refused the chunk by its digest; the whole download that followed was refused
    // by the blob's.
    let fallback = counter
        .fallbacks
        .iter()
        .find(|(d, _)| *d == uki_blob(&v2))
        .map(|(_, reason)| reason.clone())
        .expect("the delta gave up");
    assert!(
        fallback.contains("does not match its signed digest"),
        "{fallback}"
    );
    assert!(
        matches!(err, slate_transport::TransportError::DigestMismatch { .. }),
        "{err}"
    );
    assert_eq!(cached(cache.path(), &uki_blob(&v2)), None);
    assert_only_verified_blobs(cache.path());
    assert!(
        support::incoming(cache.path())
            .iter()
            .all(|(name, _)| !name.ends_with(".partial") || name.starts_with("chunks")),
        "{:?}",
        support::incoming(cache.path())
    );
    let _ = v2_uki;
}

#[test]
fn a_registry_serves_the_missing_chunks_by_range() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let (v1_uki, v2_uki) = ukis();
    let (d1, d2, cache) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_indexed_bundle(d1.path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(d2.path(), "2.0.0", &v2_uki);
    let (r1, r2) = (
        Reference::parse(&registry.image("slate/os:1.0.0")).unwrap(),
        Reference::parse(&registry.image("slate/os:2.0.0")).unwrap(),
    );
    slate_transport::push(d1.path(), &r1, &mut |_| {}).unwrap();
    slate_transport::push(d2.path(), &r2, &mut |_| {}).unwrap();

    pull(&r1, cache.path(), Vec::new()).0.unwrap();
    let (pulled, counter) = pull(&r2, cache.path(), Vec::new());
    let pulled = pulled.unwrap();
    assert!(
        pulled.fetched_bytes < 300_000 + 4 * 128 * 1024 + 64 * 1024,
        "{pulled:?}"
    );
    assert!(counter.fallbacks.is_empty(), "{:?}", counter.fallbacks);
    assert!(cached(cache.path(), &uki_blob(&v2)) == Some(v2_uki));
    // Slate's counters: the rest came from the cache's v1, none of it over the wire.
    assert!(pulled.reused_bytes > 5 << 20, "{pulled:?}");
}

/// A pull cut short keeps the chunks it fetched (`incoming/chunks/`); the next one reuses them
/// and fetches none of them again.
#[test]
fn an_interrupted_delta_resumes_with_the_chunks_it_fetched() {
    let (v1_uki, v2_uki) = ukis();
    let (d1, d2, cache) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let v1 = write_indexed_bundle(d1.path(), "1.0.0", &v1_uki);
    let v2 = write_indexed_bundle(d2.path(), "2.0.0", &v2_uki);
    pull(&layout_ref(d1.path(), "1.0.0"), cache.path(), Vec::new())
        .0
        .unwrap();
    // What the cut pull had fetched: every chunk of v2's UKI that v1's lacks.
    let held: std::collections::HashSet<_> = v1
        .chunk_index()
        .unwrap()
        .unwrap()
        .blob(&uki_blob(&v1))
        .unwrap()
        .chunks
        .iter()
        .map(|c| c.digest)
        .collect();
    let chunks = cache.path().join("incoming/chunks");
    std::fs::create_dir_all(&chunks).unwrap();
    let index = v2.chunk_index().unwrap().unwrap();
    let mut kept = 0;
    for c in &index.blob(&uki_blob(&v2)).unwrap().chunks {
        if !held.contains(&c.digest) {
            let (start, end) = (c.offset as usize, (c.offset + u64::from(c.length)) as usize);
            std::fs::write(chunks.join(hex::encode(c.digest)), &v2_uki[start..end]).unwrap();
            kept += 1;
        }
    }
    assert!(kept >= 1);

    let (pulled, counter) = pull(&layout_ref(d2.path(), "2.0.0"), cache.path(), Vec::new());
    let pulled = pulled.unwrap();
    assert_eq!(
        counter.deltas,
        [(uki_blob(&v2), 0, v2_uki.len() as u64)],
        "nothing of the UKI left to fetch"
    );
    // The index and the small documents only.
    assert!(pulled.fetched_bytes < 64 * 1024, "{pulled:?}");
    assert!(cached(cache.path(), &uki_blob(&v2)) == Some(v2_uki));
    assert!(!chunks.exists(), "the chunks go once the pull is complete");
}

/// The test's stand-in for the root image's copy of a binary: each byte XOR 0x5a (the node's
/// real one, squashfs blocks, is `slate_machined::root_copy`, counted by `xtask bench-delta`).
fn disguised(binary: &[u8]) -> Vec<u8> {
    binary.iter().map(|b| b ^ 0x5a).collect()
}

/// A deriver of [`disguised`] copies, counting the media types it was asked about.
#[derive(Default)]
struct Disguise {
    asked: std::sync::Mutex<Vec<String>>,
}

impl slate_transport::DeriveSeeds for Disguise {
    fn derive(&self, media_type: &str, path: &Path) -> Vec<SeedBlob> {
        self.asked.lock().unwrap().push(media_type.to_owned());
        if media_type != slate_bundle::BINARY_MEDIA_TYPE {
            return Vec::new();
        }
        let copy = disguised(&std::fs::read(path).unwrap());
        vec![SeedBlob {
            chunks: slate_delta::chunk_blob(&copy, slate_delta::DEFAULT_PARAMS),
            file: Box::new(MemSeed(copy)),
        }]
    }
}

/// v2's binary changed, and v2's UKI holds it again in another form: with a deriver, the pull
/// takes the binary first and the UKI reuses what the deriver made of it; without, the UKI
/// fetches that copy too. A binary the node already holds is not handed to the deriver.
#[test]
fn a_seed_derived_from_the_new_binary_serves_the_uki() {
    let (v1_bin, v2_bin) = (noise(41, 3 << 20), noise(42, 3 << 20));
    let uki_of = |binary: &[u8]| {
        let mut uki = noise(7, 1 << 20);
        uki.extend(disguised(binary));
        uki
    };
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v1 = support::write_indexed_bundle_of(d1.path(), "1.0.0", &uki_of(&v1_bin), &v1_bin);
    let v2 = support::write_indexed_bundle_of(d2.path(), "2.0.0", &uki_of(&v2_bin), &v2_bin);
    let reference = layout_ref(d2.path(), "2.0.0");
    let running = || vec![uki_seed(&v1, uki_of(&v1_bin))];

    let plain = tempfile::tempdir().unwrap();
    let (without, _) = pull(&reference, plain.path(), running());
    let without = without.unwrap();

    let cache = tempfile::tempdir().unwrap();
    let derive = Disguise::default();
    let mut counter = Counter::default();
    let with = Client::new(Options::default())
        .pull_with_derived_seeds(&reference, cache.path(), running(), &derive, &mut |e| {
            counter.record(e)
        })
        .unwrap();
    // The binary (3 MiB of new noise) travels either way; the UKI's 3 MiB copy only without.
    assert!(without.fetched_bytes > 6 << 20, "{without:?}");
    assert!(with.fetched_bytes < (3 << 20) + (256 << 10), "{with:?}");
    assert!(with.reused_bytes > 3 << 20, "{with:?}");
    let uki_delta = counter
        .deltas
        .iter()
        .find(|d| d.0 == uki_blob(&v2))
        .unwrap();
    assert!(uki_delta.1 < 256 << 10, "{:?}", counter.deltas);
    assert!(cached(cache.path(), &uki_blob(&v2)) == Some(uki_of(&v2_bin)));
    slate_transport::open_cached(cache.path(), "2.0.0")
        .unwrap()
        .verify_blobs()
        .unwrap();
    // Asked about each blob once, the binary first.
    let asked = derive.asked.lock().unwrap().clone();
    assert_eq!(asked[0], slate_bundle::BINARY_MEDIA_TYPE, "{asked:?}");
    assert_eq!(
        asked
            .iter()
            .filter(|m| *m == slate_bundle::UKI_MEDIA_TYPE)
            .count(),
        1,
        "{asked:?}"
    );

    // The running binary is the new one: nothing is derived from it.
    let held = tempfile::tempdir().unwrap();
    let derive = Disguise::default();
    let v2_index = v2.chunk_index().unwrap().unwrap();
    let binary = v2.manifest().blobs[slate_bundle::INSTALLER_ROLE]
        .digest
        .clone();
    let seeds = vec![SeedBlob {
        chunks: v2_index.blob(&binary).unwrap().clone(),
        file: Box::new(MemSeed(v2_bin.clone())),
    }];
    Client::new(Options::default())
        .pull_with_derived_seeds(&reference, held.path(), seeds, &derive, &mut |_| {})
        .unwrap();
    let asked = derive.asked.lock().unwrap().clone();
    assert!(
        !asked.iter().any(|m| m == slate_bundle::BINARY_MEDIA_TYPE),
        "{asked:?}"
    );
}
