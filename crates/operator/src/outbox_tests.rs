use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use slate_rollout::Strategy;

use super::*;

fn order(node: &str) -> Order {
    Order {
        group: "g".into(),
        rollout: 1,
        node: node.into(),
        endpoint: "127.0.0.1:1".into(),
        image: "registry/os:2@sha256:00".into(),
        strategy: Strategy::InPlace,
    }
}

/// A driver whose calls wait until the test opens the gate, counting calls per node and the
/// most at once.
#[derive(Default)]
struct Gated {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    open: bool,
    calls: BTreeMap<String, usize>,
    now: usize,
    most: usize,
    refuse: BTreeSet<String>,
}

impl Gated {
    fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }

    fn calls(&self) -> BTreeMap<String, usize> {
        self.state.lock().unwrap().calls.clone()
    }

    fn most(&self) -> usize {
        self.state.lock().unwrap().most
    }

    /// Waits until `n` calls are in flight at once.
    fn wait_in_flight(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = self.state.lock().unwrap();
        while s.now < n {
            assert!(
                Instant::now() < deadline,
                "{} calls in flight, not {n}",
                s.now
            );
            s = self
                .changed
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

impl NodeDriver for Gated {
    fn upgrade(&self, order: &Order) -> Result<(), DriveError> {
        let mut s = self.state.lock().unwrap();
        *s.calls.entry(order.node.clone()).or_default() += 1;
        s.now += 1;
        s.most = s.most.max(s.now);
        self.changed.notify_all();
        while !s.open {
            s = self.changed.wait(s).unwrap();
        }
        s.now -= 1;
        if s.refuse.contains(&order.node) {
            return Err(DriveError::Refused("no".into()));
        }
        Ok(())
    }
}

/// Waits until `n` answers are waiting, without taking them.
fn wait_answers(outbox: &Outbox, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while outbox.lock().answers.len() < n {
        assert!(Instant::now() < deadline, "answers did not come back");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The tick does not wait: `submit` returns while every call is held, and at most the
/// workers' number of calls are ever in flight.
#[test]
fn submit_returns_at_once_and_calls_stay_bounded() {
    let driver = Gated::default();
    let outbox = Outbox::new();
    std::thread::scope(|scope| {
        outbox.spawn_workers(scope, &driver, 3);
        outbox.begin_term(1);
        let orders: Vec<Order> = (0..10).map(|i| order(&format!("n{i}"))).collect();
        assert_eq!(outbox.submit(orders), 10);
        driver.wait_in_flight(3);
        assert_eq!(outbox.backlog(), (7, 3));
        assert!(outbox.take_answers().answers.is_empty());
        driver.open();
        wait_answers(&outbox, 10);
        let taken = outbox.take_answers();
        assert_eq!(taken.answers.len(), 10);
        assert_eq!(taken.stale, 0);
        assert!(taken
            .answers
            .iter()
            .all(|a| a.result.is_ok() && a.term == 1));
        outbox.close();
    });
    assert_eq!(driver.most(), 3);
    assert!(driver.calls().values().all(|&n| n == 1));
}

/// A node is not queued again while its order waits, is in a call, or its answer waits to
/// be recorded; once the answer is taken it may be (the tick decides whether it is).
#[test]
fn a_pending_node_is_not_sent_twice() {
    let driver = Gated::default();
    let outbox = Outbox::new();
    std::thread::scope(|scope| {
        outbox.spawn_workers(scope, &driver, 2);
        outbox.begin_term(1);
        assert_eq!(outbox.submit(vec![order("a"), order("a"), order("b")]), 2);
        driver.wait_in_flight(2);
        // In a call.
        assert_eq!(outbox.submit(vec![order("a"), order("b")]), 0);
        driver.open();
        wait_answers(&outbox, 2);
        // Answered, not taken.
        assert!(outbox.is_pending("a"));
        assert_eq!(outbox.submit(vec![order("a")]), 0);
        assert_eq!(outbox.take_answers().answers.len(), 2);
        assert!(!outbox.is_pending("a"));
        assert_eq!(outbox.submit(vec![order("a")]), 1);
        wait_answers(&outbox, 1);
        outbox.close();
    });
    assert_eq!(driver.calls()["a"], 2);
    assert_eq!(driver.calls()["b"], 1);
}

/// An answer to an order of an earlier term is dropped, never handed to the leader, even
/// when the same replica leads again; the new term's own answers are handed over.
#[test]
fn an_answer_from_an_earlier_term_is_dropped() {
    let driver = Gated::default();
    driver.state.lock().unwrap().refuse.insert("old".into());
    let outbox = Outbox::new();
    std::thread::scope(|scope| {
        outbox.spawn_workers(scope, &driver, 1);
        outbox.begin_term(1);
        assert_eq!(outbox.submit(vec![order("old"), order("unsent")]), 2);
        driver.wait_in_flight(1);
        outbox.end_term();
        // The term ended: nothing is taken, and its unsent order is gone.
        assert_eq!(outbox.submit(vec![order("x")]), 0);
        assert!(!outbox.is_pending("unsent"));
        outbox.begin_term(2);
        // Still in its call: not sent again by the new term.
        assert_eq!(outbox.submit(vec![order("old"), order("new")]), 1);
        driver.open();
        wait_answers(&outbox, 2);
        let taken = outbox.take_answers();
        assert_eq!(taken.stale, 1);
        let nodes: Vec<&str> = taken
            .answers
            .iter()
            .map(|a| a.order.node.as_str())
            .collect();
        assert_eq!(nodes, ["new"]);
        assert_eq!(taken.answers[0].term, 2);
        outbox.close();
    });
    let calls = driver.calls();
    assert_eq!(calls.get("unsent"), None, "{calls:?}");
    assert_eq!(calls["old"], 1);
}

/// Answers given back after a failed record are taken again, before newer ones, and keep
/// their nodes pending meanwhile.
#[test]
fn given_back_answers_are_taken_again() {
    let driver = Gated::default();
    driver.open();
    let outbox = Outbox::new();
    std::thread::scope(|scope| {
        outbox.spawn_workers(scope, &driver, 1);
        outbox.begin_term(7);
        outbox.submit(vec![order("a")]);
        wait_answers(&outbox, 1);
        let first = outbox.take_answers().answers;
        outbox.submit(vec![order("b")]);
        wait_answers(&outbox, 1);
        outbox.give_back(first);
        assert!(outbox.is_pending("a"));
        assert_eq!(outbox.submit(vec![order("a")]), 0);
        let again = outbox.take_answers();
        let nodes: Vec<&str> = again
            .answers
            .iter()
            .map(|a| a.order.node.as_str())
            .collect();
        assert_eq!(nodes, ["a", "b"]);
        outbox.close();
    });
}

/// Closing ends the workers with orders still queued, which are never sent.
#[test]
fn close_drops_what_was_not_sent() {
    let driver = Gated::default();
    let outbox = Outbox::new();
    std::thread::scope(|scope| {
        outbox.spawn_workers(scope, &driver, 1);
        outbox.begin_term(1);
        outbox.submit(vec![order("a"), order("b")]);
        driver.wait_in_flight(1);
        outbox.close();
        driver.open();
    });
    assert_eq!(driver.calls().len(), 1);
}
