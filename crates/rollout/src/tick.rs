//! One tick of the leader, as a value: from the inventory, the policies, the release index,
//! the rollouts and the clock, the rollouts' next values, the events and the upgrade orders.
//!
//! The leader persists the new rollouts (fenced by its leadership) before it sends a single
//! order, so a node is marked upgrading before it is asked, and a new leader never asks again
//! a node that may have been asked (see [`RESEND_AFTER`] for the one exception).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use slate_release::{choose, compare, Choice, Policy as ChoicePolicy, Release, ReleaseIndex};

use crate::held::Held;
use crate::limits::Phase;
use crate::node::{Inventory, NodeRecord};
use crate::policy::PolicySet;
use crate::rollout::{
    Event, EventKind, NodeProgress, Order, Rollout, RolloutState, Step, RATE_MEMORY_SECONDS,
};
use crate::tick_cache::{TickCache, TickPart};
use crate::waves::{fresh_wave_order, PolicyView};

/// An upgrade order that the node never confirmed (the leader died between marking the node
/// and hearing its answer) is sent again only when the node has reported since, idle, not on
/// the target and with no new failure, at least this long after the start: then it provably
/// did not take the first one (a node takes its sequence lock before answering).
pub const RESEND_AFTER: u64 = 30;

/// What a tick decides from.
#[derive(Debug, Clone, Copy)]
pub struct Tick<'a> {
    /// Unix seconds.
    pub now: u64,
    pub inventory: &'a Inventory,
    pub policies: &'a PolicySet,
    pub index: &'a ReleaseIndex,
    /// `REGISTRY/REPO` as the nodes reach it: a release's image is
    /// `REGISTRY/REPO:VERSION@DIGEST`.
    pub repository: &'a str,
    /// The latest rollout of each group.
    pub rollouts: &'a BTreeMap<String, Rollout>,
    /// A node silent for longer is not started, and fails its soak.
    pub stale_after: u64,
    /// The last answer of each soaking node's probe (a covering policy's `probe`), by node
    /// id: `true` for a 2xx. A soak with a probe ends only on a `true`; a `false` fails it.
    pub probes: &'a BTreeMap<String, bool>,
}

/// What a tick decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// The rollouts that changed or began, whole.
    pub rollouts: BTreeMap<String, Rollout>,
    pub events: Vec<Event>,
    /// Upgrades to send once `rollouts` are stored.
    pub orders: Vec<Order>,
    /// The groups whose rollout [`tick_in_place`] changed (or began) in the caller's map,
    /// instead of returning it in `rollouts`; empty for the other ticks.
    pub changed_in_place: BTreeSet<String>,
    /// Why each covered node that could move is waiting: filled by [`tick_explained`] only
    /// (the leader never reads it; `slate fleet plan` and the status do).
    pub waiting: BTreeMap<String, String>,
}

/// One tick over every group; `waiting` is left empty.
///
/// The leader calls this every tick, so it only builds what changes hands: a rollout is
/// copied only when a node in it moves, and once a policy has refused one node this tick it
/// refuses every later one of its members without another word (its counts only grow as
/// nodes start, its window is the same for all, later members are in the same or a later
/// wave), so the waiting nodes past it cost nothing.
pub fn tick(t: &Tick<'_>) -> Decision {
    tick_with(t, false, None, None, &mut |_| {})
}

/// [`tick`], and why each covered node that could move is waiting. Decides the same.
pub fn tick_explained(t: &Tick<'_>) -> Decision {
    tick_with(t, true, None, None, &mut |_| {})
}

/// [`tick`] with each group's wave order kept in `cache` between calls, and `mark` called as
/// each part of the tick ends (the leader times them). Decides the same as [`tick`].
pub fn tick_marked(
    t: &Tick<'_>,
    cache: &mut TickCache,
    mark: &mut dyn FnMut(TickPart),
) -> Decision {
    tick_with(t, false, Some(cache), None, mark)
}

