//! The leader: campaign, then tick until the leadership is lost or the replica stops.
//!
//! A tick reads everything from etcd (the inventory through the replica's watch of `nodes/`;
//! the policies and rollouts as cached by the leadership, checked against their revisions as
//! the leadership's watches of them report (one read of etcd while the watches are not
//! synced) and fetched again only when one moved, so a new leader starts exactly where the
//! old one stopped), records the nodes' answers to earlier orders in them, decides with
//! [`slate_rollout::tick`], stores the new rollouts fenced by the leadership, and only then
//! hands the upgrade orders to the [`Outbox`], whose workers send them while the next ticks
//! run; a later tick of the same leadership records their answers. A node is therefore
//! recorded as upgrading before it is asked: a leader that dies after storing and before
//! sending leaves an unconfirmed start, which the next leader sends again only when the node
//! provably did not take it ([`slate_rollout::RESEND_AFTER`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use slate_host::ThreadClocks;
use slate_release::ReleaseIndex;
use slate_rollout::{tick_in_place, Event, EventKind, Step, Tick, TickCache, TickPart};

use crate::drive::{DriveError, NodeDriver};
use crate::etcd::{EtcdState, Fence, Outcome};
use crate::metrics::{OperatorMetrics, TickResult};
use crate::outbox::{Answer, Outbox};
use crate::state::{self, ELECTION};

/// How the leader works.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// This replica's name, shown as the leader.
    pub name: String,
    /// `REGISTRY/REPO` of the releases as the nodes reach it (orders name
    /// `REGISTRY/REPO:VERSION@DIGEST`).
    pub repository: String,
    pub tick: Duration,
    /// A node silent for longer is not started and fails its soak.
    pub stale_after: Duration,
    /// The leadership's lease: a dead leader is replaced within about this long.
    pub lease_ttl: Duration,
    /// How often the release index is read from the registry.
    pub release_refresh: Duration,
    /// Upgrade calls in flight at once (the outbox's workers).
    pub parallel_orders: usize,
    /// Events older than this are deleted by the leader (checked once a minute).
    pub event_retention: Duration,
}

/// How often the leader deletes the events older than the retention.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// With the inventory mirrored, a node's news starts the next tick early, but not sooner than
/// this after the last one began: a node that commits is followed (and the next one started)
/// within a fraction of the tick, while a fleet reporting all the time costs at most a few
/// ticks a second.
const REACT_GAP: Duration = Duration::from_millis(250);

/// Where releases come from (the registry; a fixed index in tests).
pub trait ReleaseSource: Send + Sync {
    fn index(&self) -> Result<ReleaseIndex, String>;
}

/// A line for the operator's log.
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// How long one tick of the leader took, phase by phase (for `xtask bench-operator`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TickTiming {
    /// Reading the inventory, policies and rollouts from etcd.
    pub read: Duration,
    /// `slate_rollout::tick`.
    pub decide: Duration,
    /// `decide` by part, indexed by [`TickPart::index`]: grouping, wave order, policy views,
    /// decisions.
    pub parts: [Duration; 4],
    /// The fenced commit of its decision: encoding the changed rollouts, and etcd's answer.
    pub commit: Duration,
    /// Of `commit`, encoding the changed rollouts.
    pub encode: Duration,
    /// The orders' share of the loop: recording the answers that came back since the last
    /// tick in the rollouts (stored by the tick's commit, timed in `commit`), and handing this
    /// tick's orders to the outbox (the calls themselves run apart).
    pub send: Duration,
    pub nodes: usize,
    pub orders: usize,
    /// Answers recorded by this tick.
    pub answers: usize,
    /// Of the decision (`read`, `decide` and `commit`), the leader's thread on a CPU, and
    /// runnable but waiting for one ([`ThreadClocks`]; zero where the kernel does not say).
    pub on_cpu: Duration,
    pub queued: Duration,
}

impl TickTiming {
    /// Adds the thread's time on a CPU and waiting for one since `from` (the start of one of
    /// the decision's parts) to [`TickTiming::on_cpu`] and [`TickTiming::queued`].
    fn count_cpu(&mut self, from: Option<ThreadClocks>) {
        if let Some((before, after)) = from.zip(ThreadClocks::now()) {
            let took = after.since(before);
            self.on_cpu += took.ran;
            self.queued += took.queued;
        }
    }
}

