//! The operator's etcd state and election against a real three-member etcd cluster on loopback
//! (`slate_testkit::etcd`): checked, atomic commits and paged listings at one revision; one
//! leader at a time, handed over on resignation and on lease expiry, with the old leader's
//! fence refused; the etcd leader killed under commits and campaigns; a stopped campaign
//! leaving nothing behind. Run with `CI=true` to make a missing etcd a failure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use slate_operator::etcd::{
    Commit, EtcdState, Expect, Fence, Leadership, Outcome, StateError, DEFAULT_PREFIX, RETRY_BUDGET,
};
use slate_testkit::etcd::{one_at_a_time, three_members, EtcdCluster};

fn connect(cluster: &EtcdCluster) -> EtcdState {
    EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap()
}

fn put(key: &str, value: &[u8]) -> (String, Vec<u8>) {
    (key.to_owned(), value.to_vec())
}

fn committed(outcome: Outcome) -> i64 {
    match outcome {
        Outcome::Committed { revision } => revision,
        other => panic!("not committed: {other:?}"),
    }
}

fn fenced(fence: &Fence, key: &str, value: &[u8]) -> Commit {
    Commit {
        fence: Some(fence.clone()),
        puts: vec![put(key, value)],
        ..Commit::default()
    }
}

/// A campaign on its own thread: its answer and when it came, or nothing yet.
struct Campaign {
    answer: mpsc::Receiver<(Result<Option<Leadership>, StateError>, Instant)>,
    stop: Arc<AtomicBool>,
}

impl Campaign {
    fn start(state: &EtcdState, value: &str, ttl: Duration) -> Campaign {
        let (tx, answer) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (state, value, flag) = (state.clone(), value.to_owned(), stop.clone());
        thread::spawn(move || {
            let won = state.campaign("leader", &value, ttl, &flag);
            let _ = tx.send((won, Instant::now()));
        });
        Campaign { answer, stop }
    }

    /// Panics if the campaign answered within `wait`.
    fn assert_waiting(&self, wait: Duration) {
        if let Ok((won, _)) = self.answer.recv_timeout(wait) {
            panic!("the campaign answered while another leads: {won:?}");
        }
    }

    fn answer(&self, within: Duration) -> (Option<Leadership>, Instant) {
        let (won, at) = self
            .answer
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no answer within {within:?}"));
        (won.unwrap(), at)
    }

    fn elected(&self, within: Duration) -> (Leadership, Instant) {
        match self.answer(within) {
            (Some(leadership), at) => (leadership, at),
            (None, _) => panic!("stopped, not elected"),
        }
    }
}

fn elect(state: &EtcdState, value: &str, ttl: Duration) -> Leadership {
    state
        .campaign("leader", value, ttl, &AtomicBool::new(false))
        .unwrap()
        .expect("elected")
}

