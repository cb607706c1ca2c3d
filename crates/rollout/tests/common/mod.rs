//! A small world for the rollout tests: nodes that answer orders after a number of ticks.

#![allow(dead_code)]

use std::collections::BTreeMap;

use slate_release::{Channel, Release, ReleaseIndex};
use slate_rollout::{
    tick, tick_explained, tick_in_place, Decision, Event, FailureReport, Inventory, NodeRecord,
    NodeReport, Order, PolicySet, Rollout, Tick, TickCache,
};

pub const REPO: &str = "registry.example/slate";
/// A Monday, 00:00 UTC.
pub const MONDAY: u64 = 1_795_996_800;

pub fn release(version: &str) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{:064}", 0),
        created: "2026-11-30T00:00:00Z".into(),
        channel: Channel::Stable,
        official: true,
        min_from: None,
        yanked: None,
    }
}

pub fn index(versions: &[&str]) -> ReleaseIndex {
    ReleaseIndex {
        releases: versions.iter().map(|v| release(v)).collect(),
        ..ReleaseIndex::default()
    }
}

pub fn node(id: &str, group: &str, version: &str) -> NodeReport {
    NodeReport::settled(id, group, format!("{id}.example:50000"), version)
}

/// A fleet that behaves: an ordered node is busy for `upgrade_ticks` ticks, then commits the
/// target, or reverts when the target is in `broken`.
pub struct World {
    pub now: u64,
    pub inventory: Inventory,
    pub policies: PolicySet,
    pub index: ReleaseIndex,
    pub rollouts: BTreeMap<String, Rollout>,
    pub events: Vec<Event>,
    pub upgrade_ticks: u32,
    pub broken: Vec<String>,
    /// Node → (target, ticks left).
    pub upgrading: BTreeMap<String, (String, u32)>,
    /// Every order a node accepted, in order: (node, target).
    pub accepted: Vec<(String, String)>,
    pub step: u64,
    /// The probe answers the leader would have gathered.
    pub probes: BTreeMap<String, bool>,
    /// Ticks between an order's decision and its call (with its answer recorded at once):
    /// the operator's outbox sends orders while later ticks run.
    pub order_delay: u32,
    /// Orders decided and not yet called, with the ticks left: one per node at most, as the
    /// outbox keeps a node pending until its answer is taken.
    pub outbox: Vec<(Order, u32)>,
}

impl World {
    pub fn new(policies: &str, versions: &[&str]) -> World {
        World {
            now: MONDAY + 12 * 3600,
            inventory: Inventory::new(),
            policies: PolicySet::parse(policies).expect("policies parse"),
            index: index(versions),
            rollouts: BTreeMap::new(),
            events: Vec::new(),
            upgrade_ticks: 2,
            broken: Vec::new(),
            upgrading: BTreeMap::new(),
            accepted: Vec::new(),
            step: 10,
            probes: BTreeMap::new(),
            order_delay: 0,
            outbox: Vec::new(),
        }
    }

    pub fn add(&mut self, report: NodeReport) {
        let id = report.id.clone();
        self.inventory.insert(
            id,
            NodeRecord {
                report,
                last_seen: self.now,
            },
        );
    }

    pub fn add_group(&mut self, group: &str, count: usize, version: &str) {
        for i in 0..count {
            self.add(node(&format!("{group}-{i:04}"), group, version));
        }
    }

