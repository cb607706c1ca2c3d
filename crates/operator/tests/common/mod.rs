//! What the operator's etcd tests share: a node's stored record.

use slate_rollout::{NodeRecord, NodeReport};

/// A healthy, committed node `id` of `group` on the stable channel at `version`, last seen at
/// `last_seen` (seconds since the epoch).
pub fn node_record(id: &str, group: &str, version: &str, last_seen: u64) -> NodeRecord {
    NodeRecord {
        report: NodeReport::settled(id, group, format!("{id}:50000"), version),
        last_seen,
    }
}
