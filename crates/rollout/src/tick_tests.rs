//! The tick's incremental per-node phases against the rollout read afresh. `run` asserts
//! after every group (in this crate's test build) that the phases it kept up to date equal
//! [`join`] of the rollout it ends with; these drive it through starts, commits, soaks,
//! failures, a paused budget, nodes found on the target and a node that left.

use std::collections::BTreeMap;

use slate_release::{Channel, Release, ReleaseIndex};

use super::{join, tick, tick_explained, Tick};
use crate::limits::Phase;
use crate::node::{FailureReport, Inventory, NodeRecord, NodeReport};
use crate::policy::{PolicySet, Strategy};
use crate::rollout::{NodeProgress, Rollout, Step};

fn release(version: &str) -> Release {
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

fn record(id: &str, group: &str, version: &str, zone: &str) -> NodeRecord {
    NodeRecord {
        report: NodeReport {
            labels: [("zone".to_owned(), zone.to_owned())].into(),
            ..NodeReport::settled(id, group, format!("{id}:50000"), version)
        },
        last_seen: 0,
    }
}

fn progress(step: Step) -> NodeProgress {
    NodeProgress {
        from: None,
        started: None,
        strategy: Strategy::InPlace,
        step,
    }
}

#[test]
fn join_matches_a_lookup_of_each_node() {
    let inventory: Inventory = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|id| (id.to_string(), record(id, "g", "1", "x")))
        .collect();
    let covered: Vec<&NodeRecord> = inventory.values().collect();
    let nodes: BTreeMap<String, NodeProgress> = [
        ("0", Step::Done { at: 1 }),
        ("b", Step::Soaking { committed: 1 }),
        ("bb", Step::Done { at: 1 }),
        (
            "d",
            Step::Failed {
                at: 1,
                reason: "x".into(),
            },
        ),
        (
            "z",
            Step::Upgrading {
                issued: true,
                prior_failure: None,
            },
        ),
    ]
    .into_iter()
    .map(|(id, step)| (id.to_owned(), progress(step)))
    .collect();
    let by_lookup: Vec<Option<Phase>> = covered
        .iter()
        .map(|rec| nodes.get(&rec.report.id).map(|p| Phase::of(&p.step)))
        .collect();
    assert_eq!(join(&covered, &nodes), by_lookup);
    assert_eq!(
        by_lookup,
        vec![None, Some(Phase::Soaking), None, Some(Phase::Failed), None]
    );
    assert_eq!(join(&covered, &BTreeMap::new()), vec![None; 5]);
}

#[test]
fn phases_follow_a_rollout_through_every_step() {
    let policies = PolicySet::parse(
        "[[policy]]\nname = \"all\"\nmax_unavailable = \"20%\"\nfailure_budget = 3\n\
         waves = [{ percent = 10, soak = \"20s\" }, { percent = 100 }]\n\
         [[policy]]\nname = \"zone-b\"\nmax_unavailable = \"2\"\nlabels = { zone = \"b\" }\n",
    )
    .unwrap();
    let index = ReleaseIndex {
        releases: vec![release("1"), release("2")],
        ..ReleaseIndex::default()
    };
    let mut inventory = Inventory::new();
    for g in ["g1", "g2"] {
        for i in 0..40 {
            let id = format!("{g}-{i:02}");
            // A few already on the target; one zone in three labelled b.
            let version = if i % 13 == 0 { "2" } else { "1" };
            let zone = if i % 3 == 0 { "b" } else { "a" };
            inventory.insert(id.clone(), record(&id, g, version, zone));
        }
    }
    let mut rollouts: BTreeMap<String, Rollout> = BTreeMap::new();
    let probes = BTreeMap::new();
    let mut now = 1_000;
    let mut ticks = 0;
    let mut statuses = Vec::new();
    while ticks < 120 {
        ticks += 1;
        let t = Tick {
            now,
            inventory: &inventory,
            policies: &policies,
            index: &index,
            repository: "r",
            rollouts: &rollouts,
            stale_after: 60,
            probes: &probes,
        };
        let d = tick(&t);
        let explained = tick_explained(&t);
        assert_eq!(d.orders, explained.orders);
        assert_eq!(d.rollouts, explained.rollouts);
        for order in &d.orders {
            let rec = inventory.get_mut(&order.node).unwrap();
            // g2's nodes ending in 7 fail and revert; the rest commit the target.
            if order.node.starts_with("g2") && order.node.ends_with('7') {
                rec.report.last_failure = Some(FailureReport {
                    version: "2".into(),
                    reason: "health checks failed".into(),
                });
            } else {
                rec.report.version = "2".into();
            }
        }
        rollouts.extend(d.rollouts);
        now += 10;
        for rec in inventory.values_mut() {
            rec.last_seen = now;
        }
        if ticks == 6 {
            // A node upgrading leaves the inventory.
            let leaving = rollouts["g1"]
                .nodes
                .iter()
                .find(|(_, p)| !p.step.is_finished())
                .map(|(id, _)| id.clone());
            if let Some(id) = leaving {
                inventory.remove(&id);
            }
        }
        statuses = rollouts.values().map(|r| r.state.name()).collect();
        if statuses.iter().all(|s| *s != "running") {
            break;
        }
    }
    // g1 completes; g2's failures spend its budget.
    assert_eq!(statuses, vec!["completed", "paused"], "after {ticks} ticks");
}
