//! The inventory: what each node reports about itself (its heartbeat) and when it was last
//! heard from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A failed upgrade the node remembers (the node API's `Status.last_failure`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureReport {
    /// The version that failed (and was reverted from).
    pub version: String,
    pub reason: String,
}

/// What a node tells the operator about itself: the body of a heartbeat
/// (`POST /v1/fleet/heartbeat`) and of `slate fleet add-node`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReport {
    /// The node's name (its machine configuration's `node.name`): unique in the fleet.
    pub id: String,
    /// The node group it belongs to: rollouts, percentages and waves are per group.
    pub group: String,
    /// Free-form labels policies select on (`zone = "a"`, `role = "etcd"`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `HOST:PORT` of the node API, where the operator sends the upgrade.
    pub endpoint: String,
    /// The OS version running.
    pub version: String,
    /// The release channel the node's configuration names.
    pub channel: String,
    /// The boot is committed (the node came up healthy on `version` and said so).
    pub committed: bool,
    /// machined's health checks pass.
    pub healthy: bool,
    /// A sequence (an upgrade, a reboot) is running.
    pub busy: bool,
    /// The last upgrade that failed and was reverted, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureReport>,
    /// When the node took this report, by its own clock (Unix milliseconds): reports can
    /// arrive out of order (a slow replica, a retry through another one), and an older one
    /// must not overwrite a newer one.
    #[serde(default)]
    pub sent_at_ms: u64,
}

impl NodeReport {
    /// A node settled on `version`: committed, healthy, idle, on the stable channel, with no
    /// labels and no failure, reported at time 0 — what a fleet looks like between rollouts,
    /// and where simulated fleets and tests start.
    pub fn settled(id: &str, group: &str, endpoint: String, version: &str) -> Self {
        NodeReport {
            id: id.into(),
            group: group.into(),
            labels: BTreeMap::new(),
            endpoint,
            version: version.into(),
            channel: "stable".into(),
            committed: true,
            healthy: true,
            busy: false,
            last_failure: None,
            sent_at_ms: 0,
        }
    }
}

/// A node in the inventory: its last report and when the operator received it (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub report: NodeReport,
    pub last_seen: u64,
}

/// Every known node by id.
pub type Inventory = BTreeMap<String, NodeRecord>;