#[test]
fn commits_are_checked_and_atomic_and_listings_consistent() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let state = connect(&cluster);
    assert_eq!(state.prefix(), "/slate/operator/");
    assert_eq!(state.get("rollouts/r1").unwrap(), None);

    // Absent: creates once.
    let create = Commit {
        checks: vec![("rollouts/r1".into(), Expect::Absent)],
        puts: vec![put("rollouts/r1", b"v1")],
        ..Commit::default()
    };
    let r1 = committed(state.commit(&create).unwrap());
    let read = state.get("rollouts/r1").unwrap().unwrap();
    assert_eq!(
        (read.key.as_str(), &read.value[..]),
        ("rollouts/r1", &b"v1"[..])
    );
    assert_eq!(read.mod_revision, r1);
    assert_eq!(state.commit(&create).unwrap(), Outcome::Conflict);

    // ModRevision: the current one commits; a stale one writes nothing, not even other keys.
    let update = |revision, value: &[u8]| Commit {
        checks: vec![("rollouts/r1".into(), Expect::ModRevision(revision))],
        puts: vec![put("rollouts/r1", value), put("rollouts/r2", b"x")],
        deletes: vec!["rollouts/r0".into()],
        ..Commit::default()
    };
    let r2 = committed(state.commit(&update(r1, b"v2")).unwrap());
    assert!(r2 > r1);
    assert_eq!(
        state.commit(&update(r1, b"stale")).unwrap(),
        Outcome::Conflict
    );
    let read = state.get("rollouts/r1").unwrap().unwrap();
    assert_eq!((&read.value[..], read.mod_revision), (&b"v2"[..], r2));
    assert_eq!(state.get("rollouts/r2").unwrap().unwrap().mod_revision, r2);

    // Several puts and deletes: all at one revision, or none.
    let many = |check| Commit {
        checks: vec![("rollouts/r1".into(), Expect::ModRevision(check))],
        puts: vec![
            put("rollouts/a", b"a"),
            put("rollouts/b", b"b"),
            put("nodes/n1", b"n"),
        ],
        deletes: vec!["rollouts/r1".into(), "rollouts/r2".into()],
        ..Commit::default()
    };
    assert_eq!(state.commit(&many(r1)).unwrap(), Outcome::Conflict);
    assert_eq!(state.get("rollouts/a").unwrap(), None);
    assert!(state.get("rollouts/r2").unwrap().is_some());
    let r3 = committed(state.commit(&many(r2)).unwrap());
    let rollouts = state.list("rollouts/").unwrap();
    let keys: Vec<(&str, i64)> = rollouts
        .iter()
        .map(|e| (e.key.as_str(), e.mod_revision))
        .collect();
    assert_eq!(keys, [("rollouts/a", r3), ("rollouts/b", r3)]);
    let all: Vec<String> = state.list("").unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(all, ["nodes/n1", "rollouts/a", "rollouts/b"]);
    assert_eq!(state.list("none/").unwrap(), []);

    // 2,500 keys of 500 bytes (three pages), listed while a writer keeps changing the first
    // and the last together: every listing is one revision, so they always agree.
    let value = vec![b'v'; 500];
    for chunk in (0..2500).collect::<Vec<_>>().chunks(100) {
        let puts = chunk
            .iter()
            .map(|i| put(&format!("big/{i:04}"), &value))
            .collect();
        committed(
            state
                .commit(&Commit {
                    puts,
                    ..Commit::default()
                })
                .unwrap(),
        );
    }
    let both = |n: u64| Commit {
        puts: vec![
            put("big/0000", n.to_string().as_bytes()),
            put("big/2499", n.to_string().as_bytes()),
        ],
        ..Commit::default()
    };
    committed(state.commit(&both(0)).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (state, done) = (state.clone(), done.clone());
        thread::spawn(move || {
            let mut n = 0;
            while !done.load(Ordering::Relaxed) {
                n += 1;
                committed(state.commit(&both(n)).unwrap());
            }
            n
        })
    };
    for _ in 0..4 {
        let listed = state.list("big/").unwrap();
        assert_eq!(listed.len(), 2500);
        assert!(listed.windows(2).all(|w| w[0].key < w[1].key), "not sorted");
        assert_eq!(listed[1].key, "big/0001");
        let (first, last) = (&listed[0], &listed[2499]);
        assert_eq!(
            (&first.value, first.mod_revision),
            (&last.value, last.mod_revision),
            "pages read at different revisions"
        );
    }
    done.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 1, "the writer did not overlap the listings");
}

#[test]
fn one_leader_at_a_time_and_a_resigned_fence_is_deposed() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let (a, b) = (connect(&cluster), connect(&cluster));
    assert_eq!(a.leader("leader").unwrap(), None);
    let leader_a = elect(&a, "a", Duration::from_secs(5));
    assert!(!leader_a.is_lost());
    assert_eq!(b.leader("leader").unwrap().as_deref(), Some("a"));
    let fence_a = leader_a.fence();
    assert!(
        fence_a.key().starts_with("/slate/operator/leader/"),
        "{fence_a:?}"
    );
    committed(a.commit(&fenced(&fence_a, "decision", b"a1")).unwrap());

    let campaign_b = Campaign::start(&b, "b", Duration::from_secs(5));
    campaign_b.assert_waiting(Duration::from_millis(1500));
    // Both candidates' keys are there, A's the oldest.
    let candidates = a.list("leader/").unwrap();
    assert_eq!(candidates.len(), 2, "{candidates:?}");
    committed(a.commit(&fenced(&fence_a, "decision", b"a2")).unwrap());

    let resigned = Instant::now();
    leader_a.resign().unwrap();
    let (leader_b, at) = campaign_b.elected(Duration::from_secs(5));
    assert!(
        at - resigned < Duration::from_secs(2),
        "{:?}",
        at - resigned
    );
    assert_eq!(a.leader("leader").unwrap().as_deref(), Some("b"));

    // A's fence is refused, before any check; B's works and its checks still count.
    assert_eq!(
        a.commit(&fenced(&fence_a, "decision", b"a3")).unwrap(),
        Outcome::Deposed
    );
    let read = b.get("decision").unwrap().unwrap();
    assert_eq!(read.value, b"a2");
    let mut stale = fenced(&fence_a, "decision", b"a3");
    stale.checks = vec![("decision".into(), Expect::Absent)];
    assert_eq!(a.commit(&stale).unwrap(), Outcome::Deposed);
    stale.fence = Some(leader_b.fence());
    assert_eq!(b.commit(&stale).unwrap(), Outcome::Conflict);
    stale.checks = vec![("decision".into(), Expect::ModRevision(read.mod_revision))];
    committed(b.commit(&stale).unwrap());
    assert!(leader_b.fence().revision() > fence_a.revision());

    // Dropping a leadership gives it up too.
    drop(leader_b);
    assert_eq!(a.leader("leader").unwrap(), None);
    assert_eq!(a.list("leader/").unwrap(), []);
}

