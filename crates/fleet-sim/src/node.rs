//! One simulated node: the node API's backend over a small state machine instead of disks and
//! boot loaders. An accepted upgrade runs as a task on the fleet's runtime: it "installs" for
//! `upgrade_time`, then reboots (the node's API listener is closed, so clients get *connection
//! refused*, as from a machine that is down), then comes back committed on the new version or
//! reverted to the old one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use slate_api::{
    AgentStatus, BackendError, Event, EventKind, EventStream, Failure, LineStream, Mode,
    NodeBackend, RebootMode, Stage, Status, UpgradeRequest, VersionInfo,
};
use slate_rollout::{FailureReport, NodeReport};
use tokio::sync::oneshot;

use crate::behaviour::{image_version, SplitMix64};
use crate::heartbeat::Heartbeating;
use crate::listen::Served;
use crate::log::SimEventKind;
use crate::shared::Shared;

/// The reason a reverted node records, as machined words it.
pub const REVERT_REASON: &str = "the new version failed its health checks; reverted";

#[derive(Debug)]
struct NodeState {
    version: String,
    channel: String,
    committed: bool,
    healthy: bool,
    busy: bool,
    stage: Stage,
    /// The sequence holding the lock: `Upgrade` or `Reboot`.
    sequence: Option<&'static str>,
    /// The version an upgrade in flight moves to.
    target: Option<String>,
    last_failure: Option<Failure>,
    endpoint: SocketAddr,
    /// `sent_at_ms` of the last report taken: reports are stamped strictly increasing, so the
    /// operator can always tell the newer of two.
    last_stamp: u64,
    rng: SplitMix64,
    subscribers: Vec<mpsc::Sender<Event>>,
}

/// The [`NodeBackend`] of one simulated node. Created by [`crate::Fleet`], which also serves it.
pub struct SimBackend {
    id: String,
    group: String,
    labels: BTreeMap<String, String>,
    index: usize,
    state: Mutex<NodeState>,
    shared: Arc<Shared>,
    me: Weak<SimBackend>,
    /// Dropping the sender stops the node's API server (a reboot closes the listener).
    api_stop: Mutex<Option<oneshot::Sender<()>>>,
    heartbeat_queued: AtomicBool,
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("id", &self.id)
            .field("state", &*lock(&self.state))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Who a node is when the fleet creates it.
pub(crate) struct NodeSeed {
    pub id: String,
    pub group: String,
    pub labels: BTreeMap<String, String>,
    pub index: usize,
    pub version: String,
    pub channel: String,
}

impl SimBackend {
    pub(crate) fn new(shared: Arc<Shared>, seed: NodeSeed) -> Arc<Self> {
        let rng = SplitMix64::for_node(shared.seed, &seed.id, 0);
        Arc::new_cyclic(|me| SimBackend {
            state: Mutex::new(NodeState {
                version: seed.version,
                channel: seed.channel,
                committed: true,
                healthy: true,
                busy: false,
                stage: Stage::Running,
                sequence: None,
                target: None,
                last_failure: None,
                endpoint: SocketAddr::from(([127, 0, 0, 1], 0)),
                last_stamp: 0,
                rng,
                subscribers: Vec::new(),
            }),
            id: seed.id,
            group: seed.group,
            labels: seed.labels,
            index: seed.index,
            shared,
            me: me.clone(),
            api_stop: Mutex::new(None),
            heartbeat_queued: AtomicBool::new(false),
        })
    }

    /// The node's id (`{group}-{index:05}`), also its `node_name`.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// `127.0.0.1:PORT` of its API (it may change if the port was taken during a reboot).
    pub fn endpoint(&self) -> SocketAddr {
        lock(&self.state).endpoint
    }

    /// The version it runs now.
    pub fn version(&self) -> String {
        lock(&self.state).version.clone()
    }

    /// Whether an upgrade or reboot is running.
    pub fn busy(&self) -> bool {
        lock(&self.state).busy
    }

