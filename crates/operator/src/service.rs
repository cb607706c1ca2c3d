//! The operator API (`/v1/fleet/…`), served by every replica with the node API's mutual TLS
//! and roles: all state is in etcd, so a replica that is not the leader answers the same.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use slate_api::{BackendError, Caller, JsonService, Role, ServiceRoute};
use slate_rollout::{
    abort, pause, plan, resume, ControlError, Event, NodeRecord, NodeReport, PlanRow, PolicySet,
    Rollout, Tick,
};

use crate::etcd::{Commit, EtcdState, Expect, Outcome};
use crate::leader::{now_ms, now_unix, Log, ReleaseSource};
use crate::state::{self, ELECTION, ROLLOUTS};

/// A heartbeat that changes nothing is written at most this often (the leader's "last seen").
pub const HEARTBEAT_WRITE_EVERY: Duration = Duration::from_secs(15);
/// A report older (by the node's clock) than the stored one is dropped while the stored one
/// is this recent; past that the node's latest word wins, so a node whose clock stepped back
/// is not ignored for long.
pub const STALE_REPORT_GRACE: Duration = Duration::from_secs(60);

/// A node's report about itself: a node certificate (under the fleet CA, through the node's
/// issuing CA) naming the node the report is about; no client role is a node.
pub const HEARTBEAT: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/heartbeat", Role::Node);
pub const ADD_NODE: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/nodes", Role::Admin);
pub const STATUS: ServiceRoute = ServiceRoute::new("GET", "/v1/fleet/status", Role::Reader);
pub const PLAN: ServiceRoute = ServiceRoute::new("GET", "/v1/fleet/plan", Role::Reader);
/// The most events one `GET /v1/fleet/events` answers (each batch read is bounded by it).
const MAX_EVENTS_ANSWER: usize = 100_000;
pub const EVENTS: ServiceRoute = ServiceRoute::new("GET", "/v1/fleet/events", Role::Reader);
pub const PAUSE: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/pause", Role::Operator);
pub const RESUME: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/resume", Role::Operator);
pub const ABORT: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/abort", Role::Operator);
pub const POLICY_SHOW: ServiceRoute = ServiceRoute::new("GET", "/v1/fleet/policy", Role::Reader);
pub const POLICY_SET: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/policy", Role::Admin);
/// The dashboard's pages (`dashboard/`), beside the routes whose state they show.
pub const UI_OVERVIEW: ServiceRoute = ServiceRoute::page("/ui", Role::Reader);
pub const UI_NODE: ServiceRoute = ServiceRoute::page("/ui/node", Role::Reader);

const ROUTES: &[ServiceRoute] = &[
    UI_OVERVIEW,
    UI_NODE,
    HEARTBEAT,
    ADD_NODE,
    STATUS,
    PLAN,
    EVENTS,
    PAUSE,
    RESUME,
    ABORT,
    POLICY_SHOW,
    POLICY_SET,
];

/// `POST /v1/fleet/pause|resume|abort`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    /// One group; every group with an active rollout when absent.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `GET/POST /v1/fleet/policy`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyText {
    pub text: String,
}

/// One node in `slate fleet status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub group: String,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Its step in the group's rollout, `idle` outside one.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<usize>,
    /// Seconds since its last report.
    pub silent_for: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// `GET /v1/fleet/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    pub rollouts: Vec<Rollout>,
    pub nodes: Vec<NodeStatus>,
    pub events: Vec<Event>,
}

impl std::fmt::Debug for OperatorService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorService")
            .field("repository", &self.repository)
            .finish_non_exhaustive()
    }
}

/// What one answer reads of the fleet.
pub(crate) struct Fleet {
    pub inventory: Arc<slate_rollout::Inventory>,
    pub rollouts: BTreeMap<String, Rollout>,
    pub policies_text: String,
}

