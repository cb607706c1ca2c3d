//! One tick of the leader, as a value: from the inventory, the policies, the release index,
//! the rollouts and the clock, the rollouts' next values, the events and the upgrade orders.
//!
//! The leader persists the new rollouts (fenced by its leadership) before it sends a single
//! order, so a node is marked upgrading before it is asked, and a new leader never asks again
//! a node that may have been asked (see [`RESEND_AFTER`] for the one exception).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use slate_machine_config::minute_of_week;
use slate_release::{choose, compare, Choice, Policy as ChoicePolicy, Release, ReleaseIndex};

use crate::limits::Counts;
use crate::node::{Inventory, NodeRecord};
use crate::policy::PolicySet;
use crate::rollout::{
    Event, EventKind, NodeProgress, Order, Rollout, RolloutState, Step, RATE_MEMORY_SECONDS,
};
use crate::waves::PolicyView;

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
    /// Why each covered node that could move is waiting.
    pub waiting: BTreeMap<String, String>,
}

/// One tick over every group.
pub fn tick(t: &Tick<'_>) -> Decision {
    let mut groups: BTreeMap<&str, Vec<&NodeRecord>> = BTreeMap::new();
    for record in t.inventory.values() {
        if t.policies.for_node(&record.report).next().is_some() {
            groups.entry(&record.report.group).or_default().push(record);
        }
    }
    let mut decision = Decision::default();
    for (group, covered) in groups {
        GroupTick::new(t, group, covered, &mut decision).run();
    }
    decision
}

pub(crate) struct GroupTick<'t, 'd> {
    pub(crate) t: &'t Tick<'t>,
    group: &'t str,
    covered: Vec<&'t NodeRecord>,
    /// `covered` in wave order, sorted once per tick.
    ordered: Vec<&'t NodeRecord>,
    views: Vec<PolicyView<'t>>,
    out: &'d mut Decision,
}

impl<'t, 'd> GroupTick<'t, 'd> {
    fn new(
        t: &'t Tick<'t>,
        group: &'t str,
        covered: Vec<&'t NodeRecord>,
        out: &'d mut Decision,
    ) -> Self {
        let mut ordered = covered.clone();
        ordered.sort_by_cached_key(|rec| crate::waves::wave_key(&rec.report.id));
        let views = t
            .policies
            .policies
            .iter()
            .filter_map(|p| PolicyView::of_ordered(p, &ordered))
            .collect();
        GroupTick {
            t,
            group,
            covered,
            ordered,
            views,
            out,
        }
    }

    fn run(mut self) {
        let previous = self.t.rollouts.get(self.group);
        let mut rollout = match previous {
            Some(r) if r.state.is_active() => r.clone(),
            _ => match self.new_rollout(previous) {
                Some(r) => r,
                None => return,
            },
        };
        if self.target_withdrawn(&mut rollout) {
            self.finish(rollout, previous);
            return;
        }
        self.follow_nodes(&mut rollout);
        if rollout.state == RolloutState::Running {
            if let Some(reason) = self.over_budget(&rollout) {
                self.event(&rollout, None, EventKind::Paused, reason.clone());
                rollout.state = RolloutState::Paused {
                    reason,
                    since: self.t.now,
                };
            } else {
                self.start_nodes(&mut rollout);
                self.complete_if_done(&mut rollout);
            }
        }
        self.resend_unconfirmed(&rollout);
        self.finish(rollout, previous);
    }

    fn finish(&mut self, rollout: Rollout, before: Option<&Rollout>) {
        if before != Some(&rollout) {
            self.out.rollouts.insert(self.group.to_owned(), rollout);
        }
    }

