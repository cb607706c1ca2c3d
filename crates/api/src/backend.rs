//! What the server asks of the node: [`NodeBackend`], implemented by machined.

use crate::types::{
    ApplyConfigRequest, ApplyConfigResult, ConfigView, Event, NodeServiceStatus, PinRequest,
    PinResult, RebootMode, RollbackRequest, RollbackResult, ServiceControlRequest, ServicesView,
    Status, UpgradeRequest, UploadedBundle, VersionInfo,
};

/// Lines of a log, consumed on a dedicated thread (blocking in `next` is fine).
///
/// `None` ends the HTTP response. When the client goes away, the iterator is dropped the next
/// time it yields a line; a following iterator should therefore not block forever without a
/// line (e.g. wrap an `mpsc::Receiver` and give up on a disconnected sender).
pub type LineStream = Box<dyn Iterator<Item = String> + Send>;

/// Events for one subscriber of `GET /v1/events`: machined keeps the `Sender` side in its list
/// of subscribers and drops it (or sees `send` fail) to end the stream.
///
/// Contract: before returning the receiver, the backend sends the backlog the subscriber should
/// see first (at least the current stage), so that `follow=false` — which drains what is
/// already queued without waiting — has something to show. With `follow=true` the server keeps
/// forwarding until the sender is dropped or the client goes away (then the receiver is
/// dropped within about a second, so the next `send` fails and the subscriber can be pruned).
pub type EventStream = std::sync::mpsc::Receiver<Event>;

/// Why a backend call failed; each maps to an HTTP status and [`crate::ErrorCode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Another sequence holds the lock and may not be taken over: HTTP 409 `locked`.
    #[error("locked: {0}")]
    Locked(String),
    /// The request is refused as given (bad image reference, downgrade not allowed, …):
    /// HTTP 400 `invalid_argument`.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The node cannot do this in its mode (capability missing): HTTP 400 `unsupported`.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// What the request names does not exist (a service's resource; the node routes do not
    /// use it): HTTP 404 `not_found`, the code of an unknown path too, so that a client
    /// treats both as "not there".
    #[error("not found: {0}")]
    NotFound(String),
    /// The caller may not do this, whatever its role (a node reporting about another node):
    /// HTTP 403 `permission_denied`.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Anything else: HTTP 500 `internal`.
    #[error("{0}")]
    Failed(String),
}

