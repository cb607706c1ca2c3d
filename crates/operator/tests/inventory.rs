//! The inventory a replica holds in memory (`nodes/` listed once, then followed by a watch)
//! and the batching writer of heartbeats, against a real three-member etcd cluster on
//! loopback. Run with `CI=true` to make a missing etcd a failure.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_operator::etcd::{Commit, EtcdState, Expect, Outcome, DEFAULT_PREFIX};
use slate_operator::state::{self, NodeStore, NODES};
use slate_rollout::NodeRecord;
use slate_testkit::etcd::{one_at_a_time, three_members};

fn record(id: &str, version: &str, last_seen: u64) -> NodeRecord {
    common::node_record(id, "web", version, last_seen)
}

fn put(state: &EtcdState, r: &NodeRecord) -> i64 {
    let commit = Commit {
        puts: vec![(
            format!("{NODES}{}", r.report.id),
            serde_json::to_vec(r).unwrap(),
        )],
        ..Commit::default()
    };
    match state.commit(&commit).unwrap() {
        Outcome::Committed { revision } => revision,
        other => panic!("{other:?}"),
    }
}

/// Waits until `check` holds of the mirror's inventory.
fn until(store: &NodeStore, what: &str, check: impl Fn(&slate_rollout::Inventory) -> bool) {
    let since = Instant::now();
    loop {
        if let Some(s) = store.mirror.snapshot() {
            if check(&s.values) {
                return;
            }
        }
        assert!(since.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_mirror_follows_puts_deletes_and_a_lost_member_and_wakes_only_for_news() {
    let _serial = one_at_a_time();
    let Some(mut cluster) = three_members() else {
        return;
    };
    let state = Arc::new(EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap());
    // Another replica's writes, through a client of its own.
    let other = EtcdState::connect(&cluster.endpoints()[1..], DEFAULT_PREFIX).unwrap();
    for i in 0..3 {
        put(&other, &record(&format!("n{i}"), "1", 100));
    }
    let store = NodeStore::start(state.clone()).unwrap();
    until(&store, "the listing", |inv| inv.len() == 3);

    put(&other, &record("n3", "1", 100));
    until(&store, "a put", |inv| inv.contains_key("n3"));
    let generation = store.mirror.snapshot().unwrap().generation;

    // Only the time moved: no wake; the value is still followed.
    put(&other, &record("n0", "1", 200));
    until(&store, "a refreshed last_seen", |inv| {
        inv["n0"].last_seen == 200
    });
    assert_eq!(
        store
            .mirror
            .wait_change(generation, Duration::from_millis(300)),
        generation,
        "a refreshed timestamp is not news"
    );
    // A new version is: the waiter wakes at once.
    let waiting = Instant::now();
    let mirror_generation = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            store
                .mirror
                .wait_change(generation, Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(100));
        put(&other, &record("n0", "2", 200));
        waiter.join().unwrap()
    });
    assert!(mirror_generation > generation);
    assert!(waiting.elapsed() < Duration::from_secs(5));
    until(&store, "the news", |inv| inv["n0"].report.version == "2");

    // A delete, by another client.
    let delete = Commit {
        deletes: vec![format!("{NODES}n1")],
        ..Commit::default()
    };
    other.commit(&delete).unwrap();
    until(&store, "a delete", |inv| !inv.contains_key("n1"));

    // A value that is no node record refuses the inventory, naming the key, as a listing does.
    let bad = Commit {
        puts: vec![(format!("{NODES}n9"), b"{not json".to_vec())],
        ..Commit::default()
    };
    other.commit(&bad).unwrap();
    let since = Instant::now();
    let err = loop {
        match state::inventory_from(&state, Some(&store.mirror)) {
            Err(e) => break e.to_string(),
            Ok(_) => assert!(since.elapsed() < Duration::from_secs(20), "never refused"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(err.contains("nodes/n9"), "{err}");
    assert!(state::inventory(&state)
        .unwrap_err()
        .to_string()
        .contains("nodes/n9"));
    other
        .commit(&Commit {
            deletes: vec![format!("{NODES}n9")],
            ..Commit::default()
        })
        .unwrap();

    // The member the watch may be on dies: the mirror lists and watches again.
    cluster.kill(0);
    put(&other, &record("n5", "1", 300));
    until(&store, "a write after a member died", |inv| {
        inv.contains_key("n5") && !inv.contains_key("n9")
    });
    let (from_mirror, _) = state::inventory_from(&state, Some(&store.mirror)).unwrap();
    let listed = state::inventory(&other).unwrap();
    assert_eq!(
        *from_mirror, listed,
        "the mirror holds what a listing reads"
    );
}

#[test]
fn heartbeats_waiting_together_are_one_transaction_and_a_lost_swap_loses_alone() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let state = Arc::new(EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap());
    let taken = put(&state, &record("taken", "1", 1));
    let store = NodeStore::start(state.clone()).unwrap();
    let nodes = 300;
    let store = &store;
    let outcomes: Vec<(String, Outcome)> = std::thread::scope(|s| {
        let mut writers = Vec::new();
        for i in 0..nodes {
            writers.push(s.spawn(move || {
                let r = record(&format!("w{i:03}"), "1", 5);
                (
                    r.report.id.clone(),
                    store.put_if(&r, Expect::Absent).unwrap(),
                )
            }));
        }
        // A swap that must lose: the record exists.
        let lost = record("taken", "9", 5);
        writers.push(s.spawn(move || {
            let outcome = store.put_if(&lost, Expect::Absent).unwrap();
            ("taken".to_owned(), outcome)
        }));
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut revisions = BTreeSet::new();
    for (id, outcome) in &outcomes {
        match (id.as_str(), outcome) {
            ("taken", o) => assert_eq!(*o, Outcome::Conflict, "the existing record was kept"),
            (_, Outcome::Committed { revision }) => {
                revisions.insert(*revision);
            }
            (id, o) => panic!("{id}: {o:?}"),
        }
    }
    let listed = state::inventory(&state).unwrap();
    assert_eq!(listed.len(), nodes + 1);
    assert_eq!(listed["taken"].report.version, "1");
    let stored = state::node(&state, "taken").unwrap().unwrap();
    assert_eq!(stored.revision, taken);
    // Under this load records share transactions: fewer proposals than records.
    assert!(
        revisions.len() < nodes,
        "{} transactions for {nodes} records",
        revisions.len()
    );
    // Each writer's own next read sees its write (the mirror holds it at once).
    let (value, revision) = store.mirror.get("w000").unwrap().unwrap();
    assert_eq!(value.report.id, "w000");
    assert!(revisions.contains(&revision));
    eprintln!(
        "{nodes} records in {} transactions (a batch holds at most {})",
        revisions.len(),
        state::MAX_BATCH
    );
}
