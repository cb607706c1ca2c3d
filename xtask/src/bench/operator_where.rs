//! Where a bench-operator rollout's wall time goes beyond the policy's minimum, read from the
//! simulated fleet's ground-truth log: each node's own upgrade (accepted → committed, the
//! simulated 3 s), the waves' soaks as they happened, and in the last wave, how long a slot
//! freed by a node's commit stayed empty before the next node accepted its order. That gap is
//! the pipeline the operator owns: the node's report reaching the operator (measured apart by
//! the fleet's reporter), the watch and the tick that see it, and the order's call.

use std::collections::BTreeMap;
use std::time::Duration;

use slate_fleet_sim::{SimEvent, SimEventKind};

use crate::bench::percentile;

/// The figures, each as (p50, p99) in seconds unless said.
pub(crate) struct Breakdown {
    /// From the policy's arrival to each group's first accepted order.
    pub first_order: (f64, f64),
    /// Accepted → committed, per node.
    pub node_upgrade: (f64, f64),
    /// From a wave's last commit to the next wave's first accepted order (the soak, 10 s by
    /// the policy, and what it waits for besides), over both wave changes of every group.
    pub wave_change: (f64, f64),
    /// In the last wave, from a commit to the accepted order that refills its slot.
    pub refill: (f64, f64),
    /// The refills' gaps summed per group, divided by the concurrency: the wall time the last
    /// wave lost to them (median over the groups).
    pub refill_cost: f64,
    /// Each state change's report, queued → delivered (the simulated node's side of `refill`).
    pub report: (f64, f64),
    /// Reports (periodic or changes) the operator did not take: a lost change is only made
    /// good by the node's next periodic heartbeat, 30 s later.
    pub reports_failed: u64,
}

fn p50_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p| percentile(&v, p).unwrap_or(f64::NAN);
    (at(50), at(99))
}

/// `events` of one rollout whose policy was set at `policy_ms` (the log's clock), waves of
/// `first` and `second` nodes per group before the last, `concurrency` per group.
pub(crate) fn breakdown(
    events: &[SimEvent],
    policy_ms: u64,
    (first, second): (usize, usize),
    concurrency: usize,
    (report_delays, reports_failed): (&[Duration], u64),
) -> Breakdown {
    #[derive(Default)]
    struct Group {
        accepted: Vec<(u64, String)>,
        committed: BTreeMap<String, u64>,
    }
    let mut groups: BTreeMap<&str, Group> = BTreeMap::new();
    for e in events.iter().filter(|e| e.at_ms >= policy_ms) {
        let g = groups.entry(&e.group).or_default();
        match &e.kind {
            SimEventKind::Accepted { .. } => g.accepted.push((e.at_ms, e.node.clone())),
            SimEventKind::Committed { .. } => {
                g.committed.insert(e.node.clone(), e.at_ms);
            }
            _ => {}
        }
    }
    let s = |ms: u64| ms as f64 / 1e3;
    let (mut first_order, mut node, mut wave_change, mut refill, mut cost) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for g in groups.values_mut() {
        g.accepted.sort();
        let Some((start, _)) = g.accepted.first() else {
            continue;
        };
        first_order.push(s(start - policy_ms));
        for (at, id) in &g.accepted {
            if let Some(c) = g.committed.get(id) {
                node.push(s(c.saturating_sub(*at)));
            }
        }
        // Waves are taken in order, so the accepted orders fall into them by count.
        let waves = [
            &g.accepted[..first.min(g.accepted.len())],
            &g.accepted[first.min(g.accepted.len())..(first + second).min(g.accepted.len())],
            &g.accepted[(first + second).min(g.accepted.len())..],
        ];
        let commits = |wave: &[(u64, String)]| -> Vec<u64> {
            let mut c: Vec<u64> = wave
                .iter()
                .filter_map(|(_, id)| g.committed.get(id).copied())
                .collect();
            c.sort();
            c
        };
        for k in 0..2 {
            if let (Some(last), Some((next, _))) = (commits(waves[k]).last(), waves[k + 1].first())
            {
                wave_change.push(s(next.saturating_sub(*last)));
            }
        }
        let last_commits = commits(waves[2]);
        let mut lost = 0.0;
        for (j, (at, _)) in waves[2].iter().enumerate().skip(concurrency) {
            if let Some(freed) = last_commits.get(j - concurrency) {
                let gap = s(at.saturating_sub(*freed));
                lost += gap;
                refill.push(gap);
            }
        }
        cost.push(lost / concurrency as f64);
    }
    Breakdown {
        first_order: p50_p99(first_order),
        node_upgrade: p50_p99(node),
        wave_change: p50_p99(wave_change),
        refill: p50_p99(refill),
        refill_cost: p50_p99(cost).0,
        report: p50_p99(report_delays.iter().map(Duration::as_secs_f64).collect()),
        reports_failed,
    }
}

impl Breakdown {
    pub(crate) fn json(&self) -> serde_json::Value {
        let pair = |(p50, p99): (f64, f64)| serde_json::json!({"p50": p50, "p99": p99});
        serde_json::json!({
            "first_order_s": pair(self.first_order),
            "node_upgrade_s": pair(self.node_upgrade),
            "wave_change_s": pair(self.wave_change),
            "refill_s": pair(self.refill),
            "refill_cost_s": self.refill_cost,
            "change_report_s": pair(self.report),
            "reports_failed": self.reports_failed,
        })
    }

    pub(crate) fn text(&self) -> String {
        let pair = |(p50, p99): (f64, f64)| format!("{p50:.2} / {p99:.2} s");
        format!(
            "where the wall time went (p50 / p99, from the fleet's log): policy → first order \
             {}; a node's upgrade {}; wave change (soak 10 s) {}; last wave, commit → its \
             slot's next order {} (costing {:.1} s of wall time per group); of that, the \
             node's report queued → delivered {}; reports the operator did not take: {}",
            pair(self.first_order),
            pair(self.node_upgrade),
            pair(self.wave_change),
            pair(self.refill),
            self.refill_cost,
            pair(self.report),
            self.reports_failed,
        )
    }
}