/// The operator API over the state in etcd.
pub struct OperatorService {
    pub state: Arc<EtcdState>,
    pub releases: Arc<dyn ReleaseSource>,
    pub repository: String,
    pub stale_after: Duration,
    pub log: Log,
    /// Routine heartbeats, counted rather than logged one by one.
    pub heartbeats: crate::tally::HeartbeatTally,
    /// This replica's counters; `/metrics` adds the fleet read from etcd.
    pub metrics: Arc<crate::metrics::OperatorMetrics>,
    /// The certificate directory the dashboard's node page asks nodes with (`operator.crt`,
    /// as orders are sent); `None`: it shows only what etcd holds.
    pub node_certs: Option<std::path::PathBuf>,
    /// The inventory as this replica's watch holds it: a heartbeat compares with it instead
    /// of reading its node's record from etcd (`None`: it reads).
    pub nodes: Option<Arc<state::NodeStore>>,
}

fn failed(e: impl std::fmt::Display) -> BackendError {
    BackendError::Failed(e.to_string())
}

fn body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, BackendError> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| BackendError::InvalidArgument(e.to_string()))
}

fn to_value(v: &impl Serialize) -> Result<Value, BackendError> {
    serde_json::to_value(v).map_err(failed)
}

impl JsonService for OperatorService {
    fn routes(&self) -> &[ServiceRoute] {
        ROUTES
    }

    fn call(
        &self,
        route: &ServiceRoute,
        caller: &Caller,
        query: Option<&str>,
        request: &[u8],
    ) -> Result<Value, BackendError> {
        match *route {
            HEARTBEAT => self.heartbeat(request, Some(caller)),
            ADD_NODE => self.heartbeat(request, None),
            STATUS => to_value(&self.status()?),
            PLAN => to_value(&self.plan()?),
            EVENTS => {
                let limit = query
                    .and_then(|q| q.strip_prefix("limit="))
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(100)
                    .min(MAX_EVENTS_ANSWER);
                to_value(&state::events(&self.state, limit).map_err(failed)?)
            }
            PAUSE | RESUME | ABORT => self.control(route, body(request)?),
            POLICY_SHOW => to_value(&PolicyText {
                text: state::policies_text(&self.state).map_err(failed)?,
            }),
            POLICY_SET => {
                let PolicyText { text } = body(request)?;
                let set = PolicySet::parse(&text)
                    .map_err(|e| BackendError::InvalidArgument(e.to_string()))?;
                state::set_policies(&self.state, &text).map_err(failed)?;
                (self.log)(&format!("policies set: {} policies", set.policies.len()));
                Ok(json!({ "policies": set.policies.len() }))
            }
            _ => Err(BackendError::NotFound(route.path.into())),
        }
    }

    fn page(
        &self,
        route: &ServiceRoute,
        caller: &Caller,
        query: Option<&str>,
    ) -> Result<slate_api::Page, BackendError> {
        self.render_page(route, caller, query)
    }

    fn log_api(&self, message: &str) {
        if !crate::tally::is_routine(message) {
            (self.log)(message);
        }
    }

    fn metrics(&self) -> Option<String> {
        Some(self.metrics.scrape_with(&self.state, self.mirror()))
    }
}

