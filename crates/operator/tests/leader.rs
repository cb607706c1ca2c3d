//! The leader's orders go out off its loop, against a real three-member etcd cluster on
//! loopback: the leader goes on ticking while a call hangs, starts no node past the limit
//! while the answer is late, asks no node twice, and an answer that comes back after its
//! leadership ended is never written. Run with `CI=true` to make a missing etcd a failure.

mod common;

use common::{put_node, until};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use slate_operator::etcd::{Commit, EtcdState, Outcome, DEFAULT_PREFIX};
use slate_operator::leader::{self, LeaderConfig, Log, ReleaseSource, TickObserver};
use slate_operator::state;
use slate_operator::{DriveError, NodeDriver, OperatorMetrics};
use slate_release::ReleaseIndex;
use slate_rollout::{Order, Step};
use slate_testkit::etcd::{one_at_a_time, three_members};

struct Fixed;

impl ReleaseSource for Fixed {
    fn index(&self) -> Result<ReleaseIndex, String> {
        Ok(ReleaseIndex {
            releases: vec![common::release("1"), common::release("2")],
            ..ReleaseIndex::default()
        })
    }
}

/// Calls that hang until the test opens the gate; every call counted by node.
#[derive(Default)]
struct Gated {
    open: Mutex<bool>,
    opened: Condvar,
    calls: Mutex<BTreeMap<String, usize>>,
}

impl NodeDriver for Gated {
    fn upgrade(&self, order: &Order) -> Result<(), DriveError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(order.node.clone())
            .or_default() += 1;
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        Ok(())
    }
}

impl Gated {
    fn calls(&self) -> BTreeMap<String, usize> {
        self.calls.lock().unwrap().clone()
    }
}

struct StopOnDrop<'a>(&'a AtomicBool, &'a Gated);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        *self.1.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.1.opened.notify_all();
    }
}

/// Where `node` stands in its group's stored rollout.
fn step(state: &EtcdState, group: &str, node: &str) -> Option<Step> {
    let rollouts = state::rollouts(state).unwrap();
    let rollout = &rollouts.get(group)?.value;
    Some(rollout.nodes.get(node)?.step.clone())
}

#[test]
fn orders_leave_the_loop_and_an_old_terms_answer_is_dropped() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let state = EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap();
    state::set_policies(
        &state,
        "[[policy]]\nname = \"one\"\nmax_unavailable = \"1\"\n",
    )
    .unwrap();
    for id in ["web-1", "web-2", "web-3"] {
        put_node(&state, id, "web");
    }
    let driver = Gated::default();
    let ticks = Arc::new(AtomicUsize::new(0));
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let config = LeaderConfig {
        name: "a".into(),
        repository: "registry.invalid/os".into(),
        tick: Duration::from_millis(100),
        stale_after: Duration::from_secs(600),
        lease_ttl: Duration::from_secs(2),
        release_refresh: Duration::from_secs(60),
        parallel_orders: 4,
        event_retention: Duration::from_secs(3600),
    };
    let said = lines.clone();
    let log: Log = Arc::new(move |line: &str| said.lock().unwrap().push(line.to_owned()));
    let counted = ticks.clone();
    let observer: TickObserver = Arc::new(move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    let stop = AtomicBool::new(false);
    let metrics = OperatorMetrics::new();
    std::thread::scope(|scope| {
        // A failed check must not leave the scope waiting for the leader forever.
        let _stop = StopOnDrop(&stop, &driver);
        let leading = scope.spawn(|| {
            leader::run(
                &state,
                &config,
                &driver,
                &Fixed,
                None,
                &stop,
                &log,
                Some(&observer),
                &metrics,
            )
        });
        until("no node was ordered", Duration::from_secs(20), || {
            driver.calls().values().sum::<usize>() == 1
        });
        let first = driver.calls().into_keys().next().unwrap();
        // The call hangs; the leader goes on ticking, and with the limit at 1 and the first
        // node upgrading (unconfirmed) it starts no other and asks the first no second time.
        let before = ticks.load(Ordering::Relaxed);
        until(
            "the leader stopped ticking",
            Duration::from_secs(10),
            || ticks.load(Ordering::Relaxed) >= before + 5,
        );
        assert_eq!(driver.calls(), BTreeMap::from([(first.clone(), 1)]));
        assert_eq!(
            step(&state, "web", &first),
            Some(Step::Upgrading {
                issued: false,
                prior_failure: None
            })
        );
        let upgrading = state::rollouts(&state).unwrap()["web"]
            .value
            .nodes
            .values()
            .filter(|p| matches!(p.step, Step::Upgrading { .. }))
            .count();
        assert_eq!(upgrading, 1);

        // The leadership ends under it: its key deleted, as a lost lease would have it. A new
        // group's rollout makes its next commit find out (fenced: deposed), and it leads again
        // under a new term, which orders the new group's node.
        let deleted = Commit {
            delete_ranges: vec![("leader/".into(), "leader0".into())],
            ..Commit::default()
        };
        assert!(matches!(
            state.commit(&deleted).unwrap(),
            Outcome::Committed { .. }
        ));
        put_node(&state, "db-1", "db");
        until(
            "the new term ordered nothing",
            Duration::from_secs(30),
            || driver.calls().contains_key("db-1"),
        );
        assert!(lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l == "a is no longer the leader"));

        // Both answers come back: the new term's is recorded, the old term's is dropped and
        // its node stays unconfirmed in etcd.
        *driver.open.lock().unwrap() = true;
        driver.opened.notify_all();
        until(
            "db-1's answer was not recorded",
            Duration::from_secs(20),
            || {
                matches!(
                    step(&state, "db", "db-1"),
                    Some(Step::Upgrading { issued: true, .. })
                )
            },
        );
        // Had it been taken, it would have been recorded in the same commit as db-1's.
        assert_eq!(
            step(&state, "web", &first),
            Some(Step::Upgrading {
                issued: false,
                prior_failure: None
            })
        );
        until(
            "the old answer was not dropped",
            Duration::from_secs(10),
            || {
                lines
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|l| l.contains("answers to an earlier leadership's orders dropped"))
            },
        );
        // The old call was never made again by the new term.
        assert_eq!(driver.calls()[&first], 1);
        drop(_stop);
        leading.join().unwrap();
    });
}