/// The node behind the API. machined implements it with plain threads: every method is called
/// from a blocking-capable thread (never on the async executor), so it may take locks, wait
/// and do I/O. Calls may arrive concurrently.
///
/// Mutating calls (`reboot`, `reset`, `upgrade`) should take the sequence lock, start the
/// sequence (on another thread) and return: the HTTP answer (202) goes out when they return,
/// and a reboot would otherwise cut it off. Return [`BackendError::Locked`] when the lock is
/// held by a sequence that may not be taken over.
pub trait NodeBackend: Send + Sync {
    /// `GET /v1/version`.
    fn version(&self) -> VersionInfo;
    /// `GET /v1/status`.
    fn status(&self) -> Status;
    /// `POST /v1/reboot` (operator).
    fn reboot(&self, mode: RebootMode) -> Result<(), BackendError>;
    /// `POST /v1/reboot` with `entry` (admin): `entry` boots next, once (systemd-boot's
    /// `LoaderEntryOneShot`), then the default again.
    fn reboot_once_into(&self, entry: &str, mode: RebootMode) -> Result<(), BackendError> {
        let _ = (entry, mode);
        Err(BackendError::Unsupported(
            "this node cannot boot an entry once".into(),
        ))
    }
    /// `POST /v1/reset` (admin).
    fn reset(&self) -> Result<(), BackendError>;
    /// `POST /v1/shutdown` (operator): the Shutdown sequence, then power off.
    fn shutdown(&self) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(
            "this node cannot shut down".into(),
        ))
    }
    /// `POST /v1/upgrade` (operator).
    fn upgrade(&self, req: UpgradeRequest) -> Result<(), BackendError>;
    /// `POST /v1/rollback` (admin): the previous version boots next, on trial, and the node
    /// reboots after the answer (not on a dry run).
    fn rollback(&self, req: RollbackRequest) -> Result<RollbackResult, BackendError> {
        let _ = req;
        Err(BackendError::Unsupported(
            "this node cannot roll back".into(),
        ))
    }
    /// `POST /v1/pins` (admin): pin or unpin a version on the ESP.
    fn pin(&self, req: PinRequest) -> Result<PinResult, BackendError> {
        let _ = req;
        Err(BackendError::Unsupported(
            "this node cannot pin versions".into(),
        ))
    }
    /// `POST /v1/bundles` (admin): an installer bundle as a tar stream of its OCI layout. The
    /// backend unpacks and checks it and answers what it kept; `body` ends with an error if the
    /// upload breaks or exceeds [`crate::MAX_UPLOAD_BYTES`].
    fn receive_bundle(&self, body: &mut dyn std::io::Read) -> Result<UploadedBundle, BackendError> {
        let _ = body;
        Err(BackendError::Unsupported(
            "this node does not take bundle uploads".into(),
        ))
    }
    /// `GET /v1/config` (reader): the machine configuration in effect, secrets redacted.
    fn show_config(&self) -> Result<ConfigView, BackendError> {
        Err(BackendError::Unsupported(
            "this node has no machine configuration".into(),
        ))
    }
    /// `POST /v1/config` (admin; in maintenance mode, the token's holder): validate a machine
    /// configuration, then (unless a dry run) write it and apply it as `mode` says.
    fn apply_config(&self, req: ApplyConfigRequest) -> Result<ApplyConfigResult, BackendError> {
        let _ = req;
        Err(BackendError::Unsupported(
            "this node does not take machine configurations".into(),
        ))
    }
    /// `GET /v1/boot` (reader): the boot entries on the system disk and which one boots next,
    /// and why (`slate_bootloader::BootExplanation` as JSON; the API does not depend on it).
    fn boot_explain(&self) -> Result<serde_json::Value, BackendError> {
        Err(BackendError::Unsupported(
            "this node cannot explain its boot".into(),
        ))
    }
    /// `GET /v1/image` (reader): the running version taken apart as `slate upgrade --check`
    /// compares it with a bundle (`slate_bundle_diff::Summary` as JSON; the API does not
    /// depend on it). Reads only; one at a time (another request meanwhile: `Locked`).
    fn image_summary(&self) -> Result<serde_json::Value, BackendError> {
        Err(BackendError::Unsupported(
            "this node cannot describe its running image".into(),
        ))
    }
    /// `GET /v1/snapshots` (reader): a snapshot root's snapshots, entries, running, fallback
    /// and next (`slate_snapshot_engine::Listing` as JSON).
    fn snapshot_list(&self) -> Result<serde_json::Value, BackendError> {
        Err(BackendError::Unsupported(
            "this node's root is not a Btrfs snapshot".into(),
        ))
    }
    /// `POST /v1/snapshots/upgrade` (admin): snapshot the root, run the command in the new
    /// snapshot, validate and register it to boot next on trial; the engine's report, with the
    /// lines it logged. With `reboot`, the node reboots after answering.
    fn snapshot_upgrade(
        &self,
        req: crate::SnapshotUpgradeRequest,
    ) -> Result<serde_json::Value, BackendError> {
        let _ = req;
        Err(BackendError::Unsupported(
            "this node's root is not a Btrfs snapshot".into(),
        ))
    }
    /// `GET /v1/events`: a new subscription; see [`EventStream`] for the contract.
    /// `GET /v1/services`: the node's services.
    fn services(&self) -> Result<ServicesView, BackendError> {
        Err(BackendError::Unsupported(
            "this node runs no services".into(),
        ))
    }

    /// `POST /v1/services`: start, stop or restart one.
    fn control_service(
        &self,
        req: ServiceControlRequest,
    ) -> Result<NodeServiceStatus, BackendError> {
        let _ = req;
        Err(BackendError::Unsupported(
            "this node runs no services".into(),
        ))
    }

    fn events(&self) -> EventStream;
    /// `GET /v1/logs`: machined's own log lines (without trailing newlines). With `follow`,
    /// the iterator first yields the retained lines, then blocks for new ones.
    fn logs(&self, follow: bool) -> Result<LineStream, BackendError>;
    /// `GET /v1/dmesg`: kernel log lines, like [`NodeBackend::logs`].
    fn dmesg(&self, follow: bool) -> Result<LineStream, BackendError>;
    /// A line the server wants logged: refused handshakes, denied and failed requests,
    /// mutating requests. The default drops it; machined puts it in its log. Called on the
    /// server's logging thread, behind a bounded queue that drops (and counts) lines when full,
    /// so a slow log never stalls a request.
    fn log_api(&self, message: &str) {
        let _ = message;
    }

    /// What the node counts beyond its [`NodeBackend::status`], for `GET /metrics` (the API
    /// derives the rest from the status). The default counts nothing.
    fn metrics(&self) -> NodeMetrics {
        NodeMetrics::default()
    }
}

/// A node's counters and measurements that its status does not carry, for `GET /metrics`.
/// The outcome counters (upgrades, rollbacks, boots) outlive a boot (machined keeps them on
/// STATE); the others count since machined started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeMetrics {
    /// Upgrades by outcome (machined: `installed`, `failed`, `staged`, `stage_failed`,
    /// `committed`, `reverted`).
    pub upgrades: Vec<(String, u64)>,
    /// Returns to an older version by outcome (`done`, `failed` through the API; `reverted`,
    /// `fallback` at boot).
    pub rollbacks: Vec<(String, u64)>,
    /// Boots by how they ended (`committed`, `failed`).
    pub boots: Vec<(String, u64)>,
    /// CPU time machined has used (user and system), in seconds.
    pub cpu_seconds: Option<f64>,
    /// The last upgrade's phases and how long each took, in seconds (this boot's).
    pub last_upgrade_phases: Vec<(String, f64)>,
    /// Bytes of bundles downloaded (pulled) and reused from the cache.
    pub bytes_downloaded: u64,
    pub bytes_reused: u64,
    /// Each health check by name, and whether it last passed.
    pub health_checks: Vec<(String, bool)>,
    /// Whether a hardware watchdog is fed, and its timeout in seconds.
    pub watchdog: Option<f64>,
    /// The next maintenance window's opening (Unix seconds), when the agent waits for one.
    pub next_window: Option<u64>,
    /// Journal lines dropped from the kept tail (the oldest, beyond its bound).
    pub journal_lines_dropped: u64,
}
