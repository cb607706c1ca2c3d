//! What the simulated-fleet tests share (fleet_operator, fleet_metrics, fleet_dashboard): a
//! free port, a release for the index, heartbeats sent as each node to one operator, a daemon
//! killed on drop, and waiting for a condition.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::Child;
use std::time::{Duration, Instant};

use slate_fleet_sim::{Identities, Reporter};
use slate_release::{Channel, Release};
use slate_rollout::NodeReport;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An official stable release of `version` (the digest is never fetched).
pub fn release(version: &str) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        created: "2026-12-01T00:00:00Z".into(),
        channel: Channel::Stable,
        official: true,
        min_from: None,
        yanked: None,
    }
}

/// Each node reports as itself, to the one replica.
pub struct ToOperator {
    pub addr: String,
    pub identities: Identities,
}

impl Reporter for ToOperator {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        let client = self.identities.heartbeat_client(&report.id, &self.addr)?;
        client
            .call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(report))
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// A child process, killed on drop.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Poll `done` until it holds; fail the test after `timeout`. Says how long it took.
pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
}

/// The release index of a test registry's image, published to as a rollout needs.
pub struct Index {
    repo: slate_transport::Reference,
    options: slate_transport::Options,
    index: slate_release::ReleaseIndex,
}

impl Index {
    /// An empty index for `image` (an insecure test registry).
    pub fn new(image: &str) -> Index {
        Index {
            repo: slate_transport::Reference::parse(image).unwrap(),
            options: slate_transport::Options {
                insecure: true,
                ..slate_transport::Options::default()
            },
            index: slate_release::ReleaseIndex::default(),
        }
    }

    /// [`release`] `version` published and the index stored in the registry.
    pub fn publish(&mut self, version: &str) {
        self.index.publish(release(version)).unwrap();
        slate_transport::store_release_index(&self.repo, &self.index, &self.options).unwrap();
    }
}

/// `slate operator run` over `etcd` on a free loopback port, serving with `certs`, its log in
/// `log`; returned once its API answers an admin, with its address.
pub fn start_operator(
    etcd: &[String],
    certs: &std::path::Path,
    image: &str,
    log: &std::path::Path,
) -> (Daemon, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let operator = Daemon(
        std::process::Command::new(env!("CARGO_BIN_EXE_slate"))
            .args(["operator", "run", "--etcd", &etcd.join(",")])
            .args(["--listen", &addr, "--name", "op-a", "--image", image])
            .arg("--certs")
            .arg(certs)
            .args(["--insecure-registry", "--tick", "500ms", "--lease", "2s"])
            .args(["--release-refresh", "1s", "--stale-after", "30s"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for("the operator API", Duration::from_secs(30), || {
        slate_api::Client::from_dir(&addr, certs, slate_api::Role::Admin)
            .unwrap()
            .call::<serde_json::Value, ()>("GET", "/v1/fleet/policy", None)
            .is_ok()
    });
    (operator, addr)
}
