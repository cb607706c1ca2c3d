//! Push and pull against a real registry (Debian's docker-registry, distribution 2.8).
#![cfg(feature = "client")]

mod support;

use std::path::Path;

use slate_bundle::Bundle;
use slate_transport::{pull, push, push_with, Event, Options, Pulled, Reference, TransportError};
use support::http::{Proxy, ProxyMode};
use support::registry::TestRegistry;
use support::{
    add_fake_signature, assert_only_verified_blobs, incoming, manifest_digest, noise,
    write_test_bundle, Counter,
};

fn reference(s: &str) -> Reference {
    Reference::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

fn pull_counting(image: &str, cache: &Path) -> (Result<Pulled, TransportError>, Counter) {
    let mut counter = Counter::default();
    let result = pull(&reference(image), cache, &mut |e| counter.record(e));
    (result, counter)
}

/// Blob bytes of the image tagged `tag` in `dir` (config and layers).
fn blob_bytes(dir: &Path, tag: &str) -> u64 {
    let digest = manifest_digest(dir, tag);
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("blobs/sha256").join(&digest[7..])).unwrap(),
    )
    .unwrap();
    manifest["config"]["size"].as_u64().unwrap()
        + manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["size"].as_u64().unwrap())
            .sum::<u64>()
}

#[test]
fn push_then_pull_by_tag_and_by_digest() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    let (uki, installer) = (noise(1, 300 * 1024), noise(2, 100 * 1024));
    write_test_bundle(&bundle, "2.0.0", &uki, &installer);
    let sig_tag = add_fake_signature(&bundle, "2.0.0");
    let digest = manifest_digest(&bundle, "2.0.0");

    let image = registry.image("slate/demo/installer:2.0.0");
    let pushed = push(&bundle, &reference(&image), &mut |_| {}).unwrap();
    assert_eq!(
        pushed.references,
        [
            image.clone(),
            registry.image(&format!("slate/demo/installer:{sig_tag}"))
        ]
    );
    assert_eq!(pushed.skipped_bytes, 0);

    let cache = work.path().join("cache");
    let pulled = pull(&reference(&image), &cache, &mut |_| {}).unwrap();
    assert_eq!(pulled.tag, "2.0.0");
    assert_eq!(pulled.manifest_digest, digest);
    assert_eq!(pulled.signature_tag.as_deref(), Some(sig_tag.as_str()));
    assert_eq!(pulled.layout_dir, cache);
    let opened = Bundle::open(&pulled.layout_dir, Some(&pulled.tag)).unwrap();
    assert_eq!(opened.manifest().version, "2.0.0");
    assert_eq!(opened.manifest_digest(), digest);
    assert_eq!(opened.read_blob(slate_bundle::UKI_ROLE).unwrap(), uki);
    assert_eq!(
        opened.read_blob(slate_bundle::INSTALLER_ROLE).unwrap(),
        installer
    );
    assert_eq!(
        manifest_digest(&cache, &sig_tag),
        manifest_digest(&bundle, &sig_tag)
    );
    assert!(incoming(&cache).is_empty(), "{:?}", incoming(&cache));
    assert_only_verified_blobs(&cache);

    let by_digest = registry.image(&format!("slate/demo/installer@{digest}"));
    let cache2 = work.path().join("cache2");
    let pulled = pull(&reference(&by_digest), &cache2, &mut |_| {}).unwrap();
    assert_eq!(pulled.tag, digest);
    assert_eq!(pulled.signature_tag.as_deref(), Some(sig_tag.as_str()));
    let opened = Bundle::open(&cache2, Some(&digest)).unwrap();
    assert_eq!(opened.read_blob(slate_bundle::UKI_ROLE).unwrap(), uki);
}

#[test]
fn an_unsigned_image_pulls_without_a_signature() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "1.0.0", b"uki", b"installer");
    let image = registry.image("os:1.0.0");
    push(&bundle, &reference(&image), &mut |_| {}).unwrap();
    let pulled = pull(&reference(&image), &work.path().join("cache"), &mut |_| {}).unwrap();
    assert_eq!(pulled.signature_tag, None);
    Bundle::open(&pulled.layout_dir, Some("1.0.0")).unwrap();
}

