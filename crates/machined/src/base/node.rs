//! The node's state as machined and the API see it: version, stage, the running sequence,
//! events, and the request channel from the API to machined's main loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slate_api::{Event, EventKind, Failure, RollbackRecord, Stage};
use std::path::PathBuf;

use slate_bundle::{Digest, VerifiedBlobs};
use slate_host::AfterFailure;
use slate_sequencer::{Mode, PriorityLock, RebootMode, SequenceGuard, SequenceKind};

use crate::base::journal::Journal;

/// What the API asks machined's main loop to do, with the sequence lock already taken.
#[derive(Debug)]
pub enum Request {
    Reboot(RebootMode, SequenceGuard),
    Reset(SequenceGuard),
    Upgrade(UpgradePlan, SequenceGuard),
}

/// What the Upgrade sequence installs, and how (made by `upgrade::plan` from an API request,
/// or from META's staged tags).
#[derive(Debug, Clone)]
pub struct UpgradePlan {
    /// The received bundle: its image manifest digest, and where it is kept.
    pub bundle_id: Digest,
    pub bundle_dir: PathBuf,
    /// Its blobs this process has verified already (empty after a reboot).
    pub verified: VerifiedBlobs,
    pub version: String,
    pub tries: u32,
    pub reboot: RebootMode,
    pub allow_downgrade: bool,
    /// Record the upgrade in META and reboot; the next boot's Install sequence performs it.
    pub stage: bool,
    /// The new version's first boot starts from fresh data partitions (`replace.rs`).
    pub replace: bool,
}

/// Without `panic=`: long enough to read the error on a console, short enough that boot
/// counting takes over soon (init waits as long).
pub const FATAL_REBOOT_DELAY: Duration = Duration::from_secs(10);

/// Settings read from the kernel command line (`slate.*`).
#[derive(Debug, Clone)]
pub struct BootConfig {
    /// Fault injection for tests: the named task fails (`slate.debug.fail-task=NAME`).
    pub fail_task: Option<String>,
    /// After a fatal error, what the kernel's `panic=` says: `panic=0` waits to be inspected,
    /// `panic=N` reboots after N seconds; [`FATAL_REBOOT_DELAY`] without one.
    pub after_fatal: AfterFailure,
    pub api_listen: String,
}

impl Default for BootConfig {
    fn default() -> Self {
        Self::from_cmdline("")
    }
}

impl BootConfig {
    /// `slate.api.listen` (default `0.0.0.0:50000`) as an address.
    pub fn listen(&self) -> Result<std::net::SocketAddr, String> {
        self.api_listen
            .parse()
            .map_err(|e| format!("slate.api.listen: {e}"))
    }

    pub fn from_cmdline(cmdline: &str) -> Self {
        let value = |key| slate_host::cmdline_value(cmdline, key).map(str::to_string);
        Self {
            fail_task: value("slate.debug.fail-task"),
            after_fatal: slate_host::after_failure(cmdline, FATAL_REBOOT_DELAY),
            api_listen: value("slate.api.listen").unwrap_or_else(|| "0.0.0.0:50000".into()),
        }
    }
}

/// What machined is on this node: the root's PID 1 (slate's own OS), or an ordinary service
/// of systemd on a systemd image (`slate machined --under-systemd`, docs/node.md "A systemd
/// image"), where init and systemd own the volumes, /etc, the network, the services and the
/// way down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Host {
    #[default]
    Pid1,
    Systemd,
}

#[derive(Debug)]
pub struct Node {
    pub journal: Arc<Journal>,
    pub host: Host,
    pub lock: PriorityLock,
    pub mode: Mode,
    pub version: String,
    /// os-release `VARIANT_ID`: an update must carry the same.
    pub variant: String,
    pub kernel: Option<String>,
    pub booted_entry: Option<String>,
    /// The root is a Btrfs snapshot (`None`: an image root).
    pub snapshot_root: Option<crate::base::snapshot_root::SnapshotRoot>,
    pub config: BootConfig,
    stage: Mutex<Stage>,
    pub last_failure: Mutex<Option<Failure>>,
    /// META `LastRollback` as this boot read it (or wrote it).
    pub last_rollback: Mutex<Option<RollbackRecord>>,
    /// META `PinnedVersions` as last read or written.
    pub pinned: Mutex<Vec<String>>,
    /// /var as this boot set it up (once mounted).
    pub var: Mutex<Option<slate_api::VarStatus>>,
    /// The kernel's boot ID, so that clients can tell one boot from the next.
    pub boot_id: Option<String>,
    /// Set once this boot is healthy and committed (`transaction::settle` at Running).
    committed: AtomicBool,
    /// The machine configuration and what came of it.
    pub machine: crate::base::machine_state::MachineState,
    /// The node's services, once the Boot sequence started them.
    pub services: std::sync::OnceLock<Arc<dyn crate::base::services::Workload>>,
    /// What the update agent reports (none until it starts).
    pub agent: Mutex<Option<slate_api::AgentStatus>>,
    subscribers: Mutex<Vec<Sender<Event>>>,
    requests: Mutex<Sender<Request>>,
}

