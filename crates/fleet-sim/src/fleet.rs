//! The fleet: N simulated nodes in one process, each a real node API server on its own port,
//! all on one small tokio runtime, with their heartbeats and the ground-truth log.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use slate_api::{ServerConfig, Shutdown};

use crate::behaviour::{Behaviour, SplitMix64};
use crate::heartbeat::{tick, ReportQueue, ReportStats, Reporter};
use crate::identity::Identities;
use crate::log::{EventLog, SimEvent, SimEventKind};
use crate::node::{NodeSeed, SimBackend};
use crate::shared::Shared;

/// One group of identical nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// Also the prefix of its node ids: `{name}-{index:05}`.
    pub name: String,
    pub count: usize,
    pub labels: BTreeMap<String, String>,
    pub channel: String,
    /// The version every node of the group starts on.
    pub version: String,
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    pub groups: Vec<GroupSpec>,
    /// A [`slate_api::gen_certs`] directory: every node serves a certificate of its own
    /// naming its id, issued from the fleet CA (`ca.crt`, `ca.key`), and accepts clients of the
    /// client CA (`client-ca.crt`).
    pub certs_dir: PathBuf,
    pub heartbeat_interval: Duration,
    pub behaviour: Behaviour,
    /// With the node id, determines every random draw of a node.
    pub seed: u64,
    /// Also write the ground-truth log to this file as JSON lines, as it happens.
    pub events_file: Option<PathBuf>,
    /// Threads calling the [`Reporter`] (each a FIFO lane for a fixed set of nodes).
    pub reporter_threads: usize,
    /// Worker threads of the runtime all servers share.
    pub worker_threads: usize,
}

impl FleetSpec {
    /// No groups yet; heartbeats every 5 s, the default [`Behaviour`], seed 0, 4 reporter
    /// threads, 2 workers.
    pub fn new(certs_dir: impl Into<PathBuf>) -> Self {
        FleetSpec {
            groups: Vec::new(),
            certs_dir: certs_dir.into(),
            heartbeat_interval: Duration::from_secs(5),
            behaviour: Behaviour::default(),
            seed: 0,
            events_file: None,
            reporter_threads: 4,
            worker_threads: 2,
        }
    }

    /// Adds a group without labels.
    pub fn group(mut self, name: &str, count: usize, channel: &str, version: &str) -> Self {
        self.groups.push(GroupSpec {
            name: name.into(),
            count,
            labels: BTreeMap::new(),
            channel: channel.into(),
            version: version.into(),
        });
        self
    }
}

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("invalid fleet: {0}")]
    Spec(String),
    #[error(transparent)]
    Certs(#[from] slate_api::CertError),
    #[error("{nodes} nodes need about {needed} open files; the limit is {limit} (raise the hard limit: ulimit -Hn)")]
    FileLimit {
        nodes: usize,
        needed: u64,
        limit: u64,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("node {node}: cannot start its API: {message}")]
    Listen { node: String, message: String },
}