    /// Its heartbeat body as of now.
    pub fn report(&self) -> NodeReport {
        self.snapshot(&mut lock(&self.state))
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Sets whether a periodic heartbeat is queued; answers whether one was.
    pub(crate) fn heartbeat_queued(&self, queued: bool) -> bool {
        self.heartbeat_queued.swap(queued, Ordering::AcqRel)
    }

    /// The periodic heartbeat, or `None` while the node is down.
    pub(crate) fn heartbeat(&self) -> Option<NodeReport> {
        let mut st = lock(&self.state);
        (st.stage != Stage::Rebooting).then(|| self.snapshot(&mut st))
    }

    pub(crate) fn set_endpoint(&self, addr: SocketAddr) {
        lock(&self.state).endpoint = addr;
    }

    pub(crate) fn set_api_stop(&self, stop: oneshot::Sender<()>) {
        *lock(&self.api_stop) = Some(stop);
    }

    fn stop_api(&self) {
        lock(&self.api_stop).take();
    }

    fn snapshot(&self, st: &mut NodeState) -> NodeReport {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        st.last_stamp = now.max(st.last_stamp + 1);
        NodeReport {
            id: self.id.clone(),
            group: self.group.clone(),
            labels: self.labels.clone(),
            endpoint: st.endpoint.to_string(),
            version: st.version.clone(),
            channel: st.channel.clone(),
            committed: st.committed,
            healthy: st.healthy,
            busy: st.busy,
            last_failure: st.last_failure.as_ref().map(|f| FailureReport {
                version: f.version.clone(),
                reason: f.reason.clone(),
            }),
            sent_at_ms: st.last_stamp,
        }
    }

    fn publish(st: &mut NodeState, kind: EventKind) {
        let event = Event::now(kind);
        st.subscribers.retain(|s| s.send(event.clone()).is_ok());
    }

    fn set_stage(st: &mut NodeState, stage: Stage) {
        st.stage = stage;
        Self::publish(st, EventKind::Stage { stage });
    }

    /// Logs a refusal (under the node's lock, like every other change) and hands the error
    /// back.
    fn refused(&self, err: BackendError) -> BackendError {
        self.shared.log.record(
            &self.id,
            &self.group,
            SimEventKind::Refused {
                reason: err.to_string(),
            },
        );
        err
    }

    /// The lock-taking half of an upgrade: judge the request, and on acceptance mark the node
    /// busy and log `Accepted` under the node's lock, so that no second request can slip in
    /// between and the in-flight count moves exactly with the node's state.
    fn accept(
        &self,
        req: &UpgradeRequest,
    ) -> Result<(String, String, Duration, Duration), BackendError> {
        let mut st = lock(&self.state);
        if st.busy {
            let seq = st.sequence.unwrap_or("a sequence");
            return Err(self.refused(BackendError::Locked(format!("{seq} is running"))));
        }
        if req.stage {
            return Err(self.refused(BackendError::Unsupported(
                "staged upgrades are not simulated".into(),
            )));
        }
        let Some(to) = image_version(&req.image) else {
            return Err(self.refused(BackendError::InvalidArgument(format!(
                "image reference {:?} has no version tag",
                req.image
            ))));
        };
        let newer = slate_release::compare(to, &st.version) == std::cmp::Ordering::Greater;
        if !newer && !req.allow_downgrade {
            let msg = format!(
                "{to} is not newer than the running {} (allow_downgrade is not set)",
                st.version
            );
            return Err(self.refused(BackendError::InvalidArgument(msg)));
        }
        let (upgrade_time, reboot_time, jitter) = {
            let b = self.shared.behaviour();
            (b.upgrade_time, b.reboot_time, b.jitter)
        };
        let upgrade_time = upgrade_time + st.rng.up_to(jitter);
        let reboot_time = reboot_time + st.rng.up_to(jitter);
        let from = st.version.clone();
        let to = to.to_owned();
        st.busy = true;
        st.sequence = Some("Upgrade");
        st.target = Some(to.clone());
        Self::publish(
            &mut st,
            EventKind::SequenceStarted {
                sequence: "Upgrade".into(),
            },
        );
        Self::set_stage(&mut st, Stage::Upgrading);
        self.shared.log.record(
            &self.id,
            &self.group,
            SimEventKind::Accepted {
                from: from.clone(),
                to: to.clone(),
                replace: req.replace,
            },
        );
        self.shared
            .reports
            .change(self.index, self.snapshot(&mut st));
        Ok((from, to, upgrade_time, reboot_time))
    }

    /// The API goes away for `reboot_time`: the listener is closed and the port held by a
    /// socket that does not listen, so connections are refused. Answers the placeholder, for
    /// [`SimBackend::come_up`] to let go of.
    async fn go_down(&self, reboot_time: Duration) -> Option<OwnedFd> {
        let down_at = tokio::time::Instant::now();
        let endpoint = {
            let mut st = lock(&self.state);
            Self::set_stage(&mut st, Stage::Rebooting);
            st.endpoint
        };
        self.stop_api();
        let held = match crate::listen::hold_port(endpoint).await {
            Ok(fd) => Some(fd),
            Err(e) => {
                self.shared.api_error(format!("{}: {e}", self.id));
                None
            }
        };
        tokio::time::sleep_until(down_at + reboot_time).await;
        held
    }

    /// Brings the API back (on the same port unless a stranger took it), and only then is
    /// `Running`, not busy, and tells the operator: neither a heartbeat nor
    /// [`Fleet::wait_idle`] may point at a listener that is not there yet.
    ///
    /// [`Fleet::wait_idle`]: crate::Fleet::wait_idle
    async fn come_up(self: &Arc<Self>, held: Option<OwnedFd>) {
        let port = self.endpoint().port();
        drop(held);
        match crate::listen::start_api(self, Some(port)).await {
            Ok(addr) => self.set_endpoint(addr),
            Err(e) => self
                .shared
                .api_error(format!("{}: API did not come back: {e}", self.id)),
        }
        let report = {
            let mut st = lock(&self.state);
            st.busy = false;
            Self::set_stage(&mut st, Stage::Running);
            self.snapshot(&mut st)
        };
        self.shared.reports.change(self.index, report);
    }

    async fn run_upgrade(self: Arc<Self>, from: String, to: String, times: (Duration, Duration)) {
        tokio::time::sleep(times.0).await;
        let held = self.go_down(times.1).await;
        {
            let mut st = lock(&self.state);
            let draw = st.rng.next_f64();
            let reverts = self.shared.behaviour().reverts(&to, draw);
            let kind = if reverts {
                st.last_failure = Some(Failure {
                    version: to.clone(),
                    reason: REVERT_REASON.into(),
                });
                SimEventKind::Reverted {
                    from_target: to.clone(),
                    back_to: from.clone(),
                }
            } else {
                st.version = to.clone();
                SimEventKind::Committed { version: to }
            };
            st.committed = true;
            st.healthy = true;
            st.sequence = None;
            st.target = None;
            let error = reverts.then(|| REVERT_REASON.to_owned());
            Self::publish(
                &mut st,
                EventKind::SequenceFinished {
                    sequence: "Upgrade".into(),
                    error,
                },
            );
            self.shared.log.record(&self.id, &self.group, kind);
        }
        self.come_up(held).await;
    }

    async fn run_reboot(self: Arc<Self>, reboot_time: Duration) {
        let held = self.go_down(reboot_time).await;
        {
            let mut st = lock(&self.state);
            st.sequence = None;
            Self::publish(
                &mut st,
                EventKind::SequenceFinished {
                    sequence: "Reboot".into(),
                    error: None,
                },
            );
        }
        self.come_up(held).await;
    }
}

impl NodeBackend for SimBackend {
    fn version(&self) -> VersionInfo {
        VersionInfo {
            version: lock(&self.state).version.clone(),
            arch: "amd64".into(),
            booted_entry: None,
            kernel: None,
        }
    }