/// Called after every tick the leader completes.
pub type TickObserver = Arc<dyn Fn(&TickTiming) + Send + Sync>;

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Campaigns and leads until `stop`; a lost leadership campaigns again.
#[allow(clippy::too_many_arguments)]
pub fn run(
    state: &EtcdState,
    config: &LeaderConfig,
    driver: &dyn NodeDriver,
    releases: &dyn ReleaseSource,
    nodes: Option<&state::Nodes>,
    stop: &AtomicBool,
    log: &Log,
    observer: Option<&TickObserver>,
    metrics: &OperatorMetrics,
) {
    let outbox = Outbox::new();
    std::thread::scope(|scope| {
        // Whatever way the terms end (a panic included), the workers are told to stop, or
        // the scope would wait for them forever.
        let _close = CloseOnDrop(&outbox);
        outbox.spawn_workers(scope, driver, config.parallel_orders);
        lead_terms(
            state, config, driver, releases, nodes, stop, log, observer, metrics, &outbox,
        );
    });
}

struct CloseOnDrop<'a>(&'a Outbox);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[allow(clippy::too_many_arguments)]
fn lead_terms(
    state: &EtcdState,
    config: &LeaderConfig,
    driver: &dyn NodeDriver,
    releases: &dyn ReleaseSource,
    nodes: Option<&state::Nodes>,
    stop: &AtomicBool,
    log: &Log,
    observer: Option<&TickObserver>,
    metrics: &OperatorMetrics,
    outbox: &Outbox,
) {
    let cache = IndexCache::default();
    let mut term = 0;
    while !stop.load(Ordering::Relaxed) {
        let leadership = match state.campaign(ELECTION, &config.name, config.lease_ttl, stop) {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                metrics.etcd_error("leader");
                log(&format!("campaign failed: {e}; trying again"));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        log(&format!("{} is the leader", config.name));
        metrics.set_leader(true);
        driver.new_term();
        term += 1;
        outbox.begin_term(term);
        let fence = leadership.fence();
        let mut pruned: Option<Instant> = None;
        // Rollouts as last read or written under this leadership: a tick reads again only
        // those whose revision moved (a pause, another replica's write).
        let mut held = state::RolloutCache::new();
        // Derived from the inventory alone and checked against it on every use, so a new
        // leadership may keep it; a fresh one per term keeps a term's memory its own.
        let mut orders = TickCache::new();
        // Parsed again only when the stored policies change.
        let mut policies = state::PolicyCache::default();
        // Each node's JSON kept from one commit to the next (the bytes are `encode`'s).
        let mut encoder = state::rollout_value::Encoder::new();
        // Whether the policies or a rollout moved, from watches; etcd is asked instead until
        // they have listed (or if they cannot start).
        let watched = match state::WatchedRevisions::follow(state) {
            Ok(w) => Some(w),
            Err(e) => {
                log(&format!(
                    "cannot watch the policies and rollouts: {e}; reading them every tick"
                ));
                None
            }
        };
        while !stop.load(Ordering::Relaxed) && !leadership.is_lost() {
            let started = Instant::now();
            if pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                pruned = Some(started);
                prune_events(state, config, &fence, log);
            }
            let mut timing = TickTiming::default();
            let mut seen = None;
            let led = lead_once(
                state,
                config,
                releases,
                (nodes, &mut seen),
                (&mut held, &mut policies, &mut orders, &mut encoder),
                watched.as_ref(),
                &cache,
                (&fence, outbox),
                log,
                &mut timing,
                metrics,
            );
            let result = match &led {
                Ok(Led::Deposed) => TickResult::Deposed,
                Ok(Led::Ticked) => TickResult::Done,
                Ok(Led::Conflict) => TickResult::Conflict,
                Err(_) => TickResult::Failed,
            };
            metrics.tick(result, started.elapsed(), timing.orders);
            metrics.tick_cpu(timing.on_cpu, timing.queued);
            match led {
                Ok(Led::Deposed) => break,
                Ok(Led::Ticked | Led::Conflict) => {
                    if let Some(observe) = observer {
                        observe(&timing);
                    }
                }
                Err(e) => log(&format!("tick failed: {e}")),
            }
            match nodes.zip(seen) {
                Some((nodes, generation)) => {
                    if let Some(rest) = REACT_GAP.min(config.tick).checked_sub(started.elapsed()) {
                        std::thread::sleep(rest);
                    }
                    if let Some(rest) = config.tick.checked_sub(started.elapsed()) {
                        nodes.wait_change(generation, rest);
                    }
                }
                None => {
                    if let Some(rest) = config.tick.checked_sub(started.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            }
        }
        outbox.end_term();
        log(&format!("{} is no longer the leader", config.name));
        metrics.set_leader(false);
        if stop.load(Ordering::Relaxed) {
            let _ = leadership.resign();
            return;
        }
    }
}

/// Delete the events older than the retention; a failure is logged and tried again later.
fn prune_events(state: &EtcdState, config: &LeaderConfig, fence: &Fence, log: &Log) {
    let keep_ms = u64::try_from(config.event_retention.as_millis()).unwrap_or(u64::MAX);
    let before_ms = now_ms().saturating_sub(keep_ms);
    match state::prune_events(state, fence, before_ms) {
        Ok(Outcome::Committed { .. }) => {}
        Ok(other) => log(&format!("pruning the event log: {other:?}")),
        Err(e) => log(&format!("pruning the event log failed: {e}")),
    }
}

enum Led {
    Ticked,
    /// A pause or resume got in between reading and storing: nothing stored.
    Conflict,
    Deposed,
}

#[derive(Default)]
struct IndexCache {
    held: Mutex<Option<(Instant, ReleaseIndex)>>,
}

impl IndexCache {
    fn get(
        &self,
        source: &dyn ReleaseSource,
        refresh: Duration,
        log: &Log,
    ) -> Option<ReleaseIndex> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = held.as_ref().is_some_and(|(at, _)| at.elapsed() < refresh);
        if !fresh {
            match source.index() {
                Ok(index) => *held = Some((Instant::now(), index)),
                // The last index read stays good: a registry outage stops nothing in flight.
                Err(e) => log(&format!("cannot read the release index: {e}")),
            }
        }
        held.as_ref().map(|(_, index)| index.clone())
    }
}

#[allow(clippy::too_many_arguments)]
fn lead_once(
    state: &EtcdState,
    config: &LeaderConfig,
    releases: &dyn ReleaseSource,
    (nodes, seen): (Option<&state::Nodes>, &mut Option<u64>),
    (held_rollouts, held_policies, tick_cache, encoder): (
        &mut state::RolloutCache,
        &mut state::PolicyCache,
        &mut TickCache,
        &mut state::rollout_value::Encoder,
    ),
    watched: Option<&state::WatchedRevisions>,
    cache: &IndexCache,
    (fence, outbox): (&Fence, &Outbox),
    log: &Log,
    timing: &mut TickTiming,
    metrics: &OperatorMetrics,
) -> Result<Led, String> {
    let etcd = |e: &dyn std::fmt::Display| {
        metrics.etcd_error("leader");
        e.to_string()
    };
    let started = Instant::now();
    let read_clocks = ThreadClocks::now();
    let (held, generation) = state::inventory_from(state, nodes).map_err(|e| etcd(&e))?;
    *seen = generation;
    let inventory: &slate_rollout::Inventory = &held;
    let policies =
        state::refresh_state(state, watched, held_rollouts, held_policies).map_err(|e| {
            // A policy file that does not parse is the operator's user's to fix, not etcd's.
            match &e {
                state::ReadError::Corrupt { key, .. } if key == state::POLICIES => e.to_string(),
                _ => etcd(&e),
            }
        })?;
    let Some(index) = cache.get(releases, config.release_refresh, log) else {
        return Ok(Led::Ticked);
    };
    let read_at = held_rollouts.revisions();
    timing.read = started.elapsed();
    timing.count_cpu(read_clocks);
    // What the nodes answered since the last tick, recorded in the rollouts as read, so that
    // this tick decides on it and its commit stores both: one encoding and one transaction
    // per group a tick, where the answers used to have their own.
    let taken = outbox.take_answers();
    if taken.stale > 0 {
        log(&format!(
            "{} answers to an earlier leadership's orders dropped unrecorded",
            taken.stale
        ));
    }
    let recording = Instant::now();
    timing.answers = taken.answers.len();
    let mut events = apply_answers(&taken.answers, held_rollouts, now_unix(), log);
    timing.send += recording.elapsed();
    timing.nodes = inventory.len();
    let probes = crate::probe::probe_soaking(
        &policies,
        inventory,
        held_rollouts.rollouts(),
        config.parallel_orders,
    );
    // The tick changes the held rollouts in place (a copy of each changed group was a large
    // part of a tick), and a commit that fails discards them: see `RolloutCache::edit`.
    let lent_instead = BTreeMap::new();
    let decided = Instant::now();
    let decide_clocks = ThreadClocks::now();
    let mut last = decided;
    let parts = &mut timing.parts;
    let mut mark = |part: TickPart| {
        let now = Instant::now();
        parts[part.index()] += now - last;
        last = now;
    };
    let tick_input = Tick {
        now: now_unix(),
        inventory,
        policies: &policies,
        index: &index,
        repository: &config.repository,
        rollouts: &lent_instead,
        stale_after: config.stale_after.as_secs(),
        probes: &probes,
    };
    let rollouts = held_rollouts.rollouts_mut();
    let mut decision = tick_in_place(&tick_input, rollouts, tick_cache, &mut mark);
    held_rollouts.mark_edited(std::mem::take(&mut decision.changed_in_place));
    timing.decide = decided.elapsed();
    timing.count_cpu(decide_clocks);
    // Let the watch go on without copying: while a snapshot is held, its next change copies
    // the whole inventory (`Arc::make_mut`), and sending the orders can take seconds.
    drop(held);
    events.append(&mut decision.events);
    decision.events = events;
    let committed = Instant::now();
    let commit_clocks = ThreadClocks::now();
    let written: Vec<String> = decision
        .rollouts
        .keys()
        .cloned()
        .chain(held_rollouts.edited().map(|(group, _)| group.to_owned()))
        .collect();
    // Every group answered or changed by the tick is edited in place (`decision.rollouts`
    // stays empty with `tick_in_place`, but is stored if not).
    let commit = {
        let answered = held_rollouts
            .edited()
            .filter(|(group, _)| !decision.rollouts.contains_key(*group));
        let decided = decision.rollouts.iter().map(|(g, r)| (g.as_str(), r));
        state::rollouts_commit(
            Some(fence),
            decided.chain(answered),
            &read_at,
            &decision.events,
            now_ms(),
            Some(encoder),
        )
    };
    timing.encode = committed.elapsed();
    let outcome = state::store_rollouts(state, &commit);
    timing.commit = committed.elapsed();
    timing.count_cpu(commit_clocks);
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            held_rollouts.discard_edits();
            outbox.give_back(taken.answers);
            return Err(etcd(&e));
        }
    };
    match outcome {
        Outcome::Committed { revision } => {
            // The watch would deliver these writes a moment later; noted now, the next tick
            // does not take them for another replica's and read them back.
            if let (Some(watched), true) = (watched, revision > 0) {
                for group in &written {
                    watched.note_rollout(group, revision);
                }
            }
            state::remember_rollouts(held_rollouts, decision.rollouts, revision);
            held_rollouts.edits_stored(revision);
            metrics.events_written(decision.events.len());
        }
        Outcome::Conflict => {
            // A pause or resume got in: decide again, with the answers, on what it stored.
            held_rollouts.discard_edits();
            outbox.give_back(taken.answers);
            return Ok(Led::Conflict);
        }
        Outcome::Deposed => {
            held_rollouts.discard_edits();
            return Ok(Led::Deposed);
        }
    }
    for event in &decision.events {
        log(&describe(event));
    }
    if !decision.orders.is_empty() {
        let handing = Instant::now();
        timing.orders = decision.orders.len();
        outbox.submit(decision.orders);
        timing.send += handing.elapsed();
    }
    Ok(Led::Ticked)
}

