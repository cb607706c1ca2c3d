//! `slate release publish | promote | yank | list` end to end against a real registry (Debian's
//! docker-registry, started by the transport tests' harness): channel views, channel tags that
//! resolve to the right bundle, barriers, yanks, refusals, and dry runs that write nothing.

#[path = "../../transport/tests/support/registry.rs"]
mod registry;

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::s;
use slate_bundle::{Bundle, BundleSpec};

/// 2026-12-01T00:00:00Z.
const EPOCH: &str = "1796083200";

fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .env_remove("SLATE_REGISTRY_USERNAME")
        .env("SOURCE_DATE_EPOCH", EPOCH)
        .output()
        .expect("run slate")
}

fn ok(args: &[&str]) -> String {
    let out = slate(args);
    assert!(
        out.status.success(),
        "slate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = slate(args);
    assert!(
        !out.status.success(),
        "slate {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

struct Fixture {
    dir: tempfile::TempDir,
    /// Kept running until the test ends.
    _registry: registry::TestRegistry,
    repo: String,
}

impl Fixture {
    fn start() -> Option<Self> {
        let registry = registry::TestRegistry::start()?;
        let dir = tempfile::tempdir().unwrap();
        ok(&["keygen", "--out", s(&dir.path().join("keys"))]);
        let repo = registry.image("slate/os");
        Some(Fixture {
            dir,
            _registry: registry,
            repo,
        })
    }

    /// An unsigned bundle of `version`; returns its directory and manifest digest.
    fn bundle(&self, version: &str) -> (PathBuf, String) {
        self.bundle_of(version, &format!("MZ pretend UKI of {version}"))
    }

    fn bundle_of(&self, version: &str, uki: &str) -> (PathBuf, String) {
        let out = self
            .dir
            .path()
            .join(format!("bundle-{version}-{}", uki.len()));
        common::write_bundle(
            &out,
            BundleSpec {
                name: "slate",
                version,
                arch: "amd64",
                variant: "demo",
            },
            uki.as_bytes(),
            b"MZ pretend systemd-boot",
        );
        let digest = Bundle::open(&out, None)
            .unwrap()
            .manifest_digest()
            .to_owned();
        (out, digest)
    }

    fn signed(&self, version: &str) -> (PathBuf, String) {
        let (out, digest) = self.bundle(version);
        self.sign(&out);
        (out, digest)
    }

    fn sign(&self, out: &Path) {
        let key = self.dir.path().join("keys/slate.key");
        ok(&["sign", "--bundle", s(out), "--key", s(&key)]);
    }

    fn list(&self) -> serde_json::Value {
        json(&ok(&[
            "release", "list", "--image", &self.repo, "--output", "json",
        ]))
    }

    fn list_text(&self) -> String {
        ok(&["release", "list", "--image", &self.repo])
    }

    /// The digest `REPO:tag` resolves to, through `slate pull`.
    fn pulled(&self, tag: &str) -> String {
        let cache = self.dir.path().join(format!("cache-{tag}"));
        let _ = std::fs::remove_dir_all(&cache);
        let out = json(&ok(&[
            "pull",
            "--image",
            &format!("{}:{tag}", self.repo),
            "--cache",
            s(&cache),
            "--output",
            "json",
        ]));
        out["digest"].as_str().unwrap().to_owned()
    }

    fn publish(&self, bundle: &Path, channel: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "release",
            "publish",
            "--bundle",
            s(bundle),
            "--image",
            &self.repo,
            "--channel",
            channel,
        ];
        args.extend(extra);
        ok(&args)
    }
}

fn versions(view: &serde_json::Value) -> Vec<&str> {
    view["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

#[test]
fn publish_promote_and_yank_move_the_channels_and_their_tags() {
    let Some(fx) = Fixture::start() else {
        return;
    };
    let (v1, d1) = fx.signed("1.0.0");
    let (v2, d2) = fx.signed("2.0.0");

    let out = fx.publish(&v1, "stable", &[]);
    assert!(out.contains(&format!("pushed {}:1.0.0", fx.repo)), "{out}");
    assert!(out.contains("published 1.0.0: new in stable"), "{out}");
    for channel in ["alpha", "beta", "stable"] {
        assert!(
            out.contains(&format!("moved tag {channel}: (none) → 1.0.0 ({d1})")),
            "{out}"
        );
    }
    let out = fx.publish(&v2, "beta", &["--min-from", "1.0.0"]);
    assert!(out.contains("published 2.0.0: new in beta"), "{out}");
    assert!(out.contains("moved tag beta: 1.0.0 → 2.0.0"), "{out}");
    assert!(out.contains("tag stable: 1.0.0 (unchanged)"), "{out}");

    // The channel views: stable sees 1.0.0 only, beta and alpha both.
    let listed = fx.list();
    assert_eq!(versions(&listed["channels"]["stable"]), ["1.0.0"]);
    assert_eq!(versions(&listed["channels"]["beta"]), ["1.0.0", "2.0.0"]);
    assert_eq!(versions(&listed["channels"]["alpha"]), ["1.0.0", "2.0.0"]);
    assert_eq!(listed["channels"]["stable"]["newest"], "1.0.0");
    assert_eq!(listed["channels"]["stable"]["tag"], d1.as_str());
    assert_eq!(listed["channels"]["beta"]["tag"], d2.as_str());
    let releases = listed["index"]["releases"].as_array().unwrap();
    assert_eq!(releases[1]["digest"], d2.as_str());
    assert_eq!(releases[1]["channel"], "beta");
    assert_eq!(releases[1]["min_from"], "1.0.0");
    assert_eq!(releases[1]["official"], true);
    assert_eq!(releases[1]["created"], "2026-12-01T00:00:00Z");
    assert_eq!(listed["index"]["schema"], 1);
    let text = fx.list_text();
    let (stable, beta) = text.split_once("\nbeta (").unwrap();
    assert!(stable.contains("\nstable (tag stable → 1.0.0)"), "{text}");
    assert!(!stable.contains("2.0.0"), "{text}");
    assert!(
        beta.contains("  1.0.0 → 2.0.0 (min-from 1.0.0: older versions must stop at 1.0.0 first)"),
        "{text}"
    );
    assert!(
        beta.contains(&format!(
            "      {d2}  created 2026-12-01T00:00:00Z  official"
        )),
        "{text}"
    );
    let only_stable = json(&ok(&[
        "release",
        "list",
        "--image",
        &fx.repo,
        "--channel",
        "stable",
        "--output",
        "json",
    ]));
    assert_eq!(
        only_stable["channels"].as_object().unwrap().len(),
        1,
        "{only_stable}"
    );

    // A dry run says what it would do and writes nothing.
    let out = ok(&[
        "release",
        "promote",
        "2.0.0",
        "--image",
        &fx.repo,
        "--channel",
        "stable",
        "--dry-run",
    ]);
    assert!(
        out.contains("would promote 2.0.0: promoted from beta to stable"),
        "{out}"
    );
    assert!(
        out.contains("would move tag stable: 1.0.0 → 2.0.0"),
        "{out}"
    );
    assert_eq!(fx.list(), listed, "the dry run changed the registry");
    assert_eq!(fx.pulled("stable"), d1);

    let out = ok(&[
        "release",
        "promote",
        "2.0.0",
        "--image",
        &fx.repo,
        "--channel",
        "stable",
    ]);
    assert!(out.contains("2.0.0: promoted from beta to stable"), "{out}");
    assert_eq!(
        fx.pulled("stable"),
        d2,
        "the stable tag names 2.0.0's bundle"
    );
    let err = fails(&[
        "release",
        "promote",
        "2.0.0",
        "--image",
        &fx.repo,
        "--channel",
        "beta",
    ]);
    assert!(
        err.contains("version 2.0.0 is in stable; promotion goes forward only (not to beta)"),
        "{err}"
    );

    let out = ok(&[
        "release",
        "yank",
        "2.0.0",
        "--image",
        &fx.repo,
        "--reason",
        "eats disks",
    ]);
    assert!(out.contains("2.0.0 YANKED: eats disks"), "{out}");
    assert!(out.contains("moved tag stable: 2.0.0 → 1.0.0"), "{out}");
    assert_eq!(fx.pulled("stable"), d1, "the stable tag is back on 1.0.0");
    assert_eq!(fx.pulled("alpha"), d1);
    let text = fx.list_text();
    assert!(text.contains("  2.0.0 YANKED: eats disks"), "{text}");
    assert_eq!(fx.list()["index"]["releases"][1]["yanked"], "eats disks");

    // Nothing left to fall back to: the tags stay, and say so.
    let out = ok(&[
        "release", "yank", "1.0.0", "--image", &fx.repo, "--reason", "also bad",
    ]);
    assert!(
        out.contains(
            "tag stable left on 1.0.0: channel stable offers no release that is not yanked"
        ),
        "{out}"
    );
    assert_eq!(fx.pulled("stable"), d1);
    let err = fails(&[
        "release", "yank", "3.0.0", "--image", &fx.repo, "--reason", "x",
    ]);
    assert!(err.contains("no release 3.0.0 in the index"), "{err}");
}

#[test]
fn unsigned_bundles_are_refused_and_dry_runs_write_nothing() {
    let Some(fx) = Fixture::start() else {
        return;
    };
    let (unsigned, _) = fx.bundle("1.0.0");
    let err = fails(&[
        "release",
        "publish",
        "--bundle",
        s(&unsigned),
        "--image",
        &fx.repo,
        "--channel",
        "stable",
    ]);
    assert!(err.contains("is not signed"), "{err}");
    let err = fails(&[
        "release",
        "publish",
        "--bundle",
        s(&unsigned),
        "--image",
        &fx.repo,
        "--channel",
        "stable",
        "--allow-unsigned",
    ]);
    assert!(err.contains("add --unofficial"), "{err}");
    assert!(fx.list_text().contains("no release index"));

    let (signed, digest) = fx.signed("2.0.0");
    let out = fx.publish(&signed, "alpha", &["--dry-run"]);
    assert!(
        out.contains(&format!("would push 2.0.0 ({digest}) as {}:2.0.0", fx.repo)),
        "{out}"
    );
    assert!(out.contains("would publish 2.0.0: new in alpha"), "{out}");
    assert!(
        out.contains("would move tag alpha: (none) → 2.0.0"),
        "{out}"
    );
    assert!(out.contains("tag stable: none"), "{out}");
    assert!(out.contains("dry run: nothing was written"), "{out}");
    let listed = fx.list();
    assert_eq!(listed["index_digest"], serde_json::Value::Null);
    assert_eq!(listed["index"]["releases"], serde_json::json!([]));
    let err = fails(&[
        "pull",
        "--image",
        &format!("{}:2.0.0", fx.repo),
        "--cache",
        s(&fx.dir.path().join("c")),
    ]);
    assert!(err.contains("not found"), "the dry run pushed: {err}");

    let out = fx.publish(&unsigned, "alpha", &["--allow-unsigned", "--unofficial"]);
    assert!(out.contains("published 1.0.0: new in alpha"), "{out}");
    assert!(fx.list_text().contains("unofficial"));
    // Another bundle under a published version is refused before anything is pushed.
    let (other, other_digest) = fx.bundle_of("1.0.0", "MZ another UKI of 1.0.0");
    fx.sign(&other);
    let err = fails(&[
        "release",
        "publish",
        "--bundle",
        s(&other),
        "--image",
        &fx.repo,
        "--channel",
        "alpha",
    ]);
    assert!(
        err.contains("version 1.0.0 is already published as sha256:"),
        "{err}"
    );
    let err = fails(&[
        "pull",
        "--image",
        &format!("{}@{other_digest}", fx.repo),
        "--cache",
        s(&fx.dir.path().join("d")),
    ]);
    assert!(
        err.contains("not found"),
        "the refused bundle was pushed: {err}"
    );
}

/// The index of `fx`'s repository as stored: its manifest digest, and the index.
fn stored(fx: &Fixture) -> (String, slate_release::ReleaseIndex) {
    let repo = slate_transport::Reference::parse(&fx.repo).unwrap();
    let s = slate_transport::releases::fetch_stored_index(&repo, &Default::default())
        .unwrap()
        .unwrap();
    (s.digest, s.index)
}

/// Write `index` as it is (no check: the reader is what is tested).
fn store(fx: &Fixture, index: &slate_release::ReleaseIndex) {
    let repo = slate_transport::Reference::parse(&fx.repo).unwrap();
    slate_transport::store_release_index(&repo, index, &Default::default()).unwrap();
}

#[test]
fn a_refused_promote_or_yank_writes_nothing_and_list_flags_missing_manifests() {
    let Some(fx) = Fixture::start() else {
        return;
    };
    let (v1, d1) = fx.signed("1.0.0");
    fx.publish(&v1, "stable", &[]);
    // 2.0.0 in the index, its bundle never pushed (or deleted since).
    let (_, mut index) = stored(&fx);
    let lost = format!("sha256:{}", "e".repeat(64));
    index
        .publish(slate_release::Release {
            version: "2.0.0".into(),
            digest: lost.clone(),
            created: "2026-12-02T00:00:00Z".into(),
            channel: slate_release::Channel::Beta,
            official: true,
            min_from: None,
            yanked: None,
        })
        .unwrap();
    store(&fx, &index);
    let (before, _) = stored(&fx);

    for dry in [false, true] {
        let mut args = vec![
            "release",
            "promote",
            "2.0.0",
            "--image",
            &fx.repo,
            "--channel",
            "stable",
        ];
        if dry {
            args.push("--dry-run");
        }
        let out = slate(&args);
        let (stdout, stderr) = (s_(&out.stdout), s_(&out.stderr));
        assert!(!out.status.success(), "{stdout}");
        assert!(
            stderr.contains(&format!("holds no manifest {lost} for release 2.0.0")),
            "{stderr}"
        );
        assert!(stderr.contains("nothing was written"), "{stderr}");
        assert!(!stdout.contains("moved tag"), "{stdout}");
        assert_eq!(
            stored(&fx).0,
            before,
            "the refused promote rewrote the index"
        );
        assert_eq!(fx.pulled("stable"), d1);
    }
    // A yank whose fallback is the lost bundle: refused the same way, before writing.
    let err = fails(&[
        "release", "yank", "1.0.0", "--image", &fx.repo, "--reason", "bad",
    ]);
    assert!(
        err.contains(&format!("holds no manifest {lost} for release 2.0.0")),
        "{err}"
    );
    assert_eq!(stored(&fx).0, before, "the refused yank rewrote the index");

    let text = fx.list_text();
    assert!(
        text.contains("beta (tag beta → 1.0.0, behind the index's 2.0.0)"),
        "{text}"
    );
    assert!(
        text.contains("MISSING: the registry holds no manifest for 2.0.0"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{lost}  created 2026-12-02T00:00:00Z  official  MANIFEST MISSING"
        )),
        "{text}"
    );
    assert!(
        !text.contains(&format!(
            "{d1}  created 2026-12-01T00:00:00Z  official  MANIFEST"
        )),
        "{text}"
    );
    assert_eq!(fx.list()["missing_manifests"], serde_json::json!(["2.0.0"]));
}

fn s_(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_reader_refuses_reserved_versions_and_times_that_are_not_rfc_3339() {
    let Some(fx) = Fixture::start() else {
        return;
    };
    let (v1, _) = fx.signed("1.0.0");
    // A tag in --image is refused, not shown beside the version's (`REPO:releases:1.0.0`).
    let tagged = format!("{}:releases", fx.repo);
    let err = fails(&[
        "release",
        "publish",
        "--bundle",
        s(&v1),
        "--image",
        &tagged,
        "--channel",
        "stable",
        "--dry-run",
    ]);
    assert!(
        err.contains(&format!(
            "--image {tagged}: name the repository only (HOST/REPOSITORY), without :releases"
        )),
        "{err}"
    );
    fx.publish(&v1, "stable", &[]);
    let (_, good) = stored(&fx);
    let cases = [
        (
            "releases",
            "2026-12-01T00:00:00Z",
            "\"releases\" is a tag slate uses itself",
        ),
        (
            "stable",
            "2026-12-01T00:00:00Z",
            "\"stable\" is a tag slate uses itself",
        ),
        (
            "1.0.0",
            "yesterday",
            "created \"yesterday\" is not an RFC 3339 time",
        ),
    ];
    for (version, created, expected) in cases {
        let mut bad = good.clone();
        bad.releases[0].version = version.into();
        bad.releases[0].created = created.into();
        store(&fx, &bad);
        let err = fails(&["release", "list", "--image", &fx.repo]);
        assert!(err.contains(expected), "{version} {created}: {err}");
        let err = fails(&[
            "release",
            "promote",
            "1.0.0",
            "--image",
            &fx.repo,
            "--channel",
            "stable",
        ]);
        assert!(err.contains(expected), "{version} {created}: {err}");
    }
    // A tag left on a release the index has since yanked (a yank whose tag move failed) is
    // ahead of the index's head, and said so.
    store(&fx, &good);
    let (v2, _) = fx.signed("2.0.0");
    fx.publish(&v2, "stable", &[]);
    let (_, mut yanked) = stored(&fx);
    yanked.releases[1].yanked = Some("bad".into());
    store(&fx, &yanked);
    let text = fx.list_text();
    assert!(
        text.contains("stable (tag stable → 2.0.0, ahead of the index's 1.0.0)"),
        "{text}"
    );
}
