//! The rollout operator (`slate operator run`): replicas elect a leader in etcd; the leader
//! reads the inventory, policies and rollouts from etcd, decides with `slate-rollout`, writes
//! its decisions back (fenced by its leadership) and drives nodes through their API. Every
//! replica serves the operator API (`/v1/fleet/…`) over the node API's mutual TLS.
//!
//! - [`etcd`]: keys under a prefix, compare-and-swap commits with a leadership fence, election.
//! - [`state`]: the typed keys (inventory, policies, rollouts, events).
//! - [`leader`]: campaign and tick.
//! - [`drive`]: upgrade orders through the node API.
//! - [`outbox`]: the orders sent off the leader's loop, their answers kept for a later tick.
//! - [`probe`]: the policies' HTTP probes of soaking nodes.
//! - [`service`]: the operator API, and its `/metrics` ([`metrics`]).
//! - [`dashboard`]: the rollout dashboard's pages (`/ui`), on the API's listener and roles.
//! - [`tally`]: routine heartbeats as one line per interval, news as a line each.

pub mod dashboard;
pub mod drive;
pub mod etcd;
pub mod leader;
pub mod metrics;
pub mod outbox;
pub mod probe;
pub mod service;
pub mod state;
pub mod tally;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use slate_release::ReleaseIndex;
use slate_transport::{fetch_release_index, Options, Reference};

pub use drive::{ApiDriver, DriveError, NodeDriver};
pub use etcd::{EtcdState, StateError};
pub use leader::{LeaderConfig, Log, ReleaseSource, TickObserver, TickTiming};
pub use metrics::OperatorMetrics;
pub use service::{ControlRequest, FleetStatus, NodeStatus, OperatorService, PolicyText};

/// The release index of a registry repository (an empty index while none is published).
#[derive(Debug, Clone)]
pub struct RegistryReleases {
    pub repository: Reference,
    pub options: Options,
}

impl ReleaseSource for RegistryReleases {
    fn index(&self) -> Result<ReleaseIndex, String> {
        fetch_release_index(&self.repository, &self.options)
            .map(Option::unwrap_or_default)
            .map_err(|e| e.to_string())
    }
}

/// The release index read again at most every `refresh`: the API's status, plan and
/// dashboard need it for each answer, and a dashboard refreshing every 3 s would otherwise
/// fetch it from the registry each time. A failed read is not kept.
struct CachedReleases {
    source: Arc<dyn ReleaseSource>,
    refresh: std::time::Duration,
    held: std::sync::Mutex<Option<(std::time::Instant, ReleaseIndex)>>,
}

impl ReleaseSource for CachedReleases {
    fn index(&self) -> Result<ReleaseIndex, String> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, index)) = held.as_ref() {
            if at.elapsed() < self.refresh {
                return Ok(index.clone());
            }
        }
        let index = self.source.index()?;
        *held = Some((std::time::Instant::now(), index.clone()));
        Ok(index)
    }
}

/// Everything `slate operator run` needs.
pub struct Operator {
    pub state: Arc<EtcdState>,
    pub leader: LeaderConfig,
    pub listen: std::net::SocketAddr,
    /// `client-ca.crt`, `ca.crt` (the fleet CA: nodes report under it), the operator's serving
    /// `service.crt`/`service.key`, and `operator.crt`/`.key` to call nodes with.
    pub certs: PathBuf,
    pub releases: Arc<dyn ReleaseSource>,
    pub log: Log,
    /// Sees every tick's timing while this replica leads (benchmarks).
    pub observer: Option<TickObserver>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("leader", &self.leader)
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

/// Serves the API and leads when elected, until `stop`.
pub fn run(op: Operator, stop: &AtomicBool) -> Result<(), String> {
    let config = slate_api::ServerConfig::from_dir(op.listen, &op.certs)
        .map_err(|e| format!("operator certificates in {}: {e}", op.certs.display()))?;
    let metrics = Arc::new(OperatorMetrics::new());
    // One watch of `nodes/` per replica: the leader's ticks and the heartbeats it serves read
    // the inventory from memory instead of listing it.
    let nodes = Arc::new(
        state::NodeStore::start(op.state.clone())
            .map_err(|e| format!("watching the inventory: {e}"))?,
    );
    let service = OperatorService {
        state: op.state.clone(),
        releases: Arc::new(CachedReleases {
            source: op.releases.clone(),
            refresh: op.leader.release_refresh,
            held: Default::default(),
        }),
        repository: op.leader.repository.clone(),
        stale_after: op.leader.stale_after,
        log: op.log.clone(),
        heartbeats: Default::default(),
        metrics: metrics.clone(),
        node_certs: Some(op.certs.clone()),
        nodes: Some(nodes.clone()),
    };
    let server = slate_api::spawn_service(config, Arc::new(service))
        .map_err(|e| format!("cannot serve the operator API on {}: {e}", op.listen))?;
    (op.log)(&format!("operator API on {}", op.listen));
    let driver = ApiDriver::new(&op.certs);
    leader::run(
        &op.state,
        &op.leader,
        &driver,
        op.releases.as_ref(),
        Some(&nodes.mirror),
        stop,
        &op.log,
        op.observer.as_ref(),
        &metrics,
    );
    server.shutdown().map_err(|e| e.to_string())?;
    Ok(())
}
