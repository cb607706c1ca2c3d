//! What each policy allows in a group: its running totals (unavailable, healthy and up,
//! recent starts, the open wave) and why it blocks a node from starting now.

use slate_machine_config::minutes_until_open;

use crate::node::NodeRecord;
use crate::policy::Policy;
use crate::rollout::{Rollout, Step};
use crate::waves::PolicyView;

/// A node's [`Step`] without its details: what a tick keeps per covered node, so that the
/// counts read a vector instead of looking each node up in the rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Upgrading,
    Soaking,
    Done,
    Failed,
}

impl Phase {
    pub(crate) fn of(step: &Step) -> Phase {
        match step {
            Step::Upgrading { .. } => Phase::Upgrading,
            Step::Soaking { .. } => Phase::Soaking,
            Step::Done { .. } => Phase::Done,
            Step::Failed { .. } => Phase::Failed,
        }
    }

    pub(crate) fn is_finished(self) -> bool {
        matches!(self, Phase::Done | Phase::Failed)
    }
}

/// One policy's running totals over its members in a group, kept up to date as the tick
/// starts nodes.
pub(crate) struct Counts {
    /// Upgrading, or down for another reason (silent, unhealthy, busy).
    pub(crate) unavailable: usize,
    /// Reporting, healthy, idle and not upgrading.
    pub(crate) healthy_up: usize,
    /// Starts inside the rate window.
    pub(crate) recent_starts: usize,
    /// The highest wave whose earlier waves have all finished.
    pub(crate) open_wave: usize,
}

impl Counts {
    /// The counts of `view`'s members at `now`. `phases`: where each member stands in the
    /// rollout, in `view.members`' order; `up`: whether a node reports, healthy and idle.
    pub(crate) fn of(
        view: &PolicyView<'_>,
        phases: impl Iterator<Item = Option<Phase>>,
        rollout: &Rollout,
        now: u64,
        up: impl Fn(&NodeRecord) -> bool,
    ) -> Counts {
        let mut unavailable = 0;
        let mut healthy_up = 0;
        let mut first_unfinished = None;
        for (i, (phase, record)) in phases.zip(&view.records).enumerate() {
            if phase == Some(Phase::Upgrading) || !up(record) {
                unavailable += 1;
            } else {
                healthy_up += 1;
            }
            if first_unfinished.is_none() && !phase.is_some_and(Phase::is_finished) {
                first_unfinished = Some(i);
            }
        }
        let recent_starts = view.policy.rate.map_or(0, |rate| {
            rollout
                .recent_starts
                .iter()
                .filter(|(id, at)| at + rate.per_seconds > now && view.contains(id))
                .count()
        });
        Counts {
            unavailable,
            healthy_up,
            recent_starts,
            open_wave: view.open_wave_before(first_unfinished.unwrap_or(view.members.len())),
        }
    }

    /// Why this policy does not let its member at `position` (in `view.members`) start now,
    /// if it does not.
    pub(crate) fn blocks(
        &self,
        view: &PolicyView<'_>,
        position: usize,
        minute_of_week: u32,
    ) -> Option<String> {
        let p: &Policy = view.policy;
        let name = &p.name;
        if !p.windows.is_empty() && minutes_until_open(&p.windows, minute_of_week) != Some(0) {
            return Some(format!("policy {name:?}: outside its maintenance windows"));
        }
        if let Some(wave) = view.wave_at(position) {
            if wave > self.open_wave {
                return Some(format!(
                    "policy {name:?}: in wave {}, wave {} has not finished and soaked",
                    wave + 1,
                    self.open_wave + 1
                ));
            }
        }
        if let Some(limit) = p.max_unavailable {
            let allowed = limit.of(view.members.len());
            if self.unavailable >= allowed {
                return Some(format!(
                    "policy {name:?}: {} of its nodes unavailable, at most {allowed}",
                    self.unavailable
                ));
            }
        }
        if let Some(rate) = p.rate {
            if self.recent_starts >= rate.starts as usize {
                return Some(format!(
                    "policy {name:?}: {} starts in the last {} s, at most {}",
                    self.recent_starts, rate.per_seconds, rate.starts
                ));
            }
        }
        if p.quorum {
            let majority = view.members.len() / 2 + 1;
            if self.healthy_up < majority + 1 {
                return Some(format!(
                    "policy {name:?}: quorum: {} of {} members healthy, taking one down \
                     leaves less than {majority}",
                    self.healthy_up,
                    view.members.len()
                ));
            }
        }
        None
    }
}
