//! The release index in a real registry (Debian's docker-registry, distribution 2.8): stored and
//! read back, absent from a fresh repository, malformed artifacts refused by name, channel tags
//! that keep the digest, and two publishers interleaving.
#![cfg(feature = "client")]

mod support;

use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use slate_release::{Channel, Published, Release, ReleaseError, ReleaseIndex, INDEX_MEDIA_TYPE};
use slate_transport::releases::{
    fetch_stored_index, resolve_tag, update_index, IndexStore, RegistryIndex, StoredIndex,
    UpdateError, MAX_UPDATE_ATTEMPTS,
};
use slate_transport::{
    fetch_release_index, pull, push, store_release_index, tag_manifest, update_release_index,
    Options, Reference, TransportError, RELEASE_INDEX_TAG,
};
use support::http::{response, FakeServer};
use support::registry::TestRegistry;
use support::{add_fake_signature, manifest_digest, noise, sha256, write_test_bundle};

const EMPTY_CONFIG: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

fn repo(registry: &TestRegistry, name: &str) -> Reference {
    Reference::parse(&registry.image(name)).unwrap()
}

fn release(version: &str, n: u8, channel: Channel) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
        created: "2026-12-01T00:00:00Z".into(),
        channel,
        official: true,
        min_from: None,
        yanked: None,
    }
}

fn versions(index: &ReleaseIndex) -> Vec<&str> {
    index.releases.iter().map(|r| r.version.as_str()).collect()
}

fn options() -> Options {
    Options::default()
}

#[test]
fn an_index_round_trips_and_a_fresh_repository_has_none() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let os = repo(&registry, "slate/os");
    assert_eq!(fetch_release_index(&os, &options()).unwrap(), None);

    let mut index = ReleaseIndex::default();
    index.publish(release("1.0.0", 1, Channel::Stable)).unwrap();
    index.publish(release("2.0.0", 2, Channel::Beta)).unwrap();
    let digest = store_release_index(&os, &index, &options()).unwrap();
    assert_eq!(
        fetch_release_index(&os, &options()).unwrap().as_ref(),
        Some(&index)
    );
    let stored = fetch_stored_index(&os, &options()).unwrap().unwrap();
    assert_eq!(stored.digest, digest);
    assert_eq!(
        resolve_tag(&os, RELEASE_INDEX_TAG, &options()).unwrap(),
        Some(digest.clone())
    );
    // The same index is the same manifest; the tag of the reference does not matter.
    let tagged = repo(&registry, "slate/os:whatever");
    assert_eq!(
        store_release_index(&tagged, &index, &options()).unwrap(),
        digest
    );
    // Another repository on the same registry still has none.
    assert_eq!(
        fetch_release_index(&repo(&registry, "slate/other"), &options()).unwrap(),
        None
    );
}

/// Push an OCI layout holding one manifest tagged `releases` to `repository`.
fn push_artifact(dir: &Path, repository: &Reference, layer_media_type: &str, layer: &[u8]) {
    push_raw(
        dir,
        repository,
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": INDEX_MEDIA_TYPE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": EMPTY_CONFIG, "size": 2},
            "layers": [{"mediaType": layer_media_type, "digest": sha256(layer), "size": layer.len()}],
        }),
        &[b"{}", layer],
    );
}

fn push_raw(dir: &Path, repository: &Reference, manifest: serde_json::Value, blobs: &[&[u8]]) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let manifest = serde_json::to_vec(&manifest).unwrap();
    for blob in blobs.iter().copied().chain([manifest.as_slice()]) {
        let hex = &sha256(blob)["sha256:".len()..];
        std::fs::write(dir.join("blobs/sha256").join(hex), blob).unwrap();
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(&manifest), "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": RELEASE_INDEX_TAG},
        }],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    push(dir, repository, &mut |_| {}).unwrap();
}

/// PUT a manifest as it is under the tag `releases` (no local checks, unlike a push).
fn put_manifest(registry: &TestRegistry, name: &str, manifest: &serde_json::Value) {
    let url = format!(
        "http://{}/v2/{name}/manifests/{RELEASE_INDEX_TAG}",
        registry.host
    );
    let response = ureq::put(&url)
        .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        .send(&serde_json::to_vec(manifest).unwrap()[..])
        .unwrap();
    assert_eq!(response.status(), 201);
}