#[test]
fn an_expired_lease_is_lost_before_the_next_leader_is_elected() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let (a, b) = (connect(&cluster), connect(&cluster));
    let ttl = Duration::from_secs(2);
    let leader_a = elect(&a, "a", ttl);
    let campaign_b = Campaign::start(&b, "b", ttl);
    // Kept alive well past its ttl.
    campaign_b.assert_waiting(Duration::from_secs(3));
    assert!(!leader_a.is_lost());

    leader_a.pause_keepalive_for_test();
    let paused = Instant::now();
    while !leader_a.is_lost() {
        assert!(
            paused.elapsed() < ttl + Duration::from_millis(200),
            "not lost"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let (leader_b, at) = campaign_b.elected(Duration::from_secs(5));
    assert!(at - paused < Duration::from_secs(4), "{:?}", at - paused);
    assert!(leader_a.is_lost());
    assert!(!leader_b.is_lost());
    assert_eq!(b.leader("leader").unwrap().as_deref(), Some("b"));
    assert_eq!(
        a.commit(&fenced(&leader_a.fence(), "decision", b"a"))
            .unwrap(),
        Outcome::Deposed
    );
    assert_eq!(a.get("decision").unwrap(), None);
    committed(
        b.commit(&fenced(&leader_b.fence(), "decision", b"b"))
            .unwrap(),
    );
    // Dropping the lost leadership takes nothing from the new one.
    drop(leader_a);
    assert_eq!(a.leader("leader").unwrap().as_deref(), Some("b"));
}

#[test]
fn commits_and_campaigns_survive_the_etcd_leader_being_killed() {
    let _serial = one_at_a_time();
    let Some(mut cluster) = three_members() else {
        return;
    };
    let (a, b) = (connect(&cluster), connect(&cluster));
    let leader_a = elect(&a, "a", Duration::from_secs(5));
    let fence = leader_a.fence();
    committed(a.commit(&fenced(&fence, "step", b"0")).unwrap());
    // B waits (on some member) through the kill.
    let campaign_b = Campaign::start(&b, "b", Duration::from_secs(5));
    campaign_b.assert_waiting(Duration::from_millis(500));

    let victim = cluster.leader().unwrap();
    cluster.kill(victim);
    let killed = Instant::now();
    let mut last = a.get("step").unwrap().unwrap();
    for i in 1..=5 {
        let step = Commit {
            fence: Some(fence.clone()),
            checks: vec![("step".into(), Expect::ModRevision(last.mod_revision))],
            puts: vec![put("step", i.to_string().as_bytes())],
            ..Commit::default()
        };
        let call = Instant::now();
        committed(a.commit(&step).unwrap());
        assert!(call.elapsed() < RETRY_BUDGET, "{:?}", call.elapsed());
        last = a.get("step").unwrap().unwrap();
        assert_eq!(last.value, i.to_string().as_bytes());
    }
    assert!(killed.elapsed() < RETRY_BUDGET + Duration::from_secs(2));
    assert!(!leader_a.is_lost(), "the lease lapsed over the kill");
    campaign_b.assert_waiting(Duration::from_millis(200));

    let resigned = Instant::now();
    leader_a.resign().unwrap();
    let (leader_b, at) = campaign_b.elected(RETRY_BUDGET);
    assert!(
        at - resigned < Duration::from_secs(2),
        "{:?}",
        at - resigned
    );
    assert_eq!(b.leader("leader").unwrap().as_deref(), Some("b"));
    assert_eq!(
        a.commit(&fenced(&fence, "step", b"x")).unwrap(),
        Outcome::Deposed
    );
    committed(b.commit(&fenced(&leader_b.fence(), "step", b"b")).unwrap());

    // A new campaign on the two members left.
    leader_b.resign().unwrap();
    let start = Instant::now();
    let leader_a = elect(&a, "a again", Duration::from_secs(5));
    assert!(start.elapsed() < RETRY_BUDGET, "{:?}", start.elapsed());
    committed(a.commit(&fenced(&leader_a.fence(), "step", b"a")).unwrap());
}

#[test]
fn a_stopped_campaign_answers_none_and_leaves_no_candidate() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let (a, b) = (connect(&cluster), connect(&cluster));
    let leader_a = elect(&a, "a", Duration::from_secs(5));
    let campaign_b = Campaign::start(&b, "b", Duration::from_secs(5));
    campaign_b.assert_waiting(Duration::from_secs(1));
    assert_eq!(a.list("leader/").unwrap().len(), 2, "B is not a candidate");

    campaign_b.stop.store(true, Ordering::Relaxed);
    let stopped = Instant::now();
    let (won, at) = campaign_b.answer(Duration::from_secs(3));
    assert!(won.is_none(), "{won:?}");
    assert!(at - stopped < Duration::from_secs(1), "{:?}", at - stopped);
    let candidates: Vec<String> = a
        .list("leader/")
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(
        candidates,
        [leader_a.fence().key().strip_prefix(a.prefix()).unwrap()]
    );

    // A resigning afterwards leaves nobody leading.
    leader_a.resign().unwrap();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(b.leader("leader").unwrap(), None);

    // A campaign stopped before it starts does nothing.
    let stop = AtomicBool::new(true);
    assert!(b
        .campaign("leader", "b", Duration::from_secs(5), &stop)
        .unwrap()
        .is_none());
    assert_eq!(b.list("leader/").unwrap(), []);
}

