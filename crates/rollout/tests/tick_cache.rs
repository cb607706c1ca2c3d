//! The leader's cache between ticks (each group's wave order) must never change a decision:
//! after every change to the inventory — nodes joining, leaving, moving group, relabelled into
//! or out of a policy, reporting a new version — the cached tick decides exactly what a tick
//! from nothing does, and the cache keeps only the groups it last saw.

mod common;

use common::{node, World};
use proptest::prelude::*;
use slate_rollout::{tick, tick_marked, TickCache, TickPart};

const POLICIES: &str = "[[policy]]\nname = \"all\"\nmax_unavailable = \"3\"\n\
    waves = [{ percent = 10, soak = \"10s\" }, { percent = 100 }]\n\n\
    [[policy]]\nname = \"zone-a\"\nlabels = { zone = \"a\" }\nmax_unavailable = \"1\"\n";

#[derive(Debug, Clone)]
enum Change {
    Join {
        id: u16,
        group: u8,
    },
    Leave {
        pick: u16,
    },
    Regroup {
        pick: u16,
        group: u8,
    },
    Relabel {
        pick: u16,
        zone_a: bool,
    },
    Version {
        pick: u16,
    },
    /// A tick of the world: orders called, nodes upgraded, time on.
    Tick,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (any::<u16>(), 0u8..3).prop_map(|(id, group)| Change::Join { id, group }),
        any::<u16>().prop_map(|pick| Change::Leave { pick }),
        (any::<u16>(), 0u8..3).prop_map(|(pick, group)| Change::Regroup { pick, group }),
        (any::<u16>(), any::<bool>()).prop_map(|(pick, zone_a)| Change::Relabel { pick, zone_a }),
        any::<u16>().prop_map(|pick| Change::Version { pick }),
        Just(Change::Tick),
    ]
}

/// A node of the inventory; for a change the world's own bookkeeping cannot follow (leaving
/// or moving group), one that has no order in flight.
fn picked(w: &World, pick: u16, idle: bool) -> Option<String> {
    let free = |id: &String| {
        !idle || (!w.upgrading.contains_key(id) && !w.outbox.iter().any(|(o, _)| o.node == *id))
    };
    let ids: Vec<&String> = w.inventory.keys().filter(|id| free(id)).collect();
    (!ids.is_empty()).then(|| ids[pick as usize % ids.len()].clone())
}

fn apply(w: &mut World, c: &Change) {
    match c {
        Change::Join { id, group } => w.add(node(&format!("n{id:05}"), &format!("g{group}"), "1")),
        Change::Leave { pick } => {
            if let Some(id) = picked(w, *pick, true) {
                w.inventory.remove(&id);
            }
        }
        Change::Regroup { pick, group } => {
            if let Some(id) = picked(w, *pick, true) {
                w.inventory.get_mut(&id).unwrap().report.group = format!("g{group}");
            }
        }
        Change::Relabel { pick, zone_a } => {
            if let Some(id) = picked(w, *pick, false) {
                let labels = &mut w.inventory.get_mut(&id).unwrap().report.labels;
                let zone = if *zone_a { "a" } else { "b" };
                labels.insert("zone".into(), zone.into());
            }
        }
        Change::Version { pick } => {
            if let Some(id) = picked(w, *pick, false) {
                w.inventory.get_mut(&id).unwrap().report.version = "2".into();
            }
        }
        Change::Tick => {
            w.tick();
            w.advance(5);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_cached_tick_decides_as_a_fresh_one(
        start in 0usize..40,
        changes in proptest::collection::vec(change(), 1..60),
    ) {
        let mut w = World::new(POLICIES, &["1", "2"]);
        for i in 0..start {
            w.add(node(&format!("s{i:03}"), &format!("g{}", i % 3), "1"));
        }
        let mut cache = TickCache::new();
        let mut parts = Vec::new();
        for c in &changes {
            apply(&mut w, c);
            let fresh = tick(&w.tick_input());
            let cached = tick_marked(&w.tick_input(), &mut cache, &mut |p| parts.push(p));
            prop_assert_eq!(&cached, &fresh, "after {:?}", c);
            // A second call on the same input hits the cache and still agrees.
            let again = tick_marked(&w.tick_input(), &mut cache, &mut |_| {});
            prop_assert_eq!(&again, &fresh);
            let groups: std::collections::BTreeSet<&str> =
                w.inventory.values().map(|r| r.report.group.as_str()).collect();
            prop_assert!(cache.len() <= groups.len(), "the cache outgrew the fleet's groups");
        }
        // Every group's parts are marked in order, after the one grouping.
        for run in parts.split(|p| *p == TickPart::Grouping).skip(1) {
            prop_assert_eq!(run.len() % 3, 0);
            for three in run.chunks(3) {
                prop_assert_eq!(three, &[TickPart::WaveOrder, TickPart::Views, TickPart::Decisions]);
            }
        }
    }
}
