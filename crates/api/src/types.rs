//! The wire types of the node API. `api/openapi.yaml` describes exactly these (a test compares
//! them); change both together.

use serde::{Deserialize, Serialize};

mod services;
mod volumes;
pub use services::{NodeServiceStatus, ServiceAction, ServiceControlRequest, ServicesView};
pub use volumes::VarStatus;

/// The platform mode the node runs in (`cloud`, `container`, `metal`, `metal-agent` on the
/// wire), and how to reboot (`default`, `powercycle`, `kexec`): the sequencer's own types, one
/// definition for machined and the API. `RebootMode::PowerOff` is not part of the wire format:
/// it neither deserializes nor serializes.
pub use slate_sequencer::{Mode, RebootMode};

/// A caller's role, carried as the subject Organization (`O`) of its client certificate, as in
/// Talos. Roles are ordered: `Admin` may do everything `Operator` may, which may do everything
/// `Reader` may. `Node` is below them all: a node's own certificate (issued by its issuing CA
/// under the fleet CA, never by the client CA) is good only for routes that ask for a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A node speaking for itself (its heartbeat to the rollout operator); never from `O`.
    Node,
    /// Read-only: version, status, events, logs, dmesg.
    Reader,
    /// Reader, plus reboot.
    Operator,
    /// Everything: reset and upgrade too.
    Admin,
}

impl Role {
    /// Every role a client certificate's `O=os:<role>` grants, least privileged first.
    pub const ALL: [Role; 3] = [Role::Reader, Role::Operator, Role::Admin];

    /// The role's name as used in the OpenAPI file and file names: `reader`, `operator`, `admin`
    /// (and `node`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// The certificate subject Organization that grants this role: `os:<role>`. `Node` is
    /// granted by no Organization (see [`Role::from_organization`]).
    pub fn organization(self) -> &'static str {
        match self {
            Role::Node => "os:node",
            Role::Reader => "os:reader",
            Role::Operator => "os:operator",
            Role::Admin => "os:admin",
        }
    }

    /// The role an Organization value grants, if it names one of [`Role::ALL`].
    pub fn from_organization(organization: &str) -> Option<Role> {
        Role::ALL
            .into_iter()
            .find(|r| r.organization() == organization)
    }
}

/// Who a verified client certificate says the caller is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub role: Role,
    /// With [`Role::Node`]: the DNS names of the node's certificate. Its issuing CA's name
    /// constraints, checked with the chain, bind them to that node's own names.
    pub node_names: Vec<String>,
}

impl Caller {
    /// A caller with a role and no node identity.
    pub fn with_role(role: Role) -> Self {
        Caller {
            role,
            node_names: Vec::new(),
        }
    }