    fn status(&self) -> Status {
        let st = lock(&self.state);
        Status {
            boot_id: None,
            committed: false,
            last_rollback: None,
            pinned: Vec::new(),
            secure_boot: None,
            var: None,
            boot_times: None,
            memory: None,
            warnings: Vec::new(),
            version: st.version.clone(),
            booted_entry: None,
            stage: st.stage,
            running_sequence: st.sequence.map(String::from),
            mode: Mode::Metal,
            staged_image: None,
            last_failure: st.last_failure.clone(),
            node_name: Some(self.id.clone()),
            hostname: Some(self.id.clone()),
            machine_id: None,
            agent: Some(AgentStatus {
                strategy: "operator".into(),
                channel: st.channel.clone(),
                target: st.target.clone(),
                state: if st.target.is_some() {
                    "upgrading"
                } else {
                    "idle"
                }
                .into(),
                ..AgentStatus::default()
            }),
        }
    }

    /// Simulated: the API is down for the behaviour's `reboot_time`, nothing else changes.
    fn reboot(&self, _mode: RebootMode) -> Result<(), BackendError> {
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| BackendError::Failed("node gone".into()))?;
        let reboot_time = {
            let mut st = lock(&self.state);
            if st.busy {
                let seq = st.sequence.unwrap_or("a sequence");
                return Err(BackendError::Locked(format!("{seq} is running")));
            }
            st.busy = true;
            st.sequence = Some("Reboot");
            Self::publish(
                &mut st,
                EventKind::SequenceStarted {
                    sequence: "Reboot".into(),
                },
            );
            self.shared
                .reports
                .change(self.index, self.snapshot(&mut st));
            let b = self.shared.behaviour();
            b.reboot_time + st.rng.up_to(b.jitter)
        };
        self.shared.rt.spawn(me.run_reboot(reboot_time));
        Ok(())
    }