/// [`tick_marked`] on rollouts the caller lends instead of `t.rollouts` (which is not read):
/// a group's rollout that changes is changed where it lies, not copied (at 10,000 nodes the
/// copies were a large part of a leader's tick), and named in
/// [`Decision::changed_in_place`] instead of returned in [`Decision::rollouts`]. Decides the
/// same as [`tick`]; a caller that does not store the changes must read its rollouts again.
pub fn tick_in_place(
    t: &Tick<'_>,
    rollouts: &mut BTreeMap<String, Rollout>,
    cache: &mut TickCache,
    mark: &mut dyn FnMut(TickPart),
) -> Decision {
    tick_with(t, false, Some(cache), Some(rollouts), mark)
}

fn tick_with(
    t: &Tick<'_>,
    explain: bool,
    mut cache: Option<&mut TickCache>,
    mut lent: Option<&mut BTreeMap<String, Rollout>>,
    mark: &mut dyn FnMut(TickPart),
) -> Decision {
    let mut groups: BTreeMap<&str, Vec<&NodeRecord>> = BTreeMap::new();
    for record in t.inventory.values() {
        if t.policies.for_node(&record.report).next().is_some() {
            groups.entry(&record.report.group).or_default().push(record);
        }
    }
    if let Some(cache) = cache.as_deref_mut() {
        cache.keep_only(groups.keys().copied());
    }
    mark(TickPart::Grouping);
    let mut decision = Decision::default();
    for (group, mut covered) in groups {
        // In id order, as the rollout's nodes are (a tick walks both side by side): so the
        // inventory is when each record sits under its own id, as the operator keeps it.
        if !covered.is_sorted_by(|a, b| a.report.id <= b.report.id) {
            covered.sort_by(|a, b| a.report.id.cmp(&b.report.id));
        }
        let order = match cache.as_deref_mut() {
            Some(cache) => cache.wave_order(group, &covered),
            None => fresh_wave_order(&covered),
        };
        mark(TickPart::WaveOrder);
        let group_tick = GroupTick::new(t, group, covered, &order, explain, &mut decision);
        mark(TickPart::Views);
        match lent.as_deref_mut() {
            Some(rollouts) => group_tick.run_in_place(rollouts),
            None => group_tick.run(),
        }
        mark(TickPart::Decisions);
    }
    decision
}

pub(crate) struct GroupTick<'t, 'd> {
    pub(crate) t: &'t Tick<'t>,
    pub(crate) group: &'t str,
    /// In id order.
    pub(crate) covered: Vec<&'t NodeRecord>,
    /// `covered` in wave order, sorted once per tick, and each one's index in `covered`.
    pub(crate) ordered: Vec<(&'t NodeRecord, usize)>,
    /// Each covering policy's view; a view's `at` are its members' indexes in `covered`.
    pub(crate) views: Vec<PolicyView<'t>>,
    /// Where each covered node stands in the rollout (none: not in it), by its index in
    /// `covered`: read from the rollout once, by walking both in id order, and kept up to
    /// date as the tick moves nodes.
    pub(crate) phases: Vec<Option<Phase>>,
    /// Fill `out.waiting`.
    pub(crate) explain: bool,
    pub(crate) out: &'d mut Decision,
}

impl<'t, 'd> GroupTick<'t, 'd> {
    fn new(
        t: &'t Tick<'t>,
        group: &'t str,
        covered: Vec<&'t NodeRecord>,
        order: &[usize],
        explain: bool,
        out: &'d mut Decision,
    ) -> Self {
        let ordered: Vec<(&NodeRecord, usize)> = order.iter().map(|&i| (covered[i], i)).collect();
        let views = t
            .policies
            .policies
            .iter()
            .filter_map(|policy| PolicyView::of_ordered(policy, &ordered))
            .collect();
        GroupTick {
            t,
            group,
            phases: vec![None; covered.len()],
            covered,
            ordered,
            views,
            explain,
            out,
        }
    }

