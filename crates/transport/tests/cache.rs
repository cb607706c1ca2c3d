//! The pull cache as a whole (issue 19): concurrent pulls into one cache, the dry run that writes
//! nothing, and garbage collection keeping the last pulls.
#![cfg(feature = "client")]

mod support;

use std::path::Path;
use std::sync::{Arc, Barrier};

use slate_bundle::Bundle;
use slate_transport::{gc, pull, push, resolve_with, Options, Reference};
use support::registry::TestRegistry;
use support::{
    add_fake_signature, assert_only_verified_blobs, incoming, manifest_digest, noise, snapshot,
    write_test_bundle,
};

fn reference(s: &str) -> Reference {
    Reference::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

/// Tags 1.0 … `n`.0 of one repository, sharing their installer blob, each with its own UKI.
fn push_versions(registry: &TestRegistry, work: &Path, n: u64, installer: &[u8]) {
    for v in 1..=n {
        let dir = work.join(format!("bundle-{v}"));
        let version = format!("{v}.0");
        write_test_bundle(&dir, &version, &noise(v, 200_000), installer);
        add_fake_signature(&dir, &version);
        let image = registry.image(&format!("slate/os:{version}"));
        push(&dir, &reference(&image), &mut |_| {}).unwrap();
    }
}

/// The tags the cache's index names.
fn tags(cache: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("index.json")).unwrap()).unwrap();
    let mut tags: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    tags.sort();
    tags
}

/// issue 19: the pull cache had no lock. Six pulls at once into one cache — the same image
/// twice, three images sharing a 4 MiB blob — all succeed, and the cache holds every image,
/// only verified blobs, and no partial.
#[test]
fn concurrent_pulls_into_one_cache_all_succeed() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    push_versions(&registry, work.path(), 3, &noise(100, 4 << 20));
    let cache = work.path().join("cache");
    for round in 0..2 {
        let cache = cache.join(format!("round-{round}"));
        let barrier = Arc::new(Barrier::new(6));
        let pulls: Vec<_> = ["1.0", "1.0", "2.0", "2.0", "3.0", "3.0"]
            .into_iter()
            .map(|tag| {
                let (barrier, cache) = (barrier.clone(), cache.clone());
                let image = registry.image(&format!("slate/os:{tag}"));
                std::thread::spawn(move || {
                    barrier.wait();
                    pull(&reference(&image), &cache, &mut |_| {})
                })
            })
            .collect();
        for (i, handle) in pulls.into_iter().enumerate() {
            let result = handle.join().expect("no pull panics");
            result.unwrap_or_else(|e| panic!("round {round}, pull {i}: {e}"));
        }
        assert_only_verified_blobs(&cache);
        let partials: Vec<_> = incoming(&cache)
            .into_iter()
            .filter(|(name, _)| name.ends_with(".partial"))
            .collect();
        assert_eq!(partials, [], "no partial left");
        let found = tags(&cache);
        for tag in ["1.0", "2.0", "3.0"] {
            assert!(found.iter().any(|t| t == tag), "{tag} in {found:?}");
            let bundle = Bundle::open(&cache, Some(tag)).unwrap();
            bundle.verify_blobs().unwrap();
        }
        assert_eq!(found.len(), 6, "three images, three signatures: {found:?}");
    }
}

/// issue 19: `slate upgrade --image REF --dry-run` pulled 33 MB into the cache. The dry run of
/// a pull resolves the reference — digest, sizes, the bundle manifest, the signature — and
/// leaves a cache that does not exist absent, and one that does byte for byte as it was.
#[test]
fn a_dry_run_writes_nothing() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    push_versions(&registry, work.path(), 2, &noise(100, 300_000));
    let image = reference(&registry.image("slate/os:2.0"));

    let absent = work.path().join("absent-cache");
    let resolved = resolve_with(&image, &Options::default()).unwrap();
    assert!(!absent.exists());
    assert_eq!(resolved.tag, "2.0");
    assert_eq!(
        resolved.manifest_digest,
        manifest_digest(&work.path().join("bundle-2"), "2.0")
    );
    assert_eq!(resolved.blobs.len(), 3, "config, UKI, installer");
    let bundle = resolved.bundle.as_ref().expect("a slate bundle");
    assert_eq!(bundle.version, "2.0");
    assert_eq!(
        resolved.total_bytes,
        resolved.blobs.iter().map(|b| b.size).sum::<u64>()
    );
    assert!(resolved.total_bytes > 500_000);
    assert!(resolved.signature_tag.is_some());
    assert_eq!(resolved.cached_bytes(&absent), 0);
    assert!(!absent.exists(), "the dry run created nothing");

    // A cache holding 1.0 (which shares the installer): unchanged, and the shared blob counts
    // as cached.
    let cache = work.path().join("cache");
    pull(
        &reference(&registry.image("slate/os:1.0")),
        &cache,
        &mut |_| {},
    )
    .unwrap();
    let before = snapshot(&cache);
    let resolved = resolve_with(&image, &Options::default()).unwrap();
    assert_eq!(resolved.cached_bytes(&cache), 300_000);
    assert_eq!(
        snapshot(&cache),
        before,
        "the cache is byte for byte as it was"
    );
}

