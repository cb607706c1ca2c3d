//! A rollout as a value: one group moving to one target version, and where each node stands.
//! The operator keeps it in etcd (one key per group) and replaces it whole by
//! compare-and-swap, so a new leader resumes exactly where the old one stopped.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::node::FailureReport;
use crate::policy::Strategy;

/// How long a rate window can be: starts older than this are forgotten.
pub const RATE_MEMORY_SECONDS: u64 = 86_400;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// Counts up per group.
    pub id: u64,
    pub group: String,
    pub target: String,
    /// The reference nodes upgrade to (`REGISTRY/REPO:VERSION@sha256:…`).
    pub image: String,
    pub created: u64,
    pub state: RolloutState,
    /// Every node the rollout has touched or found already on the target, by id.
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeProgress>,
    /// Upgrade starts in the group in the last day, this rollout's and earlier ones', for
    /// rate limits that hold across rollouts and leaders: (node, Unix seconds).
    #[serde(default)]
    pub recent_starts: Vec<(String, u64)>,
    /// Failed nodes a `resume` accepted: they no longer count against the failure budget.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub acknowledged: BTreeSet<String>,
}

impl Rollout {
    /// Whether `node`'s failure was accepted by a `resume`.
    pub fn acknowledged(&self, node: &str) -> bool {
        self.acknowledged.contains(node)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RolloutState {
    Running,
    /// Stopped starting nodes (by itself: the failure budget; or by `slate fleet pause`);
    /// nodes already upgrading are still followed. Only `resume` moves on.
    Paused {
        reason: String,
        since: u64,
    },
    /// Given up (`slate fleet abort`, or its target was yanked): nothing more happens in it.
    Aborted {
        reason: String,
        at: u64,
    },
    /// Every covered node finished.
    Completed {
        at: u64,
    },
}

impl RolloutState {
    /// Still tracking nodes (running or paused).
    pub fn is_active(&self) -> bool {
        matches!(self, RolloutState::Running | RolloutState::Paused { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Paused { .. } => "paused",
            RolloutState::Aborted { .. } => "aborted",
            RolloutState::Completed { .. } => "completed",
        }
    }
}

/// One node in a rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeProgress {
    /// The version it ran when the rollout started it (none: it was already on the target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// When the upgrade was started (none: already on the target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
    #[serde(default = "in_place")]
    pub strategy: Strategy,
    pub step: Step,
}

fn in_place() -> Strategy {
    Strategy::InPlace
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Asked to upgrade (`issued`: the node accepted the call). `prior_failure` is the node's
    /// last failure when it was started, so that only a new one counts.
    Upgrading {
        issued: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prior_failure: Option<FailureReport>,
    },
    /// Committed on the target at `committed`; must stay healthy for the wave's soak.
    Soaking {
        committed: u64,
    },
    Done {
        at: u64,
    },
    Failed {
        at: u64,
        reason: String,
    },
}

impl Step {
    pub fn name(&self) -> &'static str {
        match self {
            Step::Upgrading { .. } => "upgrading",
            Step::Soaking { .. } => "soaking",
            Step::Done { .. } => "done",
            Step::Failed { .. } => "failed",
        }
    }

    /// Done or failed: the node no longer holds its wave back.
    pub fn is_finished(&self) -> bool {
        matches!(self, Step::Done { .. } | Step::Failed { .. })
    }
}

/// Something that happened, for the event log (`slate fleet status` shows the recent ones).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at: u64,
    pub group: String,
    pub rollout: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    RolloutStarted,
    /// The node was asked to upgrade.
    Started,
    Committed,
    Soaked,
    Failed,
    Paused,
    Resumed,
    Aborted,
    Completed,
}

/// What the leader must tell a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub group: String,
    pub rollout: u64,
    pub node: String,
    pub endpoint: String,
    pub image: String,
    pub strategy: Strategy,
}