#[test]
fn malformed_index_artifacts_are_refused_by_name() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let good = ReleaseIndex::default().to_json();
    let fetch = |name: &str| fetch_release_index(&repo(&registry, name), &options()).unwrap_err();

    push_artifact(
        &work.path().join("a"),
        &repo(&registry, "wrong-type"),
        "application/json",
        good.as_bytes(),
    );
    let err = fetch("wrong-type");
    assert!(
        matches!(&err, TransportError::MediaType { actual, .. } if actual == "application/json"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("the layer of the release index"),
        "{err}"
    );

    // The registry does not check declared sizes; slate refuses before asking for the blob
    // (reading it would have found fewer bytes and said so instead).
    let five_mib = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": INDEX_MEDIA_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": EMPTY_CONFIG, "size": 2},
        "layers": [{"mediaType": INDEX_MEDIA_TYPE, "digest": sha256(good.as_bytes()), "size": 5 << 20}],
    });
    // The blobs go up with an honest artifact; the lying manifest is put by hand.
    push_artifact(
        &work.path().join("b"),
        &repo(&registry, "five-mib"),
        INDEX_MEDIA_TYPE,
        good.as_bytes(),
    );
    put_manifest(&registry, "five-mib", &five_mib);
    let err = fetch("five-mib");
    assert!(
        matches!(err, TransportError::Oversize { limit: 4194304, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("declares 5242880 bytes"), "{err}");

    push_artifact(
        &work.path().join("c"),
        &repo(&registry, "bad-json"),
        INDEX_MEDIA_TYPE,
        b"{\"schema\": 1, \"releases\": [",
    );
    let err = fetch("bad-json");
    assert!(matches!(err, TransportError::Malformed { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not valid JSON of schema 1"),
        "{err}"
    );

    push_artifact(
        &work.path().join("d"),
        &repo(&registry, "schema-2"),
        INDEX_MEDIA_TYPE,
        br#"{"schema": 2, "releases": []}"#,
    );
    let err = fetch("schema-2");
    assert!(err.to_string().contains("schema 2 is not one"), "{err}");

    let mut not_ours = five_mib;
    not_ours["artifactType"] = "application/vnd.example.other".into();
    not_ours["layers"][0]["size"] = good.len().into();
    push_raw(
        &work.path().join("e"),
        &repo(&registry, "not-ours"),
        not_ours,
        &[b"{}", good.as_bytes()],
    );
    let err = fetch("not-ours");
    assert!(err.to_string().contains("artifactType"), "{err}");
}

#[test]
fn an_oversized_layer_is_never_asked_for() {
    let index = ReleaseIndex::default().to_json();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": INDEX_MEDIA_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": EMPTY_CONFIG, "size": 2},
        "layers": [{"mediaType": INDEX_MEDIA_TYPE, "digest": sha256(index.as_bytes()), "size": 5 << 20}],
    }))
    .unwrap();
    let blob_asked = Arc::new(AtomicBool::new(false));
    let asked = blob_asked.clone();
    let server = FakeServer::start(move |req, _| {
        if req.path.contains("/manifests/releases") {
            let digest = sha256(&manifest);
            response(
                "200 OK",
                &[
                    ("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                    ("Docker-Content-Digest", &digest),
                ],
                &manifest,
            )
        } else {
            asked.store(true, Ordering::SeqCst);
            response("200 OK", &[], index.as_bytes())
        }
    });
    let os = Reference::parse(&format!("{}/os", server.host)).unwrap();
    let err = fetch_release_index(&os, &options()).unwrap_err();
    assert!(matches!(err, TransportError::Oversize { .. }), "{err:?}");
    assert!(!blob_asked.load(Ordering::SeqCst), "the blob was requested");
}

#[test]
fn layouts_and_digests_are_not_release_repositories() {
    let hex = "ab".repeat(32);
    for input in [
        "oci-layout:/tmp/nowhere".to_owned(),
        format!("localhost:1/os@sha256:{hex}"),
    ] {
        let err = fetch_release_index(&Reference::parse(&input).unwrap(), &options()).unwrap_err();
        assert!(matches!(err, TransportError::Usage(_)), "{input}: {err:?}");
    }
}

#[test]
fn a_channel_tag_is_the_same_manifest_and_keeps_its_signature() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("bundle");
    write_test_bundle(&bundle, "2.0.0", &noise(1, 4096), &noise(2, 1024));
    let sig_tag = add_fake_signature(&bundle, "2.0.0");
    let digest = manifest_digest(&bundle, "2.0.0");
    let os = repo(&registry, "slate/os");
    push(&bundle, &os, &mut |_| {}).unwrap();

    assert_eq!(
        tag_manifest(&os, "2.0.0", "stable", &options()).unwrap(),
        digest
    );
    assert_eq!(
        tag_manifest(&os, &digest, "beta", &options()).unwrap(),
        digest
    );
    let pulled = pull(
        &repo(&registry, "slate/os:stable"),
        &work.path().join("cache"),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(pulled.manifest_digest, digest);
    assert_eq!(pulled.signature_tag.as_deref(), Some(sig_tag.as_str()));
    let err = tag_manifest(&os, "9.9.9", "alpha", &options()).unwrap_err();
    assert!(matches!(err, TransportError::NotFound { .. }), "{err:?}");
    assert_eq!(resolve_tag(&os, "alpha", &options()).unwrap(), None);
    assert!(tag_manifest(&os, "2.0.0", "bad tag", &options()).is_err());
}

