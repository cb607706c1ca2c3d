//! A delta assembled from real files (issue 41): the running version's blob as the seed, a
//! chunk cache directory, the new bundle's OCI layout — or a real registry — as the remote.
#![cfg(feature = "client")]

mod support;

use std::path::{Path, PathBuf};

use slate_bundle::Bundle;
use slate_delta::{assemble, plan, ChunkCache, Seed};
use slate_transport::chunks::{DirCache, FileSeed, LayoutRemote, RegistryRemote};
use slate_transport::{push, Client, Options, Reference};
use support::registry::TestRegistry;

fn write(dir: &Path, version: &str, uki: &[u8]) -> Bundle {
    support::write_indexed_bundle(dir, version, uki)
}

fn uki_path(bundle: &Bundle) -> PathBuf {
    let digest = &bundle.blob_ref(slate_bundle::UKI_ROLE).unwrap().digest;
    bundle
        .dir()
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

#[test]
fn a_uki_is_assembled_from_the_running_one_the_cache_and_the_layout() {
    let v1_uki = support::noise(7, 6 << 20);
    let mut v2_uki = v1_uki.clone();
    v2_uki.splice(3 << 20..3 << 20, support::noise(8, 300_000));
    let (d1, d2, cache_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (v1, v2) = (
        write(d1.path(), "1.0.0", &v1_uki),
        write(d2.path(), "2.0.0", &v2_uki),
    );
    let (i1, i2) = (
        v1.chunk_index().unwrap().unwrap(),
        v2.chunk_index().unwrap().unwrap(),
    );
    let digest = &v2.blob_ref(slate_bundle::UKI_ROLE).unwrap().digest;
    let target = i2.blob(digest).unwrap();
    let running = &v1.blob_ref(slate_bundle::UKI_ROLE).unwrap().digest;
    let file = FileSeed(std::fs::File::open(uki_path(&v1)).unwrap());
    let seeds = [Seed {
        chunks: i1.blob(running).unwrap(),
        file: &file,
    }];
    let cache = DirCache::new(&cache_dir.path().join("chunks")).unwrap();
    let remote = LayoutRemote::new(d2.path());

    let first = plan(target, &seeds, Some(&cache)).unwrap();
    assert!(first.worth_it());
    // 300 kB inserted into 6 MiB: the insertion and a chunk or two around it.
    assert!(first.fetch_bytes < 300_000 + 4 * 128 * 1024, "{first:?}");
    assert!(first.reuse_bytes > 5 << 20, "{first:?}");
    let mut out = Vec::new();
    assemble(target, &first, &seeds, &cache, &remote, 4, &mut out).unwrap();
    assert!(
        out == v2_uki,
        "the assembled UKI is the new one, byte for byte"
    );

    // Run again (as after a cut): every fetched chunk is in the cache now.
    let again = plan(target, &seeds, Some(&cache)).unwrap();
    assert_eq!((again.fetch_chunks, again.fetch_bytes), (0, 0));

    // A cached chunk that rotted is fetched again, and the result is still exact.
    let fetched = first
        .sources
        .iter()
        .position(|s| *s == slate_delta::Source::Fetch)
        .unwrap();
    let rotted = target.chunks[fetched].digest;
    let path = cache_dir.path().join("chunks").join(hex::encode(rotted));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let third = plan(target, &seeds, Some(&cache)).unwrap();
    assert_eq!(third.fetch_chunks, 1);
    let mut out = Vec::new();
    assemble(target, &third, &seeds, &cache, &remote, 2, &mut out).unwrap();
    assert!(out == v2_uki);
    assert_eq!(
        cache.get(&rotted).unwrap().map(|b| b.len()),
        Some(target.chunks[fetched].length as usize)
    );
}

#[test]
fn chunks_come_from_a_registry_by_range_requests() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let v1_uki = support::noise(17, 4 << 20);
    let mut v2_uki = v1_uki.clone();
    v2_uki.splice(1 << 20..1 << 20, support::noise(18, 200_000));
    let (d1, d2, cache_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (v1, v2) = (
        write(d1.path(), "1.0.0", &v1_uki),
        write(d2.path(), "2.0.0", &v2_uki),
    );
    let image = Reference::parse(&registry.image("slate/delta:2.0.0")).unwrap();
    push(d2.path(), &image, &mut |_| {}).unwrap();

    let (i1, i2) = (
        v1.chunk_index().unwrap().unwrap(),
        v2.chunk_index().unwrap().unwrap(),
    );
    let target = i2
        .blob(&v2.blob_ref(slate_bundle::UKI_ROLE).unwrap().digest)
        .unwrap();
    let file = FileSeed(std::fs::File::open(uki_path(&v1)).unwrap());
    let seeds = [Seed {
        chunks: i1
            .blob(&v1.blob_ref(slate_bundle::UKI_ROLE).unwrap().digest)
            .unwrap(),
        file: &file,
    }];
    let cache = DirCache::new(cache_dir.path()).unwrap();
    let remote = RegistryRemote::new(&Client::new(Options::default()), &image)
        .unwrap()
        .expect("a registry reference");
    let plan = plan(target, &seeds, Some(&cache)).unwrap();
    assert!(plan.fetch_chunks >= 1 && plan.fetch_bytes < 200_000 + 4 * 128 * 1024);
    let mut out = Vec::new();
    assemble(target, &plan, &seeds, &cache, &remote, 4, &mut out).unwrap();
    assert!(
        out == v2_uki,
        "the assembled UKI is the new one, byte for byte"
    );

    // A chunk the registry does not have (a blob of another repository) is an error, not a
    // wrong byte.
    let other = Reference::parse(&registry.image("slate/other:1.0.0")).unwrap();
    let remote = RegistryRemote::new(&Client::new(Options::default()), &other)
        .unwrap()
        .unwrap();
    let empty = tempfile::tempdir().unwrap();
    let err = assemble(
        target,
        &plan,
        &seeds,
        &DirCache::new(empty.path()).unwrap(),
        &remote,
        2,
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(
        matches!(err, slate_delta::AssembleError::Fetch { .. }),
        "{err}"
    );
}