    /// Whether this caller is the node named `id` (a node certificate naming it).
    pub fn is_node(&self, id: &str) -> bool {
        self.role == Role::Node && self.node_names.iter().any(|n| n == id)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GET /v1/version`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The OS image version that is running.
    pub version: String,
    /// CPU architecture, e.g. `amd64`.
    pub arch: String,
    /// The boot entry (slot) that was booted, e.g. `slate-1.2.0+3.efi`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_entry: Option<String>,
    /// The kernel release, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

/// The machine's lifecycle stage (Talos' MachineStage).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stage {
    Booting,
    Installing,
    Running,
    Rebooting,
    ShuttingDown,
    Resetting,
    Upgrading,
    /// A fatal error happened and the node waits to be inspected (`panic=0`).
    Failed,
}

impl Stage {
    /// Every stage, in declaration order.
    pub const ALL: [Stage; 8] = [
        Stage::Booting,
        Stage::Installing,
        Stage::Running,
        Stage::Rebooting,
        Stage::ShuttingDown,
        Stage::Resetting,
        Stage::Upgrading,
        Stage::Failed,
    ];
}

/// A failed boot or upgrade the node remembers: which version failed and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub version: String,
    pub reason: String,
}

/// The last time the node went back to an older version, kept in META (`LastRollback`) so
/// that the version it returned to reports it after the reboot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackRecord {
    /// The version it left (the one that failed, or the one running when asked by hand).
    pub from: String,
    /// The version it went back to.
    pub to: String,
    /// Why: the failed health check or task, "did not come up in its boot tries", "asked by hand".
    pub reason: String,
    /// Seconds since the Unix epoch, by the node's clock, when it was decided.
    pub time: u64,
}

/// `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The OS image version that is running.
    pub version: String,
    /// The boot entry (slot) that was booted, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_entry: Option<String>,
    pub stage: Stage,
    /// The sequence holding the lock (`Boot`, `Upgrade`, …), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_sequence: Option<String>,
    pub mode: Mode,
    /// The image staged for the next boot by a staged upgrade, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_image: Option<String>,
    /// The last failure the node recorded (e.g. an upgrade that was reverted), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Failure>,
    /// The node's name from its machine configuration (none in maintenance mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The kernel hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// /etc/machine-id: generated on the first boot, kept across versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// The update agent (absent until the boot is committed, or without a configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`): a new value is a new boot,
    /// which is how `--wait` follows a node across its reboots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// This boot is settled: healthy and committed (or nothing was left to commit). Until
    /// then a reboot may still return the node to an older version.
    #[serde(default)]
    pub committed: bool,
    /// The last return to an older version, automatic or by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<RollbackRecord>,
    /// Versions pinned on the ESP (never pruned), from META `PinnedVersions`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<String>,
    /// The firmware's Secure Boot state (absent without UEFI variables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<SecureBootStatus>,
    /// Where this boot's time went (firmware, loader, init, machined's phases and tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_times: Option<BootTimes>,
    /// What machined holds in memory (absent where it cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryUse>,
    /// /var's mode and how this boot prepared it (absent before it is mounted, and on a
    /// snapshot root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub var: Option<VarStatus>,
    /// What is unsafe about the node as it runs, one sentence each: a machine configuration
    /// whose key could sign for other nodes (docs/trust.md, "Migrating from a shared CA").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What machined holds in memory: bounded whatever clients send (issue 19).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// machined's resident set (`VmRSS` of /proc/self/status), KiB.
    pub rss_kib: u64,
    /// Bytes of the journal's lines kept for late readers (at most 1 MiB).
    pub journal_bytes: u64,
}

/// Where a boot's time went (`slate status --boot-times`). Times are microseconds; points of
/// this boot are counted from the kernel's start (the monotonic clock the console timestamps
/// use).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootTimes {
    /// Firmware start to systemd-boot's start (`LoaderTimeInitUSec`; absent without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_us: Option<u64>,
    /// systemd-boot's start to the kernel's (`LoaderTimeExecUSec` − `LoaderTimeInitUSec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader_us: Option<u64>,
    /// Points of the boot in order: `init started`, `modules loaded`, `root mounted`,
    /// `switched root` (slate's init), `machined started`, `running`, `committed`.
    pub milestones: Vec<Milestone>,
    /// machined's phases (`task` absent) and tasks of Initialize, Install and Boot, in the
    /// order they ended.
    pub spans: Vec<BootSpan>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Milestone {
    pub name: String,
    /// Microseconds after the kernel started.
    pub at_us: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootSpan {
    pub sequence: String,
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Microseconds after the kernel started.
    pub start_us: u64,
    pub took_us: u64,
    /// Ended without an error.
    pub ok: bool,
}

/// Secure Boot as the firmware reports it (the UEFI variables `SecureBoot` and `SetupMode`),
/// and the db certificates the running image checks every update's UKI against.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecureBootStatus {
    /// The firmware enforces signatures on what it starts (`SecureBoot` = 1).
    pub enabled: bool,
    /// No platform key is enrolled (`SetupMode` = 1): nothing is enforced, keys may be enrolled.
    pub setup_mode: bool,
    /// Subjects of the db certificates this image carries; empty for an image built without
    /// `[secureboot]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub db: Vec<String>,
}

/// What the node's update agent is doing and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// `immediate`, `periodic`, `fleet-lock`, `operator`, or `disabled`.
    pub strategy: String,
    pub channel: String,
    /// The release repository it follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The newest release the channel offers (not yanked), as last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_available: Option<String>,
    /// The release it is moving to, once chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `idle`, `checking`, `downloading`, `waiting`, `locking`, `upgrading`.
    pub state: String,
    /// Why it is waiting: "up to date", "window opens Tue 02:00", "lock held by node-3 (1/1
    /// slots)", "2.1.0 reverted 3 times: skipped", or the last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Versions it gave up on (reverted too often).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// How `POST /v1/config` applies a new machine configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyMode {
    /// Live when every change can be applied live, else write it and reboot.
    #[default]
    Auto,
    /// Live only: refused (nothing written) when a change needs a reboot.
    NoReboot,
    /// Write it and reboot.
    Reboot,
    /// Write it for the next boot; change nothing now.
    Staged,
}

