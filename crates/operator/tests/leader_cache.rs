//! What a leader keeps between its ticks follows etcd, against a real three-member etcd
//! cluster on loopback: the policies are parsed again when they change (and a refused file
//! stays refused, not replaced by the last good one); a rollout edited in place for a commit
//! that did not happen is read again, one whose commit happened is held at that commit's
//! revision (a rollout begun in place included), and another replica's write is picked up. Run with `CI=true` to make a missing
//! etcd a failure.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use slate_operator::etcd::{Commit, EtcdState, Outcome, DEFAULT_PREFIX};
use slate_operator::state::rollout_value::Encoder;
use slate_operator::state::{self, PolicyCache, RolloutCache, WatchedRevisions, POLICIES};
use slate_rollout::{NodeProgress, Rollout, RolloutState, Step, Strategy};
use slate_testkit::etcd::{one_at_a_time, three_members};

fn policy(name: &str, unavailable: &str) -> String {
    format!("[[policy]]\nname = \"{name}\"\nmax_unavailable = \"{unavailable}\"\n")
}

fn rollout(group: &str) -> Rollout {
    let mut nodes = BTreeMap::new();
    nodes.insert(
        "n1".to_owned(),
        NodeProgress {
            from: Some("1".into()),
            started: Some(100),
            strategy: Strategy::InPlace,
            step: Step::Upgrading {
                issued: false,
                prior_failure: None,
            },
        },
    );
    Rollout {
        id: 1,
        group: group.into(),
        target: "2".into(),
        image: "registry.lab/slate/os:2@sha256:00".into(),
        created: 100,
        state: RolloutState::Running,
        nodes,
        recent_starts: vec![("n1".into(), 100)],
        acknowledged: Default::default(),
    }
}

fn committed(outcome: Outcome) -> i64 {
    match outcome {
        Outcome::Committed { revision } => revision,
        other => panic!("not committed: {other:?}"),
    }
}

fn issued(cache: &RolloutCache, group: &str) -> bool {
    let (r, _) = cache.get(group).expect("held");
    matches!(r.nodes["n1"].step, Step::Upgrading { issued: true, .. })
}