#[test]
fn pulling_twice_fetches_no_blob_bytes() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(3, 200_000), &noise(4, 50_000));
    let image = registry.image("os:2.0.0");
    push(&bundle, &reference(&image), &mut |_| {}).unwrap();
    let total = blob_bytes(&bundle, "2.0.0");

    let cache = work.path().join("cache");
    let (first, counter) = pull_counting(&image, &cache);
    let first = first.unwrap();
    assert_eq!((first.fetched_bytes, counter.bytes), (total, total));
    let (second, counter) = pull_counting(&image, &cache);
    let second = second.unwrap();
    println!(
        "first pull fetched {} bytes, second {} ({} cached)",
        first.fetched_bytes, second.fetched_bytes, second.cached_bytes
    );
    assert_eq!(second.fetched_bytes, 0);
    assert_eq!(counter.bytes, 0);
    assert_eq!(second.cached_bytes, total);
    assert_eq!(counter.present.len(), 3, "config, uki, installer");
    assert!(counter.starts.is_empty());
    assert_eq!(second.manifest_digest, first.manifest_digest);
    Bundle::open(&cache, Some("2.0.0")).unwrap();
}

/// The first pull goes through a proxy that drops the connection in the middle of the UKI; the
/// second goes straight to the registry and fetches only what is missing.
#[test]
fn an_interrupted_pull_resumes_where_it_stopped() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    let uki = noise(5, 6 * 1024 * 1024);
    write_test_bundle(&bundle, "2.0.0", &uki, &noise(6, 300_000));
    push(
        &bundle,
        &reference(&registry.image("os:2.0.0")),
        &mut |_| {},
    )
    .unwrap();
    let total = blob_bytes(&bundle, "2.0.0");
    let uki_digest = support::sha256(&uki);
    let cut = 2 * 1024 * 1024 + 12_345;
    let proxy = Proxy::start(
        &registry.host,
        ProxyMode::Cut {
            path: uki_digest.clone(),
            after: cut,
        },
    );

    let cache = work.path().join("cache");
    let (first, counter) = pull_counting(&format!("{}/os:2.0.0", proxy.host), &cache);
    let err = first.expect_err("the connection was cut");
    let message = err.to_string();
    assert!(
        matches!(err, TransportError::Truncated { received, expected, .. } if received == cut && expected == uki.len() as u64),
        "{message}"
    );
    assert!(message.contains("the next pull resumes there"), "{message}");
    let fetched_first = counter.bytes;
    let partial = format!("{}.partial", &uki_digest[7..]);
    assert_eq!(incoming(&cache), [(partial, cut)]);
    assert!(!cache.join("blobs/sha256").join(&uki_digest[7..]).exists());
    assert_only_verified_blobs(&cache);
    assert!(
        Bundle::open(&cache, Some("2.0.0")).is_err(),
        "no tag before the image is complete"
    );

    let (second, counter) = pull_counting(&registry.image("os:2.0.0"), &cache);
    let second = second.unwrap();
    println!(
        "resume: total {total} blob bytes; interrupted pull fetched {fetched_first} (UKI cut at \
         {cut}); resumed pull fetched {} = total - {fetched_first}",
        second.fetched_bytes
    );
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(second.fetched_bytes, total - fetched_first);
    assert_eq!(counter.bytes, total - fetched_first);
    let resumed = counter
        .starts
        .iter()
        .find(|(d, ..)| *d == uki_digest)
        .unwrap();
    assert_eq!(resumed.2, cut, "the UKI resumed from the cut");
    assert!(incoming(&cache).is_empty());
    let opened = Bundle::open(&cache, Some("2.0.0")).unwrap();
    assert_eq!(opened.read_blob(slate_bundle::UKI_ROLE).unwrap(), uki);
}

/// A registry that ignores `Range` answers 200: the partial is dropped and the blob fetched whole.
#[test]
fn a_registry_ignoring_range_gets_a_full_fetch() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    let uki = noise(7, 3 * 1024 * 1024);
    write_test_bundle(&bundle, "2.0.0", &uki, b"installer");
    push(
        &bundle,
        &reference(&registry.image("os:2.0.0")),
        &mut |_| {},
    )
    .unwrap();
    let uki_digest = support::sha256(&uki);
    let cache = work.path().join("cache");
    {
        let cutter = Proxy::start(
            &registry.host,
            ProxyMode::Cut {
                path: uki_digest.clone(),
                after: 1_000_000,
            },
        );
        let (first, _) = pull_counting(&format!("{}/os:2.0.0", cutter.host), &cache);
        assert!(matches!(first, Err(TransportError::Truncated { .. })));
    }
    let no_range = Proxy::start(&registry.host, ProxyMode::StripRange);
    let (second, counter) = pull_counting(&format!("{}/os:2.0.0", no_range.host), &cache);
    let second = second.unwrap();
    assert_eq!(
        second.fetched_bytes,
        uki.len() as u64 + "installer".len() as u64,
        "the UKI came whole, the config was cached"
    );
    assert_eq!(
        counter
            .starts
            .iter()
            .find(|(d, ..)| *d == uki_digest)
            .unwrap()
            .2,
        1_000_000
    );
    assert!(incoming(&cache).is_empty());
    let opened = Bundle::open(&cache, Some("2.0.0")).unwrap();
    assert_eq!(opened.read_blob(slate_bundle::UKI_ROLE).unwrap(), uki);
}