/// `POST /v1/config` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyConfigRequest {
    /// The machine configuration document (TOML).
    pub config: String,
    #[serde(default)]
    pub mode: ApplyMode,
    /// Validate and say what would change; write nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/config` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyConfigResult {
    /// The sections that differ from the running configuration (`node.hostname`, `network`, …).
    pub changed: Vec<String>,
    /// Whether all of it takes effect only after a reboot.
    pub reboot_required: bool,
    /// What the node did: `applied` (live), `staged` (next boot), `rebooting`, `unchanged`, or
    /// `dry-run`.
    pub outcome: String,
}

/// `GET /v1/config`: the machine configuration in effect, secrets redacted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigView {
    /// The document as JSON (the TOML's tables), with every secret replaced by `<redacted>`.
    pub config: serde_json::Value,
    /// The version of the stored document when it was migrated forward in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrated_from: Option<u32>,
    /// Written by `apply-config` and waiting for the next boot (mode `staged`, or a change
    /// that needs a reboot).
    #[serde(default)]
    pub pending_reboot: bool,
}

/// `POST /v1/reboot` body. An empty body means `{"mode":"default"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebootRequest {
    #[serde(default)]
    pub mode: RebootMode,
    /// Boot this entry (a systemd-boot entry ID such as `slate-1.0.0.efi`) for the next boot
    /// only, through `LoaderEntryOneShot` (admin: it may start an older version).
    #[serde(default)]
    pub entry: Option<String>,
}

/// `POST /v1/rollback` body (admin). An empty body means a rollback with the defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// Check and answer what would happen; write nothing, do not reboot.
    #[serde(default)]
    pub dry_run: bool,
    /// Boot-counting tries for the previous version on systemd-boot (the node's default, 3,
    /// when absent; 1 to 15). GRUB boots it once (`next_entry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tries: Option<u32>,
    #[serde(default)]
    pub reboot_mode: RebootMode,
}

/// `POST /v1/snapshots/upgrade` body (admin): `upgrade --command` on a Btrfs snapshot root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotUpgradeRequest {
    /// Run with `/bin/sh -c` chrooted in the new snapshot (with /proc, /sys, /dev bound).
    pub command: String,
    /// Reboot into the new snapshot after answering.
    #[serde(default)]
    pub reboot: bool,
    #[serde(default)]
    pub dry_run: bool,
    /// Boot-counting tries for the new snapshot on systemd-boot (3 when absent; 1 to 15; GRUB
    /// refuses all but 1). Left out of the body when `None`, as nodes before it expect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tries: Option<u32>,
}