impl OperatorService {
    /// Stores a node's report unless it changes nothing and the stored one is recent, or an
    /// older report of the node's arrives after a newer one ([`STALE_REPORT_GRACE`]). A
    /// compare-and-swap on the record keeps two replicas from writing an older report over a
    /// newer one.
    ///
    /// `from`: the node that sent it (a heartbeat), which must be the node reported about;
    /// `None` for `add-node` (an admin, by hand).
    fn heartbeat(&self, request: &[u8], from: Option<&Caller>) -> Result<Value, BackendError> {
        let by_hand = from.is_none();
        let report: NodeReport = serde_json::from_slice(request)
            .map_err(|e| BackendError::InvalidArgument(format!("not a node report: {e}")))?;
        check_report(&report).map_err(BackendError::InvalidArgument)?;
        if let Some(caller) = from.filter(|c| !c.is_node(&report.id)) {
            let who = match caller.role {
                Role::Node => format!("node {}", caller.node_names.join(", ")),
                role => format!("a client of role {role}"),
            };
            return Err(BackendError::PermissionDenied(format!(
                "a heartbeat must come from the node it reports about: this report is about {}, \
                 its certificate is {who}'s",
                report.id
            )));
        }
        let tally = |written: bool| {
            if !by_hand {
                let summary = self.heartbeats.record(&report.id, written, Instant::now());
                if let Some(line) = summary {
                    (self.log)(&line);
                }
            }
        };
        for attempt in 0..5 {
            let now = now_unix();
            // The mirror on the first try; after a lost swap, etcd itself.
            let mirrored = self
                .nodes
                .as_ref()
                .filter(|_| attempt == 0)
                .and_then(|nodes| nodes.mirror.get(&report.id));
            let stored = match mirrored {
                Some(held) => held.map(|(value, revision)| state::Stored { value, revision }),
                None => state::node(&self.state, &report.id).map_err(failed)?,
            };
            if let Some(s) = &stored {
                let recent = s.value.last_seen + STALE_REPORT_GRACE.as_secs() > now;
                if !by_hand && recent && s.value.report.sent_at_ms > report.sent_at_ms {
                    tally(false);
                    return Ok(json!({ "written": false, "stale": true }));
                }
                let unchanged = state::same_but_time(&s.value.report, &report);
                if !by_hand
                    && unchanged
                    && s.value.last_seen + HEARTBEAT_WRITE_EVERY.as_secs() > now
                {
                    tally(false);
                    return Ok(json!({ "written": false }));
                }
            }
            let news = crate::tally::news(stored.as_ref().map(|s| &s.value.report), &report);
            let record = NodeRecord {
                report: report.clone(),
                last_seen: now,
            };
            let expect = stored.map_or(Expect::Absent, |s| Expect::ModRevision(s.revision));
            let outcome = match &self.nodes {
                Some(nodes) => nodes.put_if(&record, expect).map_err(failed)?,
                None => state::put_node_if(&self.state, &record, expect).map_err(failed)?,
            };
            match outcome {
                Outcome::Committed { .. } => {
                    tally(true);
                    if let Some(line) = news {
                        (self.log)(&line);
                    }
                    return Ok(json!({ "written": true }));
                }
                Outcome::Conflict | Outcome::Deposed => continue,
            }
        }
        Err(BackendError::Locked(format!(
            "node {}: its record kept changing; report again",
            report.id
        )))
    }

    fn mirror(&self) -> Option<&state::Nodes> {
        self.nodes.as_deref().map(|n| &n.mirror)
    }

    fn index(&self) -> Result<slate_release::ReleaseIndex, BackendError> {
        self.releases
            .index()
            .map_err(|e| failed(format!("cannot read the release index: {e}")))
    }

    /// The inventory (from the replica's watch when it is synced), the rollouts and the
    /// policy file, read once for one answer.
    pub(crate) fn read_fleet(&self) -> Result<Fleet, BackendError> {
        let (inventory, _) = state::inventory_from(&self.state, self.mirror()).map_err(failed)?;
        Ok(Fleet {
            inventory,
            rollouts: state::rollouts(&self.state)
                .map_err(failed)?
                .into_iter()
                .map(|(g, s)| (g, s.value))
                .collect(),
            policies_text: state::policies_text(&self.state).map_err(failed)?,
        })
    }

    pub(crate) fn status(&self) -> Result<FleetStatus, BackendError> {
        self.status_of(&self.read_fleet()?)
    }