#[test]
fn pushes_skip_what_the_registry_has_and_chunk_large_blobs() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (v2, v3) = (work.path().join("v2"), work.path().join("v3"));
    let installer = noise(8, 150_000);
    write_test_bundle(&v2, "2.0.0", &noise(9, 300_000), &installer);
    write_test_bundle(&v3, "3.0.0", &noise(10, 200_000), &installer);
    let options = Options {
        chunk_size: Some(64 * 1024),
        ..Options::default()
    };

    let mut counter = Counter::default();
    let pushed = push_with(&v2, &reference(&registry.image("os")), &options, &mut |e| {
        counter.record(e)
    })
    .unwrap();
    assert_eq!(pushed.references, [registry.image("os:2.0.0")]);
    assert_eq!(pushed.uploaded_bytes, blob_bytes(&v2, "2.0.0"));
    assert_eq!(counter.bytes, pushed.uploaded_bytes);

    let again = push_with(
        &v2,
        &reference(&registry.image("os")),
        &options,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        (again.uploaded_bytes, again.skipped_bytes),
        (0, blob_bytes(&v2, "2.0.0"))
    );

    let v3_pushed = push_with(
        &v3,
        &reference(&registry.image("os")),
        &options,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        v3_pushed.skipped_bytes,
        installer.len() as u64,
        "the shared installer blob"
    );

    for (tag, dir) in [("2.0.0", &v2), ("3.0.0", &v3)] {
        let cache = work.path().join("cache");
        let pulled = pull(
            &reference(&registry.image(&format!("os:{tag}"))),
            &cache,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(pulled.manifest_digest, manifest_digest(dir, tag));
        let opened = Bundle::open(&cache, Some(tag)).unwrap();
        assert_eq!(opened.manifest().version, tag);
        opened.read_blob(slate_bundle::UKI_ROLE).unwrap();
    }
}

#[test]
fn a_push_may_rename_the_only_image() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", b"uki", b"installer");
    let sig_tag = add_fake_signature(&bundle, "2.0.0");
    let pushed = push(
        &bundle,
        &reference(&registry.image("os:stable")),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        pushed.references,
        [
            registry.image("os:stable"),
            registry.image(&format!("os:{sig_tag}"))
        ]
    );
    let cache = work.path().join("cache");
    let pulled = pull(
        &reference(&registry.image("os:stable")),
        &cache,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(pulled.signature_tag, Some(sig_tag));
    assert_eq!(
        Bundle::open(&cache, Some("stable"))
            .unwrap()
            .manifest()
            .version,
        "2.0.0"
    );
    let err = pull(&reference(&registry.image("os:2.0.0")), &cache, &mut |_| {}).unwrap_err();
    assert!(matches!(err, TransportError::NotFound { .. }), "{err}");
    assert!(
        err.to_string().contains("the image 2.0.0 was not found"),
        "{err}"
    );
}

#[test]
fn pull_needs_a_tag_or_digest_and_a_server() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let err = pull(&reference(&registry.image("os")), work.path(), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("name a tag"), "{err}");
    let unused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = pull(
        &reference(&format!("{unused}/os:1")),
        &work.path().join("c"),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(err, TransportError::Http { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("GET http://{unused}/v2/os/manifests/1")),
        "{err}"
    );
}

#[test]
fn progress_reports_each_blob() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(11, 1000), &noise(12, 2000));
    push(
        &bundle,
        &reference(&registry.image("os:2.0.0")),
        &mut |_| {},
    )
    .unwrap();
    let mut events = Vec::new();
    pull(
        &reference(&registry.image("os:2.0.0")),
        &work.path().join("cache"),
        &mut |e| {
            events.push(match e {
                Event::Manifest { name, .. } => format!("manifest {name}"),
                Event::BlobStart { size, from, .. } => format!("start {size} from {from}"),
                Event::Bytes(_) => "bytes".into(),
                Event::BlobDone { .. } => "done".into(),
                Event::BlobPresent { .. } => "present".into(),
                Event::DeltaStart { .. } => "delta".into(),
                Event::DeltaFallback { .. } => "whole".into(),
                Event::SeedChunkRefused { .. } => "refused".into(),
            })
        },
    )
    .unwrap();
    events.dedup();
    assert_eq!(events[0], "manifest 2.0.0");
    assert_eq!(events.iter().filter(|e| *e == "done").count(), 3);
    assert!(events.contains(&"start 1000 from 0".to_string()));
    assert!(events.contains(&"start 2000 from 0".to_string()));
}
