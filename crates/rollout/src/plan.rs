//! The dry run (`slate fleet plan`): for every node a policy covers, its wave, what it is
//! doing or would do now, and the earliest it could start.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use slate_machine_config::{minute_of_week, minutes_until_open};

use crate::node::NodeRecord;
use crate::rollout::Rollout;
use crate::tick::{tick_explained, Tick};
use crate::waves::{sort_in_waves, PolicyView};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRow {
    pub group: String,
    pub node: String,
    pub version: String,
    /// The version its group's rollout moves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Its wave (from 1) under the first covering policy that has waves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<usize>,
    /// `done`, `upgrading`, `soaking`, `failed`, `starts now`, `waiting` or `up to date`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a waiting node, the earliest it could start (Unix seconds): the soaks of the waves
    /// before it and the next window, assuming upgrades take no time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<u64>,
}

/// What one tick would do, node by node (in each group in wave order).
pub fn plan(t: &Tick<'_>) -> Vec<PlanRow> {
    let decision = tick_explained(t);
    let mut groups: BTreeMap<&str, Vec<&NodeRecord>> = BTreeMap::new();
    for record in t.inventory.values() {
        if t.policies.for_node(&record.report).next().is_some() {
            groups.entry(&record.report.group).or_default().push(record);
        }
    }
    let started: Vec<&str> = decision.orders.iter().map(|o| o.node.as_str()).collect();
    let mut rows = Vec::new();
    for (group, mut nodes) in groups {
        let rollout: Option<&Rollout> = decision
            .rollouts
            .get(group)
            .or_else(|| t.rollouts.get(group))
            .filter(|r| r.state.is_active());
        let views: Vec<PolicyView<'_>> = t
            .policies
            .policies
            .iter()
            .filter_map(|p| PolicyView::new(p, &nodes))
            .collect();
        sort_in_waves(&mut nodes);
        for rec in nodes {
            let id = rec.report.id.as_str();
            let wave = views.iter().find_map(|v| v.wave_of(id));
            let progress = rollout.and_then(|r| r.nodes.get(id));
            let (state, reason) = match (rollout, progress) {
                (None, _) => ("up to date".to_owned(), None),
                (Some(_), Some(p)) if started.contains(&id) => {
                    let _ = p;
                    ("starts now".to_owned(), None)
                }
                (Some(_), Some(p)) => (
                    p.step.name().to_owned(),
                    match &p.step {
                        crate::rollout::Step::Failed { reason, .. } => Some(reason.clone()),
                        _ => None,
                    },
                ),
                (Some(_), None) => (
                    "waiting".to_owned(),
                    decision.waiting.get(id).cloned().or_else(|| {
                        rollout
                            .filter(|r| !matches!(r.state, crate::RolloutState::Running))
                            .map(|r| format!("rollout {}", r.state.name()))
                    }),
                ),
            };
            let not_before = (state == "waiting").then(|| not_before(t, &views, rollout, id));
            rows.push(PlanRow {
                group: group.to_owned(),
                node: id.to_owned(),
                version: rec.report.version.clone(),
                target: rollout.map(|r| r.target.clone()),
                wave: wave.map(|w| w + 1),
                state,
                reason,
                not_before,
            });
        }
    }
    rows
}

fn not_before(t: &Tick<'_>, views: &[PolicyView<'_>], rollout: Option<&Rollout>, id: &str) -> u64 {
    let finished = |n: &str| {
        rollout
            .and_then(|r| r.nodes.get(n))
            .is_some_and(|p| p.step.is_finished())
    };
    let mut earliest = t.now;
    for view in views.iter().filter(|v| v.contains(id)) {
        let mut at = t.now;
        if let Some(wave) = view.wave_of(id) {
            let open = view.open_wave(finished);
            let soaks: u64 = (open..wave)
                .map(|w| view.policy.waves[w].soak.as_secs())
                .sum();
            at += soaks;
        }
        if !view.policy.windows.is_empty() {
            if let Some(minutes) = minutes_until_open(&view.policy.windows, minute_of_week(at)) {
                at += u64::from(minutes) * 60;
            }
        }
        earliest = earliest.max(at);
    }
    earliest
}
