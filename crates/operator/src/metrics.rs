//! The operator's `/metrics`: what this replica counts while it runs (leadership, ticks and
//! their latency and orders, etcd errors, events written), and at each scrape the fleet as etcd
//! holds it — nodes by group, version and state, each group's rollout — so that every replica,
//! leader or not, answers the same about the fleet.

use std::collections::BTreeMap;
use std::time::Duration;

use slate_metrics::{
    counter, counter_vec, histogram, label, seconds_counter_vec, CounterVec, Histogram, IntCounter,
    IntCounterVec, IntGauge, Registry, Scrape, LATENCY_BUCKETS,
};
use slate_rollout::{progress, PolicySet, Rollout};

use crate::etcd::EtcdState;
use crate::state;

/// Orders one tick may send, as histogram buckets.
const ORDER_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];

/// A replica's counters (reset when it restarts).
#[derive(Debug, Clone)]
pub struct OperatorMetrics {
    registry: Registry,
    leader: IntGauge,
    ticks: IntCounterVec,
    tick_seconds: Histogram,
    tick_orders: Histogram,
    tick_cpu: CounterVec,
    etcd_errors: IntCounterVec,
    events: IntCounter,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// How a tick of the leader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickResult {
    /// Decided and stored (orders, if any, sent).
    Done,
    /// A pause or resume changed a rollout meanwhile: decided again next tick.
    Conflict,
    /// The leadership was lost.
    Deposed,
    /// An error (etcd, the stored policies); logged.
    Failed,
}

impl TickResult {
    fn label(self) -> &'static str {
        match self {
            TickResult::Done => "done",
            TickResult::Conflict => "conflict",
            TickResult::Deposed => "deposed",
            TickResult::Failed => "failed",
        }
    }
}

impl OperatorMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let leader = slate_metrics::register(
            &registry,
            IntGauge::new(
                "slate_operator_leader",
                "1 while this replica is the leader, 0 while it follows.",
            )
            .expect("a valid metric name"),
        );
        let ticks = counter_vec(
            &registry,
            "slate_operator_ticks_total",
            "Ticks this replica ran as the leader, by result (done, conflict, deposed, failed).",
            &["result"],
        );
        for result in [
            TickResult::Done,
            TickResult::Conflict,
            TickResult::Deposed,
            TickResult::Failed,
        ] {
            ticks.with_label_values(&[result.label()]);
        }
        let tick_seconds = histogram(
            &registry,
            "slate_operator_tick_duration_seconds",
            "How long a tick of the leader took: read etcd, decide, store, send the orders.",
            LATENCY_BUCKETS,
        );
        let tick_orders = histogram(
            &registry,
            "slate_operator_tick_orders",
            "Upgrade orders a tick of the leader decided and sent (its decisions).",
            ORDER_BUCKETS,
        );
        let tick_cpu = seconds_counter_vec(
            &registry,
            "slate_operator_tick_cpu_seconds_total",
            "The leader's thread in its ticks' decisions (read, decide, store): seconds on a \
             CPU (running) and ready to run but waiting for one (waiting). A waiting share \
             that grows says the replica's machine is short of CPU, not that deciding got \
             slower.",
            &["state"],
        );
        for state in ["running", "waiting"] {
            tick_cpu.with_label_values(&[state]);
        }
        let etcd_errors = counter_vec(
            &registry,
            "slate_operator_etcd_errors_total",
            "etcd reads and commits that failed, by who called (leader: its campaign and \
             ticks; api: the reads of a scrape).",
            &["caller"],
        );
        for caller in ["leader", "api"] {
            etcd_errors.with_label_values(&[caller]);
        }
        let events = counter(
            &registry,
            "slate_operator_events_written_total",
            "Rollout events this replica wrote to the event log.",
        );
        OperatorMetrics {
            registry,
            leader,
            ticks,
            tick_seconds,
            tick_orders,
            tick_cpu,
            etcd_errors,
            events,
        }
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn tick(&self, result: TickResult, took: Duration, orders: usize) {
        self.ticks.with_label_values(&[result.label()]).inc();
        self.tick_seconds.observe(took.as_secs_f64());
        if result == TickResult::Done {
            self.tick_orders.observe(orders as f64);
        }
    }

    /// The leader's thread in a tick's decision: on a CPU, and waiting for one.
    pub fn tick_cpu(&self, running: Duration, waiting: Duration) {
        for (state, seconds) in [("running", running), ("waiting", waiting)] {
            self.tick_cpu
                .with_label_values(&[state])
                .inc_by(seconds.as_secs_f64());
        }
    }

    /// A failed etcd call by the `leader` or the `api`.
    pub fn etcd_error(&self, caller: &str) {
        self.etcd_errors.with_label_values(&[caller]).inc();
    }

    pub fn events_written(&self, n: usize) {
        self.events.inc_by(n as u64);
    }

    /// The text exposition: the counters, and the fleet read from etcd now (three reads: the
    /// inventory, the rollouts, the policies). When etcd cannot be read the fleet's gauges are
    /// left out and `slate_operator_state_readable` is 0.
    pub fn scrape(&self, state: &EtcdState) -> String {
        self.scrape_with(state, None)
    }

    /// [`OperatorMetrics::scrape`] with the inventory from the replica's watch while it is
    /// synced.
    pub fn scrape_with(&self, state: &EtcdState, nodes: Option<&state::Nodes>) -> String {
        let scrape = Scrape::new();
        let read = state::inventory_from(state, nodes).and_then(|(inventory, _)| {
            let rollouts = state::rollouts(state)?;
            Ok((inventory, rollouts, state::policies_text(state)?))
        });
        let readable = match read {
            Ok((inventory, stored, text)) => {
                let rollouts: BTreeMap<String, Rollout> =
                    stored.into_iter().map(|(g, s)| (g, s.value)).collect();
                // Stored policies were checked when set; unreadable ones cover nothing here.
                let policies = PolicySet::parse(&text).unwrap_or(PolicySet {
                    policies: Vec::new(),
                });
                fleet(&scrape, &inventory, &policies, &rollouts);
                true
            }
            Err(_) => {
                self.etcd_error("api");
                false
            }
        };
        scrape.gauge(
            "slate_operator_state_readable",
            "1 when this scrape read the fleet's state from etcd (else its gauges are absent).",
            if readable { 1.0 } else { 0.0 },
        );
        scrape.encode(&[&self.registry])
    }
}