#[test]
fn the_event_log_is_read_from_its_end_and_pruned_by_age_under_the_fence() {
    use slate_operator::state::{self, event_key};
    use slate_rollout::{Event, EventKind};
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let state = connect(&cluster);
    let event = |at: u64, node: &str| Event {
        at,
        group: "web".into(),
        rollout: 1,
        node: Some(node.into()),
        kind: EventKind::Started,
        detail: String::new(),
    };
    // Three batches written at 1 s, 2 s and 3 s (ms in the key), the middle one of two events.
    for (ms, batch) in [
        (1_000, vec![event(1, "n1")]),
        (2_000, vec![event(2, "n2"), event(2, "n3")]),
        (3_000, vec![event(3, "n4")]),
    ] {
        let value = serde_json::to_vec(&batch).unwrap();
        committed(
            state
                .commit(&Commit {
                    puts: vec![put(&event_key(ms), &value)],
                    ..Commit::default()
                })
                .unwrap(),
        );
    }
    // Another prefix that sorts after `events/` must never be read or pruned as events.
    let policies = Commit {
        puts: vec![put("policies", b"[]")],
        ..Commit::default()
    };
    committed(state.commit(&policies).unwrap());
    let nodes =
        |events: Vec<Event>| -> Vec<String> { events.into_iter().filter_map(|e| e.node).collect() };
    assert_eq!(nodes(state::events(&state, 1).unwrap()), ["n4"]);
    assert_eq!(nodes(state::events(&state, 2).unwrap()), ["n3", "n4"]);
    assert_eq!(
        nodes(state::events(&state, 100).unwrap()),
        ["n1", "n2", "n3", "n4"]
    );
    assert_eq!(state.last("events/", 2).unwrap().len(), 2);

    // Pruning deletes what is older than the cut, under a standing fence only.
    let leadership = elect(&state, "a", Duration::from_secs(5));
    let fence = leadership.fence();
    committed(state::prune_events(&state, &fence, 2_500).unwrap());
    assert_eq!(nodes(state::events(&state, 100).unwrap()), ["n4"]);
    assert!(state.get("policies").unwrap().is_some());
    leadership.resign().unwrap();
    let outcome = state::prune_events(&state, &fence, 10_000).unwrap();
    assert_eq!(outcome, Outcome::Deposed);
    assert_eq!(nodes(state::events(&state, 100).unwrap()), ["n4"]);
}