    pub(crate) fn status_of(&self, fleet: &Fleet) -> Result<FleetStatus, BackendError> {
        let now = now_unix();
        // Waves are shown when the plan can be made (policies set, the index readable).
        let waves: BTreeMap<String, usize> = self
            .tick_rows(fleet)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|row| Some((row.node, row.wave?)))
            .collect();
        let nodes = fleet
            .inventory
            .values()
            .map(|rec| {
                let r = &rec.report;
                let rollout = fleet.rollouts.get(&r.group);
                let progress = rollout.and_then(|ro| ro.nodes.get(&r.id));
                let last_error = match progress.map(|p| &p.step) {
                    Some(slate_rollout::Step::Failed { reason, .. }) => Some(reason.clone()),
                    _ => r
                        .last_failure
                        .as_ref()
                        .map(|f| format!("{}: {}", f.version, f.reason)),
                };
                NodeStatus {
                    node: r.id.clone(),
                    group: r.group.clone(),
                    version: r.version.clone(),
                    target: rollout
                        .filter(|ro| ro.state.is_active())
                        .map(|ro| ro.target.clone()),
                    state: progress.map_or("idle", |p| p.step.name()).to_owned(),
                    wave: waves.get(&r.id).copied(),
                    silent_for: now.saturating_sub(rec.last_seen),
                    last_error,
                }
            })
            .collect();
        Ok(FleetStatus {
            leader: self.state.leader(ELECTION).map_err(failed)?,
            rollouts: fleet.rollouts.values().cloned().collect(),
            nodes,
            events: state::events(&self.state, 20).map_err(failed)?,
        })
    }

    fn tick_rows(&self, fleet: &Fleet) -> Result<Vec<PlanRow>, BackendError> {
        let policies = PolicySet::parse(&fleet.policies_text).map_err(failed)?;
        let index = self.index()?;
        Ok(plan(&Tick {
            now: now_unix(),
            inventory: &fleet.inventory,
            policies: &policies,
            index: &index,
            repository: &self.repository,
            rollouts: &fleet.rollouts,
            stale_after: self.stale_after.as_secs(),
            // The plan probes nothing: a probed soak shows as not yet ended.
            probes: &BTreeMap::new(),
        }))
    }

    fn plan(&self) -> Result<Vec<PlanRow>, BackendError> {
        self.tick_rows(&self.read_fleet()?)
    }

    /// Pause, resume or abort each matching active rollout by compare-and-swap (the leader
    /// may be writing it too: a lost swap is read again and redone).
    fn control(&self, route: &ServiceRoute, req: ControlRequest) -> Result<Value, BackendError> {
        let reason = req.reason.unwrap_or_else(|| "by slate fleet".into());
        let index = if *route == RESUME {
            Some(self.index()?)
        } else {
            None
        };
        let mut changed = Vec::new();
        for _ in 0..5 {
            let stored = state::rollouts(&self.state).map_err(failed)?;
            let mut commit = Commit::default();
            let mut events = Vec::new();
            changed.clear();
            for (group, s) in &stored {
                if req.group.as_ref().is_some_and(|g| g != group) || !s.value.state.is_active() {
                    continue;
                }
                let mut rollout = s.value.clone();
                let now = now_unix();
                let result = match (*route, &index) {
                    (PAUSE, _) => pause(&mut rollout, &reason, now),
                    (RESUME, Some(index)) => resume(&mut rollout, index, now),
                    _ => abort(&mut rollout, &reason, now),
                };
                match result {
                    Ok(event) => events.push(event),
                    Err(ControlError::WrongState { .. }) if req.group.is_none() => continue,
                    Err(e) => return Err(BackendError::InvalidArgument(e.to_string())),
                }
                let key = format!("{ROLLOUTS}{group}");
                commit
                    .checks
                    .push((key.clone(), Expect::ModRevision(s.revision)));
                commit
                    .puts
                    .push((key, state::rollout_value::encode(&rollout)));
                changed.push(group.clone());
            }
            if let Some(group) = &req.group {
                if changed.is_empty() {
                    return Err(BackendError::NotFound(format!(
                        "group {group:?} has no active rollout"
                    )));
                }
            }
            if commit.puts.is_empty() {
                return Ok(json!({ "groups": changed }));
            }
            commit.puts.push((
                state::event_key(now_ms()),
                serde_json::to_vec(&events).map_err(failed)?,
            ));
            match self.state.commit(&commit).map_err(failed)? {
                Outcome::Committed { .. } => {
                    self.metrics.events_written(events.len());
                    for e in &events {
                        (self.log)(&crate::leader::describe(e));
                    }
                    return Ok(json!({ "groups": changed }));
                }
                Outcome::Conflict | Outcome::Deposed => continue,
            }
        }
        Err(BackendError::Locked(
            "the rollouts kept changing; try again".into(),
        ))
    }
}

/// A report the inventory can hold: names that are keys and an endpoint that is `HOST:PORT`.
pub fn check_report(r: &NodeReport) -> Result<(), String> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    if !name_ok(&r.id) {
        return Err(format!("node id {:?}: 1-128 of [A-Za-z0-9-_.]", r.id));
    }
    if !name_ok(&r.group) {
        return Err(format!("group {:?}: 1-128 of [A-Za-z0-9-_.]", r.group));
    }
    if r.endpoint
        .rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(format!("endpoint {:?} is not HOST:PORT", r.endpoint));
    }
    if r.version.is_empty() {
        return Err("version is empty".into());
    }
    Ok(())
}