    fn run(mut self) {
        let previous = self.t.rollouts.get(self.group);
        // Borrowed until something in it changes: most ticks change nothing in most groups.
        let rollout = match previous {
            Some(r) if r.state.is_active() => Held::Borrowed(r),
            _ => match self.new_rollout(previous) {
                Some(r) => Held::Owned(r),
                None => return,
            },
        };
        let rollout = self.drive(rollout);
        if let Held::Owned(rollout) = rollout {
            if previous != Some(&rollout) {
                self.out.rollouts.insert(self.group.to_owned(), rollout);
            }
        }
    }

    /// The group's decisions on `rollout`, which it returns as they left it.
    pub(crate) fn drive<'r>(&mut self, mut rollout: Held<'r>) -> Held<'r> {
        if self.target_withdrawn(&mut rollout) {
            return rollout;
        }
        self.follow_nodes(&mut rollout);
        if rollout.state == RolloutState::Running {
            if let Some(reason) = self.over_budget(&rollout) {
                self.event(&rollout, None, EventKind::Paused, reason.clone());
                rollout.to_mut().state = RolloutState::Paused {
                    reason,
                    since: self.t.now,
                };
            } else {
                self.start_nodes(&mut rollout);
                self.complete_if_done(&mut rollout);
            }
        }
        // The phases kept up to date through the tick are what reading the rollout afresh gives.
        #[cfg(test)]
        assert_eq!(self.phases, join(&self.covered, &rollout.nodes));
        self.resend_unconfirmed(&rollout);
        rollout
    }

    pub(crate) fn event(
        &mut self,
        r: &Rollout,
        node: Option<&str>,
        kind: EventKind,
        detail: String,
    ) {
        self.out.events.push(Event {
            at: self.t.now,
            group: r.group.clone(),
            rollout: r.id,
            node: node.map(str::to_owned),
            kind,
            detail,
        });
    }

    /// The release the group should move to: the newest its most conservative channel offers
    /// (official unless every covering policy allows otherwise) that its oldest node reaches.
    fn candidate(&self) -> Option<Release> {
        let policies = self.t.policies;
        let channel = self
            .covered
            .iter()
            .filter_map(|n| policies.channel_of(&n.report))
            .max()?;
        let oldest = self
            .covered
            .iter()
            .map(|n| n.report.version.as_str())
            .min_by(|a, b| compare(a, b))?;
        let unofficial = self
            .covered
            .iter()
            .all(|n| policies.allows_unofficial(&n.report));
        let mut index = self.t.index.clone();
        index.releases.retain(|r| r.official || unofficial);
        match choose(&index, channel, oldest, &ChoicePolicy::default()) {
            Choice::Upgrade(release) => Some(release.clone()),
            Choice::Hold(_) => None,
        }
    }

    pub(crate) fn new_rollout(&mut self, previous: Option<&Rollout>) -> Option<Rollout> {
        let release = self.candidate()?;
        if let Some(p) = previous {
            // An aborted or completed target is not started again; a newer one is.
            if compare(&release.version, &p.target) != Ordering::Greater {
                return None;
            }
        }
        let now = self.t.now;
        let rollout = Rollout {
            id: previous.map_or(1, |p| p.id + 1),
            group: self.group.to_owned(),
            target: release.version.clone(),
            // Pinned by digest: a moved tag cannot change what a node installs.
            image: format!(
                "{}:{}@{}",
                self.t.repository, release.version, release.digest
            ),
            created: now,
            state: RolloutState::Running,
            nodes: BTreeMap::new(),
            recent_starts: previous
                .map(|p| {
                    p.recent_starts
                        .iter()
                        .filter(|(_, at)| at + RATE_MEMORY_SECONDS > now)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            acknowledged: BTreeSet::new(),
        };
        let detail = format!(
            "{} nodes to {} ({} channel)",
            self.covered.len(),
            rollout.target,
            release.channel
        );
        self.event(&rollout, None, EventKind::RolloutStarted, detail);
        Some(rollout)
    }

    /// A running rollout whose target was yanked (or removed) ends; the next tick starts the
    /// next release. A paused one waits for `resume`, which does the same.
    fn target_withdrawn(&mut self, rollout: &mut Held<'_>) -> bool {
        if rollout.state != RolloutState::Running {
            return false;
        }
        let Some(reason) = withdrawn(self.t.index, &rollout.target) else {
            return false;
        };
        self.event(rollout, None, EventKind::Aborted, reason.clone());
        rollout.to_mut().state = RolloutState::Aborted {
            reason,
            at: self.t.now,
        };
        true
    }

    pub(crate) fn record(&self, id: &str) -> Option<&'t NodeRecord> {
        self.t.inventory.get(id)
    }

    pub(crate) fn stale(&self, record: &NodeRecord) -> bool {
        record.last_seen + self.t.stale_after < self.t.now
    }

    /// The first policy whose failure budget is spent, as a reason.
    fn over_budget(&self, rollout: &Rollout) -> Option<String> {
        let failed = |at: &[usize]| -> Vec<&str> {
            at.iter()
                .filter(|&&i| self.phases[i] == Some(Phase::Failed))
                .map(|&i| self.covered[i].report.id.as_str())
                .filter(|id| !rollout.acknowledged(id))
                .collect()
        };
        self.views.iter().find_map(|view| {
            let budget = view.policy.failure_budget? as usize;
            let failed = failed(&view.at);
            (failed.len() >= budget).then(|| {
                format!(
                    "policy {:?}: {} of its nodes failed on {} ({}), its failure budget is {}",
                    view.policy.name,
                    failed.len(),
                    rollout.target,
                    failed.join(", "),
                    budget
                )
            })
        })
    }

    fn complete_if_done(&mut self, rollout: &mut Held<'_>) {
        if !self
            .phases
            .iter()
            .all(|p| p.is_some_and(Phase::is_finished))
        {
            return;
        }
        let failed = rollout
            .nodes
            .values()
            .filter(|p| matches!(p.step, Step::Failed { .. }))
            .count();
        let detail = format!(
            "{} nodes on {}, {failed} failed",
            rollout.nodes.len() - failed,
            rollout.target
        );
        self.event(rollout, None, EventKind::Completed, detail);
        rollout.to_mut().state = RolloutState::Completed { at: self.t.now };
    }

    fn resend_unconfirmed(&mut self, rollout: &Rollout) {
        let now = self.t.now;
        for (id, progress) in &rollout.nodes {
            let Step::Upgrading {
                issued: false,
                prior_failure,
            } = &progress.step
            else {
                continue;
            };
            let (Some(started), Some(rec)) = (progress.started, self.record(id)) else {
                continue;
            };
            let r = &rec.report;
            let idle_elsewhere = rec.last_seen > started
                && !r.busy
                && r.version != rollout.target
                && r.last_failure == *prior_failure;
            if now >= started + RESEND_AFTER && idle_elsewhere && started != now {
                self.out.orders.push(Order {
                    group: rollout.group.clone(),
                    rollout: rollout.id,
                    node: id.clone(),
                    endpoint: r.endpoint.clone(),
                    image: rollout.image.clone(),
                    strategy: progress.strategy,
                });
            }
        }
    }
}

pub(crate) fn failed(at: u64, reason: String) -> Step {
    Step::Failed { at, reason }
}

/// Why `target` may no longer be rolled out, if so.
pub(crate) fn withdrawn(index: &ReleaseIndex, target: &str) -> Option<String> {
    match index.get(target) {
        None => Some(format!("{target} is no longer in the release index")),
        Some(r) => r
            .yanked
            .as_ref()
            .map(|why| format!("{target} was yanked: {why}")),
    }
}

#[cfg(test)]
#[path = "tick_tests.rs"]
mod tests;

/// Where each of `covered` (in id order) stands in `nodes`, by one walk of both in id order.
pub(crate) fn join(
    covered: &[&NodeRecord],
    nodes: &BTreeMap<String, NodeProgress>,
) -> Vec<Option<Phase>> {
    let mut entries = nodes.iter().peekable();
    covered
        .iter()
        .map(|rec| {
            let id = rec.report.id.as_str();
            while entries.next_if(|(key, _)| key.as_str() < id).is_some() {}
            entries
                .next_if(|(key, _)| key.as_str() == id)
                .map(|(_, p)| Phase::of(&p.step))
        })
        .collect()
}