    fn event(&mut self, r: &Rollout, node: Option<&str>, kind: EventKind, detail: String) {
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

    fn new_rollout(&mut self, previous: Option<&Rollout>) -> Option<Rollout> {
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
            // Pinned: the tag names the version, the digest what is pulled (a moved tag
            // cannot change what a node installs).
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
    fn target_withdrawn(&mut self, rollout: &mut Rollout) -> bool {
        if rollout.state != RolloutState::Running {
            return false;
        }
        let Some(reason) = withdrawn(self.t.index, &rollout.target) else {
            return false;
        };
        self.event(rollout, None, EventKind::Aborted, reason.clone());
        rollout.state = RolloutState::Aborted {
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

    /// Moves every started node along by what it last reported, and marks covered nodes found
    /// on the target (or past it) as done.
    fn follow_nodes(&mut self, rollout: &mut Rollout) {
        let now = self.t.now;
        let target = rollout.target.clone();
        let ids: Vec<String> = rollout.nodes.keys().cloned().collect();
        for id in ids {
            let record = self.record(&id);
            let progress = &rollout.nodes[&id];
            let started = progress.started.unwrap_or(0);
            let next = match (&progress.step, record) {
                (Step::Upgrading { prior_failure, .. }, Some(rec)) => {
                    let r = &rec.report;
                    let new_failure = r
                        .last_failure
                        .as_ref()
                        .filter(|f| f.version == target && Some(*f) != prior_failure.as_ref());
                    let timeout = self.t.policies.upgrade_timeout_of(r).as_secs();
                    if let Some(f) = new_failure {
                        Some(failed(now, format!("reverted from {target}: {}", f.reason)))
                    } else if r.version == target
                        && r.committed
                        && r.healthy
                        && !r.busy
                        && rec.last_seen >= started
                    {
                        Some(Step::Soaking { committed: now })
                    } else if now >= started + timeout {
                        Some(failed(
                            now,
                            format!("no healthy commit of {target} within {timeout} s"),
                        ))
                    } else {
                        None
                    }
                }
                (Step::Upgrading { .. }, None) => {
                    let timeout = crate::policy::DEFAULT_UPGRADE_TIMEOUT.as_secs();
                    (now >= started + timeout)
                        .then(|| failed(now, "left the inventory while upgrading".into()))
                }
                (Step::Soaking { committed }, rec) => {
                    let committed = *committed;
                    match rec {
                        Some(rec) if self.stale(rec) => Some(failed(
                            now,
                            format!("stopped reporting while soaking on {target}"),
                        )),
                        Some(rec) if rec.last_seen >= committed && rec.report.version != target => {
                            Some(failed(
                                now,
                                format!("went back to {} while soaking", rec.report.version),
                            ))
                        }
                        Some(rec) if rec.last_seen >= committed && !rec.report.healthy => {
                            Some(failed(now, format!("unhealthy while soaking on {target}")))
                        }
                        None => Some(failed(now, "left the inventory while soaking".into())),
                        Some(_) if self.t.probes.get(&id) == Some(&false) => Some(failed(
                            now,
                            format!("its probe failed while soaking on {target}"),
                        )),
                        Some(_)
                            if now >= committed + self.soak_of(&id)
                                && (!self.probed(&id) || self.t.probes.get(&id) == Some(&true)) =>
                        {
                            Some(Step::Done { at: now })
                        }
                        Some(_) => None,
                    }
                }
                (Step::Done { .. } | Step::Failed { .. }, _) => None,
            };
            if let Some(step) = next {
                let kind = match &step {
                    Step::Soaking { .. } => EventKind::Committed,
                    Step::Done { .. } => EventKind::Soaked,
                    _ => EventKind::Failed,
                };
                let detail = match &step {
                    Step::Failed { reason, .. } => reason.clone(),
                    _ => String::new(),
                };
                self.event(rollout, Some(&id), kind, detail);
                if let Some(p) = rollout.nodes.get_mut(&id) {
                    p.step = step;
                }
            }
        }
        for rec in &self.covered {
            let r = &rec.report;
            if !rollout.nodes.contains_key(&r.id) && compare(&r.version, &target).is_ge() {
                rollout.nodes.insert(
                    r.id.clone(),
                    NodeProgress {
                        from: None,
                        started: None,
                        strategy: self.t.policies.strategy_of(r),
                        step: Step::Done { at: now },
                    },
                );
            }
        }
    }

    /// Whether a covering policy probes this node.
    fn probed(&self, id: &str) -> bool {
        self.views
            .iter()
            .any(|v| v.policy.probe.is_some() && v.position.contains_key(id))
    }

    /// The soak a node's waves ask for: the longest over its policies.
    fn soak_of(&self, id: &str) -> u64 {
        self.views
            .iter()
            .filter_map(|v| v.wave_of(id).map(|w| v.policy.waves[w].soak.as_secs()))
            .max()
            .unwrap_or(0)
    }

    /// The first policy whose failure budget is spent, as a reason.
    fn over_budget(&self, rollout: &Rollout) -> Option<String> {
        self.views.iter().find_map(|view| {
            let budget = view.policy.failure_budget? as usize;
            let failed: Vec<&str> = view
                .members
                .iter()
                .filter(|id| {
                    matches!(
                        rollout.nodes.get(**id).map(|p| &p.step),
                        Some(Step::Failed { .. })
                    ) && !rollout.acknowledged(id)
                })
                .copied()
                .collect();
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

    fn start_nodes(&mut self, rollout: &mut Rollout) {
        let now = self.t.now;
        let Some(release) = self.t.index.get(&rollout.target).cloned() else {
            return;
        };
        let mut counts: Vec<Counts> = self
            .views
            .iter()
            .map(|v| {
                Counts::of(v, rollout, self.t.now, |id| {
                    self.record(id).is_some_and(|rec| {
                        !self.stale(rec) && rec.report.healthy && !rec.report.busy
                    })
                })
            })
            .collect();
        let candidates: Vec<&NodeRecord> = self
            .ordered
            .iter()
            .copied()
            .filter(|rec| !rollout.nodes.contains_key(&rec.report.id))
            .collect();
        let minute = minute_of_week(now);
        for rec in candidates {
            let r = &rec.report;
            let own = if self.stale(rec) {
                Some(format!(
                    "silent for {} s",
                    now.saturating_sub(rec.last_seen)
                ))
            } else if r.busy {
                Some("busy with another sequence".into())
            } else if !r.healthy || !r.committed {
                Some("not healthy and committed".into())
            } else if !release.reachable_from(&r.version) {
                Some(format!(
                    "{} upgrades only from {} or newer",
                    release.version,
                    release.min_from.as_deref().unwrap_or("?")
                ))
            } else {
                None
            };
            let blocked = own.or_else(|| {
                self.views
                    .iter()
                    .zip(&counts)
                    .filter(|(v, _)| v.position.contains_key(r.id.as_str()))
                    .find_map(|(v, c)| c.blocks(v, &r.id, minute))
            });
            if let Some(reason) = blocked {
                self.out.waiting.insert(r.id.clone(), reason);
                continue;
            }
            for (v, c) in self.views.iter().zip(counts.iter_mut()) {
                if v.position.contains_key(r.id.as_str()) {
                    c.unavailable += 1;
                    c.healthy_up = c.healthy_up.saturating_sub(1);
                    c.recent_starts += 1;
                }
            }
            let strategy = self.t.policies.strategy_of(r);
            rollout.nodes.insert(
                r.id.clone(),
                NodeProgress {
                    from: Some(r.version.clone()),
                    started: Some(now),
                    strategy,
                    step: Step::Upgrading {
                        issued: false,
                        prior_failure: r.last_failure.clone(),
                    },
                },
            );
            rollout.recent_starts.push((r.id.clone(), now));
            let detail = format!("{} → {}", r.version, rollout.target);
            self.event(rollout, Some(&r.id), EventKind::Started, detail);
            self.out.orders.push(Order {
                group: rollout.group.clone(),
                rollout: rollout.id,
                node: r.id.clone(),
                endpoint: r.endpoint.clone(),
                image: rollout.image.clone(),
                strategy,
            });
        }
        rollout
            .recent_starts
            .retain(|(_, at)| at + RATE_MEMORY_SECONDS > now);
    }

    fn complete_if_done(&mut self, rollout: &mut Rollout) {
        let all_finished = self.covered.iter().all(|rec| {
            rollout
                .nodes
                .get(&rec.report.id)
                .is_some_and(|p| p.step.is_finished())
        });
        if !all_finished {
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
        rollout.state = RolloutState::Completed { at: self.t.now };
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

fn failed(at: u64, reason: String) -> Step {
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