/// `POST /v1/pins` body (admin): pin or unpin one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinRequest {
    pub version: String,
    /// `false` unpins.
    #[serde(default = "yes")]
    pub pin: bool,
    #[serde(default)]
    pub dry_run: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/pins` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinResult {
    /// Every pinned version after the change (as it would be, on a dry run).
    pub pinned: Vec<String>,
    /// Whether META changed (or would).
    pub changed: bool,
    pub dry_run: bool,
}

/// `POST /v1/rollback` answer: what boots next. The node reboots after answering (not on a dry
/// run); the previous version's Running then commits it, or its failure returns the node to
/// `from`, exactly as after an upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackResult {
    /// The entry running now, recorded as the fallback (a UKI file name, or a GRUB slot).
    pub from: String,
    /// The previous version's entry, as it boots next (on trial).
    pub to: String,
    /// The previous version.
    pub version: String,
    pub dry_run: bool,
}

/// `POST /v1/upgrade` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeRequest {
    /// The installer bundle to upgrade to: `bundle:sha256:<hex>` (uploaded), or a registry
    /// reference pinned by version and digest, `REGISTRY/REPO:VERSION@sha256:<hex>`, that the
    /// node pulls after it answers (immediate and forward only).
    pub image: String,
    /// Stage the upgrade for the next boot instead of running it now.
    #[serde(default)]
    pub stage: bool,
    #[serde(default)]
    pub reboot_mode: RebootMode,
    /// Allow moving to an older version.
    #[serde(default)]
    pub allow_downgrade: bool,
    /// Boot-counting tries for the new version (the node's default, 3, when absent): 1 to 15,
    /// `slate_bootspec::INSTALL_TRIES`. The node answers anything else 400 `invalid_argument`
    /// before it takes the upgrade: 0 would mark the version bad before it boots, and a counter
    /// above `INT_MAX` is read as uncounted, so that version would never be rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tries: Option<u32>,
    /// Replace rather than upgrade in place: the new version's first boot formats STATE and
    /// EPHEMERAL afresh and restores the node's machine configuration (META `ReplaceOnBoot`).
    /// Left out of the body when false, so nodes that predate it take in-place requests.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
}

impl UpgradeRequest {
    /// An immediate upgrade to `image` with default options.
    pub fn new(image: impl Into<String>) -> Self {
        UpgradeRequest {
            image: image.into(),
            stage: false,
            reboot_mode: RebootMode::Default,
            allow_downgrade: false,
            tries: None,
            replace: false,
        }
    }
}

/// `POST /v1/bundles` answer: an installer bundle the node received, checked and kept. Upgrade
/// to it with [`UpgradeRequest::image`] = `bundle:<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedBundle {
    /// The digest of the bundle's image manifest (`sha256:…`).
    pub id: String,
    pub name: String,
    pub version: String,
    /// Bytes received.
    pub size: u64,
}

/// The answer to an accepted mutating request (HTTP 202): the operation has started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// `reboot`, `reset` or `upgrade`.
    pub operation: String,
}

/// One line of `GET /v1/events` (newline-delimited JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Milliseconds since the Unix epoch when the event happened.
    pub unix_ms: u64,
    /// What happened; serialized flat: `{"unix_ms":…,"type":"stage","stage":"Running"}`.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// An event stamped with the current time.
    pub fn now(kind: EventKind) -> Self {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Event { unix_ms, kind }
    }
}

/// The kinds of events, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The machine entered a stage.
    Stage { stage: Stage },
    /// A sequence took the lock and started.
    SequenceStarted { sequence: String },
    /// A phase of a running sequence started.
    PhaseStarted { sequence: String, phase: String },
    /// A sequence finished; `error` is set when it failed or was cancelled.
    SequenceFinished {
        sequence: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// The `code` of an [`ApiError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 409: another sequence holds the lock.
    Locked,
    /// 403: the caller's role may not call this endpoint.
    PermissionDenied,
    /// 400: the request is malformed or refused as given.
    InvalidArgument,
    /// 400: the node cannot do this (e.g. reboot in container mode).
    Unsupported,
    /// 404: no such endpoint, or (services) no such resource.
    NotFound,
    /// 405: the endpoint exists, not with this method.
    MethodNotAllowed,
    /// 413: the request body is too large.
    PayloadTooLarge,
    /// 500: the node failed.
    Internal,
    /// A code this client does not know.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// Every code the server sends (not [`ErrorCode::Unknown`]).
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::Locked,
        ErrorCode::PermissionDenied,
        ErrorCode::InvalidArgument,
        ErrorCode::Unsupported,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Internal,
    ];
}

/// The body of every error response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

#[cfg(test)]
mod tests;