/// Waits until `watched` (if any) shows `key` at `revision` or later: what the leader's next
/// tick would see once the watch delivered another replica's write.
fn seen(watched: Option<&WatchedRevisions>, key: &str, revision: i64) {
    let Some(watched) = watched else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((policy, rollouts)) = watched.current() {
            let at = if key == POLICIES {
                policy
            } else {
                rollouts.get(key).copied().unwrap_or(0)
            };
            if at >= revision {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the watch never showed {key} at revision {revision}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn set_policies(state: &EtcdState, watched: Option<&WatchedRevisions>, text: &str) {
    state::set_policies(state, text).unwrap();
    let revision = state
        .get(POLICIES)
        .unwrap()
        .expect("just written")
        .mod_revision;
    seen(watched, POLICIES, revision);
}

#[test]
fn the_leaders_policy_and_rollout_caches_follow_etcd() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let state = EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap();
    follow_etcd(&state, None);
}

/// The same steps with the revisions from watches, as a leader has them: every refresh gives
/// what reading etcd gives, once the watch has delivered the write before it.
#[test]
fn the_caches_follow_etcd_through_watches_as_they_do_through_reads() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let state = EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap();
    let watched = WatchedRevisions::follow(&state).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while watched.current().is_none() {
        assert!(Instant::now() < deadline, "the watches never listed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(watched.current(), Some((0, BTreeMap::new())));
    follow_etcd(&state, Some(&watched));
}

fn follow_etcd(state: &EtcdState, watched: Option<&WatchedRevisions>) {
    let mut rollouts = RolloutCache::new();
    let mut policies = PolicyCache::default();
    let mut encoder = Encoder::new();

    // No policy file yet: an empty set.
    let set = state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert!(set.policies.is_empty());

    // Changed policies are seen by the next refresh, every time.
    set_policies(state, watched, &policy("a", "10%"));
    let set = state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(set.policies.len(), 1);
    assert_eq!(set.policies[0].name, "a");
    set_policies(state, watched, &policy("b", "10%"));
    let set = state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(set.policies[0].name, "b");
    // The same text written again is a new revision: still read right.
    set_policies(state, watched, &policy("b", "10%"));
    let set = state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(set.policies[0].name, "b");

    // A refused file is refused on every tick, not replaced by the last good one.
    let bad = Commit {
        puts: vec![(POLICIES.into(), b"[[policy]]\nname = 7\n".to_vec())],
        ..Commit::default()
    };
    let bad_at = committed(state.commit(&bad).unwrap());
    seen(watched, POLICIES, bad_at);
    for _ in 0..2 {
        let err = state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap_err();
        assert!(err.to_string().contains("policy file"), "{err}");
    }
    set_policies(state, watched, &policy("c", "5%"));
    let set = state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(set.policies[0].name, "c");

    // A rollout stored by another replica is read.
    let mut changed = BTreeMap::new();
    changed.insert("g".to_owned(), rollout("g"));
    let first =
        committed(state::commit_rollouts(state, None, &changed, &BTreeMap::new(), &[], 1).unwrap());
    seen(watched, "rollouts/g", first);
    state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(rollouts.get("g").map(|(_, rev)| rev), Some(first));
    assert!(!issued(&rollouts, "g"));

    // Edited for a commit that did not happen: read again from etcd, not kept.
    edit_issued(&mut rollouts, "g");
    assert!(issued(&rollouts, "g"));
    assert_eq!(rollouts.edited().count(), 1);
    rollouts.discard_edits();
    assert_eq!(rollouts.edited().count(), 0);
    state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert!(
        !issued(&rollouts, "g"),
        "a discarded edit must not outlive its tick"
    );
    assert_eq!(rollouts.get("g").map(|(_, rev)| rev), Some(first));

    // Edited and stored: held at the commit's revision, equal to what etcd holds.
    edit_issued(&mut rollouts, "g");
    let read_at = rollouts.revisions();
    let second = committed(
        state::commit_rollouts_of(state, None, rollouts.edited(), &read_at, &[], 2, None).unwrap(),
    );
    rollouts.edits_stored(second);
    if let Some(watched) = watched {
        watched.note_rollout("g", second);
    }
    assert_eq!(rollouts.edited().count(), 0);
    state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    let stored = state::rollouts(state).unwrap();
    assert_eq!(stored["g"].revision, second);
    assert_eq!(rollouts.get("g"), Some((&stored["g"].value, second)));
    assert!(issued(&rollouts, "g"));

    // Another replica's write (a pause) after it is picked up.
    let mut paused = stored["g"].value.clone();
    paused.state = RolloutState::Paused {
        reason: "by hand".into(),
        since: 3,
    };
    let mut changed = BTreeMap::new();
    changed.insert("g".to_owned(), paused.clone());
    let read_at = BTreeMap::from([("g".to_owned(), second)]);
    let third = committed(state::commit_rollouts(state, None, &changed, &read_at, &[], 3).unwrap());
    seen(watched, "rollouts/g", third);
    state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(rollouts.get("g"), Some((&paused, third)));
    // ...and an edit made before it, committed at the old revision, is refused.
    edit_issued(&mut rollouts, "g");
    let stale = BTreeMap::from([("g".to_owned(), second)]);
    let outcome =
        state::commit_rollouts_of(state, None, rollouts.edited(), &stale, &[], 4, None).unwrap();
    assert!(matches!(outcome, Outcome::Conflict), "{outcome:?}");
    rollouts.discard_edits();
    state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    assert_eq!(rollouts.get("g"), Some((&paused, third)));

    // A rollout begun in place (as `tick_in_place` does) and not stored is gone again...
    rollouts.rollouts_mut().insert("h".into(), rollout("h"));
    rollouts.mark_edited(["h".to_owned()]);
    rollouts.discard_edits();
    assert!(rollouts.get("h").is_none());
    assert!(!rollouts.rollouts().contains_key("h"));
    // ...and once stored, held at its commit's revision, as etcd holds it.
    rollouts.rollouts_mut().insert("h".into(), rollout("h"));
    rollouts.mark_edited(["h".to_owned()]);
    let read_at = rollouts.revisions();
    assert!(!read_at.contains_key("h"));
    let fourth = committed(
        state::commit_rollouts_of(
            state,
            None,
            rollouts.edited(),
            &read_at,
            &[],
            5,
            Some(&mut encoder),
        )
        .unwrap(),
    );
    rollouts.edits_stored(fourth);
    if let Some(watched) = watched {
        watched.note_rollout("h", fourth);
    }
    assert_eq!(rollouts.get("h"), Some((&rollout("h"), fourth)));
    state::refresh_state(state, watched, &mut rollouts, &mut policies).unwrap();
    let stored = state::rollouts(state).unwrap();
    assert_eq!(stored["h"].revision, fourth);
    assert_eq!(rollouts.get("h"), Some((&stored["h"].value, fourth)));
    assert_eq!(rollouts.get("g"), Some((&paused, third)));
}

fn edit_issued(cache: &mut RolloutCache, group: &str) {
    let r = cache.edit(group).expect("held");
    if let Step::Upgrading { issued, .. } = &mut r.nodes.get_mut("n1").unwrap().step {
        *issued = !*issued;
    }
}
