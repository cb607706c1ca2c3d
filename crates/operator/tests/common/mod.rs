//! What the operator's etcd tests share: a node's stored record.

use slate_rollout::{NodeRecord, NodeReport};

/// A healthy, committed node `id` of `group` on the stable channel at `version`, last seen at
/// `last_seen` (seconds since the epoch).
pub fn node_record(id: &str, group: &str, version: &str, last_seen: u64) -> NodeRecord {
    NodeRecord {
        report: NodeReport {
            id: id.into(),
            group: group.into(),
            endpoint: format!("{id}:50000"),
            version: version.into(),
            channel: "stable".into(),
            committed: true,
            healthy: true,
            busy: false,
            labels: Default::default(),
            last_failure: None,
            sent_at_ms: 0,
        },
        last_seen,
    }
}