/// Raises the soft limit of open files to the hard limit (a node costs a listener, and a
/// connection or two while it is being called); answers the new soft limit.
pub fn raise_file_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// A running simulated fleet. Create and drop it outside async code: it owns its runtime.
pub struct Fleet {
    shared: Arc<Shared>,
    nodes: Vec<Arc<SimBackend>>,
    by_id: HashMap<String, usize>,
    runtime: Option<tokio::runtime::Runtime>,
    reporters: Vec<JoinHandle<()>>,
    started_in: Duration,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

fn validate(spec: &FleetSpec) -> Result<usize, FleetError> {
    let mut seen = std::collections::BTreeSet::new();
    for g in &spec.groups {
        let ok_name = !g.name.is_empty()
            && g.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
        if !ok_name {
            return Err(FleetError::Spec(format!("bad group name {:?}", g.name)));
        }
        if !seen.insert(g.name.as_str()) {
            return Err(FleetError::Spec(format!("group {} given twice", g.name)));
        }
        if g.version.is_empty() {
            return Err(FleetError::Spec(format!("group {} has no version", g.name)));
        }
    }
    if spec.heartbeat_interval.is_zero() {
        return Err(FleetError::Spec(
            "the heartbeat interval must not be 0".into(),
        ));
    }
    if !(0.0..=1.0).contains(&spec.behaviour.fail_probability) {
        return Err(FleetError::Spec(
            "fail_probability must be within 0..=1".into(),
        ));
    }
    Ok(spec.groups.iter().map(|g| g.count).sum())
}

impl Fleet {
    /// Starts every node's API server and heartbeats; returns once all are listening.
    pub fn start(spec: FleetSpec, reporter: Arc<dyn Reporter>) -> Result<Fleet, FleetError> {
        let begun = Instant::now();
        let total = validate(&spec)?;
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| FleetError::Io { what, source }
        };
        let limit = raise_file_limit().map_err(io("raising the open-file limit"))?;
        let needed = total as u64 + 256;
        if needed > limit {
            return Err(FleetError::FileLimit {
                nodes: total,
                needed,
                limit,
            });
        }
        let mut server =
            ServerConfig::from_dir(SocketAddr::from(([127, 0, 0, 1], 0)), &spec.certs_dir)?;
        // A node's API takes clients, not other nodes.
        server.node_ca_pem = None;
        let identities = Arc::new(Identities::from_dir(&spec.certs_dir)?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(spec.worker_threads.max(1))
            .thread_name("fleet-sim")
            .enable_all()
            .build()
            .map_err(io("starting the runtime"))?;
        let log = EventLog::new(spec.events_file.as_deref()).map_err(io("the events file"))?;
        let (reports, reporters) =
            ReportQueue::start(spec.reporter_threads, reporter).map_err(io("reporter threads"))?;
        let shared = Arc::new(Shared {
            rt: runtime.handle().clone(),
            log,
            behaviour: RwLock::new(spec.behaviour.clone()),
            reports,
            shutdown: Shutdown::new(),
            server,
            identities,
            seed: spec.seed,
            api_errors: Mutex::new(Vec::new()),
        });
        let mut nodes = Vec::with_capacity(total);
        let mut by_id = HashMap::with_capacity(total);
        for g in &spec.groups {
            for i in 0..g.count {
                let id = format!("{}-{i:05}", g.name);
                if by_id.insert(id.clone(), nodes.len()).is_some() {
                    shared.reports.close(); // lets the reporter threads end
                    return Err(FleetError::Spec(format!("node id {id} occurs twice")));
                }
                nodes.push(SimBackend::new(
                    shared.clone(),
                    NodeSeed {
                        id,
                        group: g.name.clone(),
                        labels: g.labels.clone(),
                        index: nodes.len(),
                        version: g.version.clone(),
                        channel: g.channel.clone(),
                    },
                ));
            }
        }
        let mut fleet = Fleet {
            shared: shared.clone(),
            nodes,
            by_id,
            runtime: Some(runtime),
            reporters,
            started_in: Duration::ZERO,
        };
        fleet.listen_all()?;
        let rt = fleet.runtime.as_ref().map(|r| r.handle().clone());
        if let Some(rt) = rt {
            let interval = spec.heartbeat_interval;
            let n = fleet.nodes.len().max(1) as u32;
            for (i, node) in fleet.nodes.iter().enumerate() {
                let phase = interval * i as u32 / n;
                let rng = SplitMix64::for_node(spec.seed, node.id(), 1);
                rt.spawn(tick(
                    node.clone(),
                    shared.reports.clone(),
                    interval,
                    phase,
                    rng,
                ));
            }
        }
        fleet.started_in = begun.elapsed();
        Ok(fleet)
    }

