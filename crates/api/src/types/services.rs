//! The node's services as the API shows them and takes orders for them (`/v1/services`).

use serde::{Deserialize, Serialize};

/// One of the node's services (`GET /v1/services`, `slate services`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeServiceStatus {
    pub name: String,
    /// `waiting` (for what it depends on), `running`, `backoff` (to restart), `stopping`,
    /// `stopped`, `exited` (its policy does not restart it) or `failed` (it could not start).
    pub state: String,
    /// Its main process while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When it entered its state, seconds since the epoch.
    pub since: u64,
    /// How often it was started again after it ended.
    pub restarts: u32,
    /// Its readiness check passed (or it has none and runs).
    pub ready: bool,
    /// How its last run ended (`exit code 1`, `signal 9`), or why it could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
    /// Its cgroup's `memory.current`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// In `backoff`: milliseconds until the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_in_ms: Option<u64>,
}

/// `GET /v1/services`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicesView {
    pub services: Vec<NodeServiceStatus>,
}

/// What `POST /v1/services` does to a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceAction {
    Start,
    Stop,
    Restart,
}

/// `POST /v1/services` body (operator).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceControlRequest {
    pub name: String,
    pub action: ServiceAction,
}