/// `gc` keeps the images of the last N pulls (and their signatures) and removes the rest: index
/// entries, the blobs only they named, partials. Its dry run reports the same and changes
/// nothing.
#[test]
fn gc_keeps_the_last_pulls() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let installer = noise(100, 100_000);
    push_versions(&registry, work.path(), 4, &installer);
    let cache = work.path().join("cache");
    let pull_tag = |tag: &str| {
        pull(
            &reference(&registry.image(&format!("slate/os:{tag}"))),
            &cache,
            &mut |_| {},
        )
        .unwrap()
    };
    for tag in ["1.0", "2.0", "3.0", "4.0"] {
        pull_tag(tag);
    }
    // An interrupted pull's partial.
    std::fs::write(cache.join("incoming/0123.partial"), b"half").unwrap();
    let uki_of = |v: u64| support::sha256(&noise(v, 200_000));
    let blob = |digest: &str| cache.join("blobs/sha256").join(&digest[7..]);

    let before = snapshot(&cache);
    let planned = gc(&cache, 2, true).unwrap();
    assert_eq!(snapshot(&cache), before, "a dry run changes nothing");
    assert!(planned.dry_run);
    let sig = |tag: &str| {
        format!(
            "sha256-{}.sig",
            &manifest_digest(&work.path().join(format!("bundle-{}", &tag[..1])), tag)[7..]
        )
    };
    let mut kept = planned.kept.clone();
    kept.sort();
    let mut expected = vec!["3.0".to_owned(), "4.0".to_owned(), sig("3.0"), sig("4.0")];
    expected.sort();
    assert_eq!(kept, expected);
    let mut removed = planned.removed_images.clone();
    removed.sort();
    let mut expected = vec!["1.0".to_owned(), "2.0".to_owned(), sig("1.0"), sig("2.0")];
    expected.sort();
    assert_eq!(removed, expected);
    let removed_blobs: Vec<&str> = planned
        .removed_blobs
        .iter()
        .map(|b| b.digest.as_str())
        .collect();
    assert!(removed_blobs.contains(&uki_of(1).as_str()));
    assert!(removed_blobs.contains(&uki_of(2).as_str()));
    assert!(!removed_blobs.contains(&uki_of(3).as_str()));
    assert!(!removed_blobs.contains(&support::sha256(&installer).as_str()));
    assert_eq!(planned.removed_partials, [("0123.partial".to_owned(), 4)]);
    assert!(planned.freed_bytes() >= 400_004);

    let done = gc(&cache, 2, false).unwrap();
    assert_eq!(
        (
            done.kept.clone(),
            done.removed_images.clone(),
            done.removed_blobs.clone()
        ),
        (planned.kept, planned.removed_images, planned.removed_blobs)
    );
    assert!(!done.dry_run);
    assert!(!blob(&uki_of(1)).exists() && !blob(&uki_of(2)).exists());
    assert!(blob(&uki_of(3)).exists() && blob(&support::sha256(&installer)).exists());
    assert_eq!(incoming(&cache), []);
    assert_only_verified_blobs(&cache);
    for tag in ["3.0", "4.0"] {
        Bundle::open(&cache, Some(tag))
            .unwrap()
            .verify_blobs()
            .unwrap();
    }
    assert!(Bundle::open(&cache, Some("1.0")).is_err());
    // Again: nothing more to do.
    let again = gc(&cache, 2, false).unwrap();
    assert_eq!(again.removed_images, Vec::<String>::new());
    assert_eq!(again.freed_bytes(), 0);

    // A pull makes an image the newest, even one pulled before.
    pull_tag("3.0");
    let done = gc(&cache, 1, false).unwrap();
    assert_eq!(done.removed_images, ["4.0".to_owned(), sig("4.0")]);
    assert!(Bundle::open(&cache, Some("3.0")).is_ok());
    assert!(!blob(&uki_of(4)).exists());

    // A cache that does not exist has nothing to collect.
    let none = gc(&work.path().join("none"), 3, false).unwrap();
    assert_eq!(none.freed_bytes(), 0);
    assert!(!work.path().join("none").exists());
}