    pub fn tick_input(&self) -> Tick<'_> {
        Tick {
            now: self.now,
            inventory: &self.inventory,
            policies: &self.policies,
            index: &self.index,
            repository: REPO,
            rollouts: &self.rollouts,
            stale_after: 120,
            probes: &self.probes,
        }
    }

    /// One leader tick: store the rollouts (through JSON, as etcd does), deliver the orders.
    /// Every tick of every test also checks that the leader's [`tick`], which skips the
    /// waiting nodes' reasons and the nodes past a refusing policy, decides exactly what
    /// [`tick_explained`], which walks every node, does.
    pub fn tick(&mut self) -> Decision {
        let decision = tick_explained(&self.tick_input());
        let fast = tick(&self.tick_input());
        assert_eq!(
            fast,
            Decision {
                waiting: BTreeMap::new(),
                ..decision.clone()
            },
            "tick and tick_explained decided differently"
        );
        // The leader's tick changes the rollouts it holds in place: the same decision, and
        // its rollouts afterwards are what the others return over what they were given.
        let mut lent = self.rollouts.clone();
        let mut cache = TickCache::new();
        let in_place = tick_in_place(
            &Tick {
                rollouts: &BTreeMap::new(),
                ..self.tick_input()
            },
            &mut lent,
            &mut cache,
            &mut |_| {},
        );
        assert_eq!(
            in_place,
            Decision {
                rollouts: BTreeMap::new(),
                changed_in_place: fast.rollouts.keys().cloned().collect(),
                ..fast.clone()
            },
            "tick_in_place decided differently"
        );
        let mut expected = self.rollouts.clone();
        expected.extend(fast.rollouts.clone());
        assert_eq!(lent, expected, "tick_in_place left other rollouts");
        for (group, rollout) in &decision.rollouts {
            let json = serde_json::to_string(rollout).unwrap();
            self.rollouts
                .insert(group.clone(), serde_json::from_str(&json).unwrap());
        }
        self.events.extend(decision.events.iter().cloned());
        for order in &decision.orders {
            if !self.outbox.iter().any(|(o, _)| o.node == order.node) {
                self.outbox.push((order.clone(), self.order_delay));
            }
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.outbox)
            .into_iter()
            .partition(|(_, left)| *left == 0);
        self.outbox = later.into_iter().map(|(o, left)| (o, left - 1)).collect();
        for (order, _) in &due {
            let pinned = order.image.split('@').next().unwrap();
            let target = pinned.rsplit(':').next().unwrap().to_owned();
            let rec = self.inventory.get_mut(&order.node).unwrap();
            if rec.report.busy {
                continue; // the node refuses: locked
            }
            rec.report.busy = true;
            self.accepted.push((order.node.clone(), target.clone()));
            self.upgrading
                .insert(order.node.clone(), (target, self.upgrade_ticks));
            let rollout = self.rollouts.get_mut(&order.group).unwrap();
            if let Some(p) = rollout.nodes.get_mut(&order.node) {
                if let slate_rollout::Step::Upgrading { issued, .. } = &mut p.step {
                    *issued = true;
                }
            }
        }
        decision
    }

    /// Time passes; nodes progress and report.
    pub fn advance(&mut self, seconds: u64) {
        self.now += seconds;
        let mut done = Vec::new();
        for (id, (target, left)) in self.upgrading.iter_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                done.push((id.clone(), target.clone()));
            }
        }
        for (id, target) in done {
            self.upgrading.remove(&id);
            let rec = self.inventory.get_mut(&id).unwrap();
            rec.report.busy = false;
            if self.broken.contains(&target) {
                rec.report.last_failure = Some(FailureReport {
                    version: target,
                    reason: "health checks failed; reverted".into(),
                });
            } else {
                rec.report.version = target;
            }
        }
        for rec in self.inventory.values_mut() {
            rec.last_seen = self.now;
        }
    }

    pub fn run(&mut self, ticks: usize) {
        for _ in 0..ticks {
            self.tick();
            self.advance(self.step);
        }
    }

    pub fn in_flight(&self, group: &str) -> usize {
        self.rollouts.get(group).map_or(0, |r| {
            r.nodes
                .values()
                .filter(|p| matches!(p.step, slate_rollout::Step::Upgrading { .. }))
                .count()
        })
    }

    pub fn versions(&self, group: &str) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for rec in self.inventory.values().filter(|r| r.report.group == group) {
            *out.entry(rec.report.version.clone()).or_default() += 1;
        }
        out
    }
}