/// The fleet's gauges.
fn fleet(
    scrape: &Scrape,
    inventory: &slate_rollout::Inventory,
    policies: &PolicySet,
    rollouts: &BTreeMap<String, Rollout>,
) {
    let nodes = scrape.gauge_vec(
        "slate_operator_nodes",
        "Nodes in the inventory by group, version they report, and state in their group's \
         latest rollout (upgrading, soaking, done, failed; idle outside one), as `slate fleet \
         status` shows them.",
        &["group", "version", "state"],
    );
    let mut counts: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
    for record in inventory.values() {
        let r = &record.report;
        let state = rollouts
            .get(&r.group)
            .and_then(|ro| ro.nodes.get(&r.id))
            .map_or("idle", |p| p.step.name());
        *counts
            .entry((r.group.as_str(), r.version.as_str(), state))
            .or_default() += 1;
    }
    for ((group, version, state), n) in counts {
        nodes
            .with_label_values(&[&label(group), &label(version), state])
            .set(n as f64);
    }
    let info = scrape.gauge_vec(
        "slate_operator_rollout_info",
        "Each group's latest rollout: its target version and state (running, paused, \
         aborted, completed) (1).",
        &["group", "target", "state"],
    );
    let wave = scrape.gauge_vec(
        "slate_operator_rollout_wave",
        "The wave open in each group's latest rollout, from 1 (absent without waves).",
        &["group"],
    );
    let waves = scrape.gauge_vec(
        "slate_operator_rollout_waves",
        "How many waves each group's latest rollout has (the most of its policies).",
        &["group"],
    );
    let steps = scrape.gauge_vec(
        "slate_operator_rollout_nodes",
        "Nodes of each group's latest rollout by step: done, in_flight (upgrading or \
         soaking), failed.",
        &["group", "step"],
    );
    let budget = scrape.gauge_vec(
        "slate_operator_rollout_failure_budget_remaining",
        "Failures left before a policy's failure budget pauses the group's rollout (the least \
         over its policies; absent without a budget).",
        &["group"],
    );
    for p in progress(inventory, policies, rollouts) {
        let group = label(&p.group);
        info.with_label_values(&[&group, &label(&p.target), p.state])
            .set(1.0);
        if let Some(w) = p.wave {
            wave.with_label_values(&[&group]).set(w as f64);
        }
        waves.with_label_values(&[&group]).set(p.waves as f64);
        for (step, n) in [
            ("done", p.done),
            ("in_flight", p.in_flight),
            ("failed", p.failed),
        ] {
            steps.with_label_values(&[&group, step]).set(n as f64);
        }
        if let Some(left) = p.failure_budget_left {
            budget.with_label_values(&[&group]).set(left as f64);
        }
    }
}