/// `group/rollout node: kind detail`.
pub fn describe(e: &Event) -> String {
    let node = e
        .node
        .as_deref()
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    let detail = if e.detail.is_empty() {
        String::new()
    } else {
        format!(": {}", e.detail)
    };
    format!("{}#{}{node} {:?}{detail}", e.group, e.rollout, e.kind)
}

/// Marks accepted orders confirmed and refused ones failed in the rollouts as read (edited in
/// place: see [`state::RolloutCache::edit`]), and the events that say so.
fn apply_answers(
    answers: &[Answer],
    held: &mut state::RolloutCache,
    now: u64,
    log: &Log,
) -> Vec<Event> {
    let mut events = Vec::new();
    for Answer { order, result, .. } in answers {
        if let Err(e) = result {
            log(&format!(
                "{}: upgrade to {} not sent: {e}",
                order.node, order.image
            ));
        }
        // Looked at before editing: a group is marked edited only when something changes.
        let applies = held.get(&order.group).is_some_and(|(stored, _)| {
            stored.id == order.rollout
                && stored.nodes.get(&order.node).is_some_and(|p| {
                    matches!(p.step, Step::Upgrading { issued: false, .. })
                        && !matches!(result, Err(DriveError::Unreachable(_)))
                })
        });
        if !applies {
            continue;
        }
        let Some(progress) = held
            .edit(&order.group)
            .and_then(|rollout| rollout.nodes.get_mut(&order.node))
        else {
            continue;
        };
        match result {
            Ok(()) => {
                if let Step::Upgrading { issued, .. } = &mut progress.step {
                    *issued = true;
                }
            }
            Err(DriveError::Refused(reason)) => {
                let reason = format!("refused the upgrade: {reason}");
                events.push(Event {
                    at: now,
                    group: order.group.clone(),
                    rollout: order.rollout,
                    node: Some(order.node.clone()),
                    kind: EventKind::Failed,
                    detail: reason.clone(),
                });
                progress.step = Step::Failed { at: now, reason };
            }
            Err(DriveError::Unreachable(_)) => {}
        }
    }
    events
}