    fn reset(&self) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(
            "a simulated node cannot be reset".into(),
        ))
    }

    fn upgrade(&self, req: UpgradeRequest) -> Result<(), BackendError> {
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| BackendError::Failed("node gone".into()))?;
        let (from, to, upgrade_time, reboot_time) = self.accept(&req)?;
        self.shared
            .rt
            .spawn(me.run_upgrade(from, to, (upgrade_time, reboot_time)));
        Ok(())
    }

    fn events(&self) -> EventStream {
        let (tx, rx) = mpsc::channel();
        let mut st = lock(&self.state);
        let _ = tx.send(Event::now(EventKind::Stage { stage: st.stage }));
        if let Some(sequence) = st.sequence {
            let _ = tx.send(Event::now(EventKind::SequenceStarted {
                sequence: sequence.into(),
            }));
        }
        st.subscribers.push(tx);
        rx
    }

    fn logs(&self, _follow: bool) -> Result<LineStream, BackendError> {
        Ok(Box::new(std::iter::empty()))
    }

    fn dmesg(&self, _follow: bool) -> Result<LineStream, BackendError> {
        Ok(Box::new(std::iter::empty()))
    }
}

impl Served for SimBackend {
    fn shared(&self) -> &Arc<Shared> {
        SimBackend::shared(self)
    }

    fn id(&self) -> &str {
        SimBackend::id(self)
    }

    fn set_api_stop(&self, stop: oneshot::Sender<()>) {
        SimBackend::set_api_stop(self, stop);
    }
}

impl Heartbeating for SimBackend {
    fn index(&self) -> usize {
        SimBackend::index(self)
    }

    fn heartbeat_queued(&self, queued: bool) -> bool {
        SimBackend::heartbeat_queued(self, queued)
    }

    fn heartbeat(&self) -> Option<NodeReport> {
        SimBackend::heartbeat(self)
    }
}