    /// Binds every node, spread over the runtime's workers (each bind parses the certificate
    /// set, which dominates start-up).
    fn listen_all(&mut self) -> Result<(), FleetError> {
        let Some(rt) = self.runtime.as_ref() else {
            return Ok(());
        };
        let tasks: Vec<_> = self
            .nodes
            .iter()
            .map(|node| {
                let node = node.clone();
                rt.spawn(async move { crate::listen::start_api(&node, None).await })
            })
            .collect();
        for (node, task) in self.nodes.iter().zip(tasks) {
            let joined = rt.block_on(task).map_err(|e| e.to_string());
            match joined.and_then(|r| r) {
                Ok(addr) => node.set_endpoint(addr),
                Err(message) => {
                    return Err(FleetError::Listen {
                        node: node.id().to_owned(),
                        message,
                    })
                }
            }
        }
        Ok(())
    }

    /// How long [`Fleet::start`] took.
    pub fn start_time(&self) -> Duration {
        self.started_in
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node id, in spec order.
    pub fn node_ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.id().to_owned()).collect()
    }

    /// A node's backend, to look at its state directly.
    pub fn node(&self, id: &str) -> Option<&Arc<SimBackend>> {
        self.by_id.get(id).map(|&i| &self.nodes[i])
    }

    /// `127.0.0.1:PORT` of a node's API.
    pub fn node_endpoint(&self, id: &str) -> Option<String> {
        self.node(id).map(|n| n.endpoint().to_string())
    }

    /// The ground-truth log so far.
    pub fn events(&self) -> Vec<SimEvent> {
        self.shared.log.events()
    }

    /// Milliseconds since the fleet started, on the log's clock.
    pub fn now_ms(&self) -> u64 {
        self.shared.log.now_ms()
    }

    /// The most upgrades ever in flight at once in `group` (Accepted until Committed or
    /// Reverted), and when (ms since start) that count was first reached; `(0, 0)` before any.
    pub fn max_in_flight(&self, group: &str) -> (usize, u64) {
        let (_, max, at) = self.shared.log.flight(group);
        (max, at)
    }

    /// Upgrades in flight in `group` now.
    pub fn in_flight(&self, group: &str) -> usize {
        self.shared.log.flight(group).0
    }

    /// Accepted upgrades per node (target versions, in order); nodes never upgraded are absent.
    pub fn upgrades_per_node(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for e in self.shared.log.events() {
            if let SimEventKind::Accepted { to, .. } = e.kind {
                out.entry(e.node).or_default().push(to);
            }
        }
        out
    }

    /// How many nodes run each version now.
    pub fn versions(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for n in &self.nodes {
            *out.entry(n.version()).or_default() += 1;
        }
        out
    }

    pub fn behaviour(&self) -> Behaviour {
        self.shared.behaviour().clone()
    }

    /// Replaces the behaviour. Timing applies to upgrades accepted from now on; the outcome
    /// is decided when a node comes back from its reboot, so it applies to those in flight.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self
            .shared
            .behaviour
            .write()
            .unwrap_or_else(PoisonError::into_inner) = behaviour;
    }

    /// Heartbeat delivery counters.
    pub fn report_stats(&self) -> ReportStats {
        self.shared.reports.stats()
    }

    /// How long each state change's report took, from its queuing to the reporter's return.
    pub fn change_report_delays(&self) -> Vec<Duration> {
        self.shared.reports.change_delays()
    }

    /// Servers that failed after start, or nodes whose API did not come back after a reboot
    /// (should stay empty; tests assert it).
    pub fn api_errors(&self) -> Vec<String> {
        let mut errors = self
            .shared
            .api_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        errors.extend(
            self.shared
                .log
                .file_error()
                .map(|e| format!("events file: {e}")),
        );
        errors
    }

    /// Waits until no node is upgrading or rebooting (a rebooted node's API listens again);
    /// `false` on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.shared.log.in_flight_total() == 0 && self.nodes.iter().all(|n| !n.busy()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Upgrades in flight across all groups, and events logged so far: what the binary prints.
    pub fn totals(&self) -> (usize, usize) {
        (self.shared.log.in_flight_total(), self.shared.log.len())
    }

    /// Stops every server, heartbeat and upgrade, and waits for the reporter threads to
    /// finish what they were sending. Also done on drop.
    pub fn shutdown(&mut self) {
        self.shared.shutdown.trigger();
        self.shared.reports.close();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        for handle in self.reporters.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}