/// The value of `KEY=` in os-release text, unquoted.
pub fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .map(|v| v.trim_matches('"').to_string())
}

impl Node {
    pub fn new(journal: Arc<Journal>, cmdline: &str) -> (Arc<Self>, Receiver<Request>) {
        let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let version = os_release_value(&os_release, "IMAGE_VERSION")
            .or_else(|| os_release_value(&os_release, "VERSION_ID"))
            .unwrap_or_else(|| "unknown".into());
        let mode = slate_host::cmdline_value(cmdline, "slate.platform")
            .and_then(|m| Mode::parse(m).ok())
            .unwrap_or(Mode::Metal);
        let (tx, rx) = mpsc::channel();
        let node = Arc::new(Self {
            journal,
            host: Host::Pid1,
            lock: PriorityLock::new(),
            mode,
            version,
            variant: os_release_value(&os_release, "VARIANT_ID")
                .unwrap_or_else(|| "unknown".into()),
            kernel: slate_host::kernel_release().ok(),
            booted_entry: None,
            snapshot_root: None,
            config: BootConfig::from_cmdline(cmdline),
            stage: Mutex::new(Stage::Booting),
            last_failure: Mutex::new(None),
            last_rollback: Mutex::new(None),
            pinned: Mutex::new(Vec::new()),
            var: Mutex::new(None),
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|id| id.trim().to_owned()),
            committed: AtomicBool::new(false),
            machine: crate::base::machine_state::MachineState::default(),
            services: std::sync::OnceLock::new(),
            agent: Mutex::new(None),
            subscribers: Mutex::new(Vec::new()),
            requests: Mutex::new(tx),
        });
        (node, rx)
    }

    /// This boot passed its health checks and is committed.
    pub fn is_committed(&self) -> bool {
        self.committed.load(Ordering::SeqCst)
    }

    pub fn set_committed(&self) {
        self.committed.store(true, Ordering::SeqCst);
        self.journal.boot.milestone("committed");
    }

    pub fn with_boot_facts(
        self: Arc<Self>,
        host: Host,
        entry: Option<String>,
        snapshot_root: Option<crate::base::snapshot_root::SnapshotRoot>,
    ) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut node) => {
                node.host = host;
                node.booted_entry = entry;
                node.snapshot_root = snapshot_root;
                Arc::new(node)
            }
            Err(shared) => shared,
        }
    }

    pub fn stage(&self) -> Stage {
        *self.stage.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_stage(&self, stage: Stage) {
        *self.stage.lock().unwrap_or_else(|p| p.into_inner()) = stage;
        if stage == Stage::Running {
            self.journal.boot.milestone("running");
        }
        self.journal.info(format_args!("stage {stage:?}"));
        self.publish(EventKind::Stage { stage });
    }

    pub fn publish(&self, kind: EventKind) {
        let event = Event::now(kind);
        let mut subs = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| s.send(event.clone()).is_ok());
    }

    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = mpsc::channel();
        let _ = tx.send(Event::now(EventKind::Stage {
            stage: self.stage(),
        }));
        if let Some(kind) = self.lock.running() {
            let _ = tx.send(Event::now(EventKind::SequenceStarted {
                sequence: kind.to_string(),
            }));
        }
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        rx
    }

    pub fn request(&self, request: Request) -> Result<(), String> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(request)
            .map_err(|_| "machined's main loop is gone".to_string())
    }

    pub fn running_sequence(&self) -> Option<SequenceKind> {
        self.lock.running()
    }
}

#[cfg(test)]
impl Node {
    /// A node for unit tests: settings from `cmdline`, the journal on stderr.
    pub fn for_tests(cmdline: &str) -> (Arc<Self>, Receiver<Request>) {
        let kmsg = slate_host::KmsgLogger::stderr("test");
        Node::new(Arc::new(Journal::new(kmsg)), cmdline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_boot_settings_and_os_release() {
        let c = BootConfig::from_cmdline("console=ttyS0 panic=0 slate.debug.fail-task=mountState");
        assert_eq!(c.fail_task.as_deref(), Some("mountState"));
        assert_eq!(c.after_fatal, AfterFailure::Halt);
        assert_eq!(c.api_listen, "0.0.0.0:50000");
        assert_eq!(
            BootConfig::from_cmdline("panic=3").after_fatal,
            AfterFailure::Reboot(Duration::from_secs(3))
        );
        assert_eq!(
            BootConfig::default().after_fatal,
            AfterFailure::Reboot(FATAL_REBOOT_DELAY)
        );
        let text = "NAME=\"slate\"\nIMAGE_VERSION=1.2.3\n";
        assert_eq!(
            os_release_value(text, "IMAGE_VERSION").as_deref(),
            Some("1.2.3")
        );
        assert_eq!(os_release_value(text, "NAME").as_deref(), Some("slate"));
    }
}
