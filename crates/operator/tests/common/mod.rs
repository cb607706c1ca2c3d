//! What the operator's etcd tests share: a node's stored record, a release, and waiting for a
//! condition. (Each test binary uses some of it.)
#![allow(dead_code)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use slate_operator::etcd::{Commit, EtcdState, Outcome};
use slate_operator::state::NODES;
use slate_release::{Channel, Release};
use slate_rollout::{NodeRecord, NodeReport};

/// A healthy, committed node `id` of `group` on the stable channel at `version`, last seen at
/// `last_seen` (seconds since the epoch).
pub fn node_record(id: &str, group: &str, version: &str, last_seen: u64) -> NodeRecord {
    NodeRecord {
        report: NodeReport::settled(id, group, format!("{id}:50000"), version),
        last_seen,
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Stores node `id` of `group` on version 1, seen now.
pub fn put_node(state: &EtcdState, id: &str, group: &str) {
    let record = node_record(id, group, "1", now());
    let commit = Commit {
        puts: vec![(format!("{NODES}{id}"), serde_json::to_vec(&record).unwrap())],
        ..Commit::default()
    };
    assert!(matches!(
        state.commit(&commit).unwrap(),
        Outcome::Committed { .. }
    ));
}

/// An official stable release `version`.
pub fn release(version: &str) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{:064}", 0),
        created: "2026-11-30T00:00:00Z".into(),
        channel: Channel::Stable,
        official: true,
        min_from: None,
        yanked: None,
    }
}

/// Waits until `check` holds; fails with `what` after `within`.
pub fn until(what: &str, within: Duration, check: impl Fn() -> bool) {
    let since = Instant::now();
    while !check() {
        assert!(since.elapsed() < within, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
