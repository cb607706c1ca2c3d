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
