//! Each group's rollout as a few numbers (the operator's `/metrics`): the open wave, how many
//! nodes are done, in flight and failed, and how much failure budget is left.

use std::collections::BTreeMap;

use crate::node::{Inventory, NodeRecord};
use crate::policy::PolicySet;
use crate::rollout::{Rollout, Step};
use crate::waves::PolicyView;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupProgress {
    pub group: String,
    pub target: String,
    /// `running`, `paused`, `aborted` or `completed`.
    pub state: &'static str,
    /// The wave open now, from 1: the lowest over the covering policies that have waves
    /// (none: no covering policy has any).
    pub wave: Option<usize>,
    /// The most waves a covering policy has.
    pub waves: usize,
    pub done: usize,
    /// Upgrading or soaking.
    pub in_flight: usize,
    pub failed: usize,
    /// Failures left before a policy's budget pauses the rollout: the least over the covering
    /// policies that have a budget (none: no budget applies). Failures a `resume` accepted do
    /// not count, as in the tick.
    pub failure_budget_left: Option<usize>,
}

/// Every group's latest rollout, in group order.
pub fn progress(
    inventory: &Inventory,
    policies: &PolicySet,
    rollouts: &BTreeMap<String, Rollout>,
) -> Vec<GroupProgress> {
    let mut by_group: BTreeMap<&str, Vec<&NodeRecord>> = BTreeMap::new();
    for record in inventory.values() {
        by_group
            .entry(record.report.group.as_str())
            .or_default()
            .push(record);
    }
    rollouts
        .iter()
        .map(|(group, rollout)| {
            let nodes = by_group.get(group.as_str()).map_or(&[][..], Vec::as_slice);
            let views: Vec<PolicyView<'_>> = policies
                .policies
                .iter()
                .filter_map(|p| PolicyView::new(p, nodes))
                .collect();
            let step = |id: &str| rollout.nodes.get(id).map(|p| &p.step);
            let finished = |id: &str| step(id).is_some_and(Step::is_finished);
            let count =
                |f: fn(&Step) -> bool| rollout.nodes.values().filter(|p| f(&p.step)).count();
            let failure_budget_left = views
                .iter()
                .filter_map(|v| {
                    let budget = v.policy.failure_budget? as usize;
                    let failed = v
                        .members
                        .iter()
                        .filter(|id| {
                            matches!(step(id), Some(Step::Failed { .. }))
                                && !rollout.acknowledged(id)
                        })
                        .count();
                    Some(budget.saturating_sub(failed))
                })
                .min();
            GroupProgress {
                group: group.clone(),
                target: rollout.target.clone(),
                state: rollout.state.name(),
                wave: views
                    .iter()
                    .filter(|v| !v.policy.waves.is_empty())
                    .map(|v| v.open_wave(finished) + 1)
                    .min(),
                waves: views
                    .iter()
                    .map(|v| v.policy.waves.len())
                    .max()
                    .unwrap_or(0),
                done: count(|s| matches!(s, Step::Done { .. })),
                in_flight: count(|s| matches!(s, Step::Upgrading { .. } | Step::Soaking { .. })),
                failed: count(|s| matches!(s, Step::Failed { .. })),
                failure_budget_left,
            }
        })
        .collect()
}