/// The registry's index with another writer put in after some of this writer's writes: it
/// stores `stale`, an index read before the write it follows (a publisher whose read came first
/// and whose write came last).
struct Interposer {
    inner: RegistryIndex,
    repository: Reference,
    stale: ReleaseIndex,
    /// How many of this writer's writes the other one follows.
    times: Cell<u32>,
}

impl IndexStore for Interposer {
    fn place(&self) -> String {
        self.inner.place()
    }

    fn load(&self) -> Result<Option<StoredIndex>, TransportError> {
        self.inner.load()
    }

    fn store_if(
        &self,
        index: &ReleaseIndex,
        expected: Option<&str>,
    ) -> Result<Option<String>, TransportError> {
        let written = self.inner.store_if(index, expected)?;
        if self.times.get() > 0 {
            self.times.set(self.times.get() - 1);
            store_release_index(&self.repository, &self.stale, &options())?;
        }
        Ok(written)
    }
}

/// A repository holding 1.0.0, and what another publisher that read it and added 1.5.0 would
/// write.
fn seeded(registry: &TestRegistry, name: &str) -> (Reference, ReleaseIndex) {
    let os = repo(registry, name);
    let mut index = ReleaseIndex::default();
    index.publish(release("1.0.0", 1, Channel::Stable)).unwrap();
    store_release_index(&os, &index, &options()).unwrap();
    index.publish(release("1.5.0", 3, Channel::Beta)).unwrap();
    (os, index)
}

#[test]
fn a_write_replaced_by_another_publisher_is_made_again_on_top_of_it() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let (os, theirs) = seeded(&registry, "replaced");
    let store = Interposer {
        inner: RegistryIndex::open(&os, &options()).unwrap(),
        repository: os.clone(),
        stale: theirs,
        times: Cell::new(1),
    };
    let update = update_index(&store, |index| {
        index.publish(release("2.0.0", 2, Channel::Alpha))
    })
    .unwrap();
    assert_eq!(update.attempts, 2, "the lost write was noticed and redone");
    assert_eq!(update.outcome, Published::New);
    assert!(update.written);
    let now = fetch_release_index(&os, &options()).unwrap().unwrap();
    assert_eq!(versions(&now), ["1.0.0", "1.5.0", "2.0.0"], "both changes");
    assert_eq!(update.index, now);
}

#[test]
fn a_write_between_the_read_and_the_write_is_seen_before_writing() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let (os, _) = seeded(&registry, "between");
    let mut first = true;
    let update = update_release_index(&os, &options(), |index| {
        if std::mem::take(&mut first) {
            // The other publisher's whole update runs after this one's read.
            let other = update_release_index(&os, &options(), |index| {
                index.publish(release("1.5.0", 3, Channel::Beta))
            })
            .unwrap();
            assert_eq!(other.attempts, 1);
        }
        index.publish(release("2.0.0", 2, Channel::Alpha))
    })
    .unwrap();
    assert_eq!(update.attempts, 2);
    let now = fetch_release_index(&os, &options()).unwrap().unwrap();
    assert_eq!(versions(&now), ["1.0.0", "1.5.0", "2.0.0"]);
}

#[test]
fn a_publisher_that_keeps_losing_gives_up_saying_so() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let (os, theirs) = seeded(&registry, "contended");
    let store = Interposer {
        inner: RegistryIndex::open(&os, &options()).unwrap(),
        repository: os.clone(),
        stale: theirs,
        times: Cell::new(u32::MAX),
    };
    let err = update_index(&store, |index| {
        index.publish(release("2.0.0", 2, Channel::Alpha))
    })
    .unwrap_err();
    assert!(
        matches!(err, UpdateError::Contended { attempts, .. } if attempts == MAX_UPDATE_ATTEMPTS),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("kept being replaced"), "{text}");
    assert!(text.contains("this change is not in the index"), "{text}");
    let now = fetch_release_index(&os, &options()).unwrap().unwrap();
    assert_eq!(
        versions(&now),
        ["1.0.0", "1.5.0"],
        "the other's change stands"
    );
}

#[test]
fn an_update_that_changes_nothing_writes_nothing_and_refusals_pass_through() {
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let (os, _) = seeded(&registry, "unchanged");
    let before = fetch_stored_index(&os, &options()).unwrap().unwrap();
    let update = update_release_index(&os, &options(), |index| {
        index.publish(release("1.0.0", 1, Channel::Stable))
    })
    .unwrap();
    assert_eq!(update.outcome, Published::Unchanged);
    assert!(!update.written);
    assert_eq!(update.digest.as_deref(), Some(before.digest.as_str()));

    let err = update_release_index(&os, &options(), |index| {
        index.yank("7.0.0", "no").map(|_| ())
    })
    .unwrap_err();
    assert!(
        matches!(err, UpdateError::Change(ReleaseError::NotFound(ref v)) if v == "7.0.0"),
        "{err:?}"
    );
    assert_eq!(
        fetch_stored_index(&os, &options()).unwrap().unwrap(),
        before
    );
}
