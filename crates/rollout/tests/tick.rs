//! The leader's tick over a small simulated world: waves, soak, limits, windows, rate,
//! quorum, failure budget, yank, resume, and a failover that resumes from the stored value.

mod common;

use common::{World, MONDAY};
use slate_machine_config::minute_of_week;
use slate_rollout::{resume, EventKind, RolloutState, Step};

const WAVES: &str = r#"
[[policy]]
name = "fleet"
max_unavailable = "10%"
waves = [{ percent = 1, soak = "60s" }, { percent = 10, soak = "60s" }, { percent = 50 }, { percent = 100 }]
failure_budget = 3
"#;

fn started(w: &World) -> Vec<String> {
    w.events
        .iter()
        .filter(|e| e.kind == EventKind::Started)
        .filter_map(|e| e.node.clone())
        .collect()
}

#[test]
fn the_test_clock_starts_on_a_monday() {
    assert_eq!(minute_of_week(MONDAY), 0);
}

#[test]
fn waves_start_with_the_canaries_and_wait_for_their_soak() {
    let mut w = World::new(WAVES, &["1", "2"]);
    w.add_group("web", 200, "1");
    let d = w.tick();
    // 1 % of 200 = 2 canaries, though 10 % (20) may be unavailable.
    assert_eq!(d.orders.len(), 2, "{:?}", d.waiting.values().next());
    assert!(d
        .orders
        .iter()
        .all(|o| o.image == format!("registry.example/slate:2@sha256:{:064}", 0)));
    assert!(d
        .waiting
        .values()
        .any(|r| r.contains("in wave 2, wave 1 has not finished")));
    // They upgrade (2 ticks), commit, soak 60 s: the second wave waits for all of it.
    w.advance(10);
    w.tick();
    w.advance(10);
    w.tick();
    assert_eq!(started(&w).len(), 2);
    let r = &w.rollouts["web"];
    assert!(r
        .nodes
        .values()
        .filter(|p| p.started.is_some())
        .all(|p| matches!(p.step, Step::Soaking { .. })));
    w.advance(30);
    w.tick();
    assert_eq!(started(&w).len(), 2, "soak not over");
    w.advance(40);
    w.tick();
    // Wave 2 is 10 % of 200 = 20 nodes, 18 more; the limit (20 unavailable) allows them all.
    assert_eq!(started(&w).len(), 20);
    w.run(60);
    assert_eq!(w.versions("web").get("2"), Some(&200));
    assert!(matches!(
        w.rollouts["web"].state,
        RolloutState::Completed { .. }
    ));
    assert_eq!(w.accepted.len(), 200, "no node asked twice");
}

#[test]
fn at_most_the_limit_upgrades_at_once_in_every_tick() {
    let mut w = World::new(
        "[[policy]]\nname = \"p\"\nmax_unavailable = \"3\"\n",
        &["1", "2"],
    );
    w.add_group("db", 20, "1");
    w.upgrade_ticks = 3;
    for _ in 0..40 {
        w.tick();
        assert!(w.in_flight("db") <= 3, "{}", w.in_flight("db"));
        w.advance(10);
    }
    assert_eq!(w.versions("db").get("2"), Some(&20));
}

#[test]
fn a_percentage_allows_at_least_one_node() {
    let mut w = World::new(
        "[[policy]]\nname = \"p\"\nmax_unavailable = \"10%\"\n",
        &["1", "2"],
    );
    w.add_group("small", 5, "1");
    assert_eq!(w.tick().orders.len(), 1);
}

#[test]
fn three_failed_canaries_pause_the_rollout_and_nothing_else_is_touched() {
    let policy = r#"
[[policy]]
name = "fleet"
max_unavailable = "5"
waves = [{ percent = 3, soak = "60s" }, { percent = 100 }]
failure_budget = 3
"#;
    let mut w = World::new(policy, &["1", "2", "3"]);
    w.add_group("web", 100, "2");
    w.broken = vec!["3".into()];
    w.run(10);
    let r = &w.rollouts["web"];
    let RolloutState::Paused { reason, .. } = &r.state else {
        panic!("{:?}", r.state)
    };
    assert!(reason.contains("3 of its nodes failed on 3"), "{reason}");
    assert_eq!(w.accepted.len(), 3, "only the canaries were asked");
    assert_eq!(w.versions("web").get("2"), Some(&100));
    // Paused: time passes, nothing starts.
    w.run(20);
    assert_eq!(w.accepted.len(), 3);
    // v3 is yanked and v4 published: resume ends this rollout and the next tick starts v4.
    w.index.yank("3", "breaks health checks").unwrap();
    w.index.publish(common::release("4")).unwrap();
    let mut r = w.rollouts["web"].clone();
    let event = resume(&mut r, &w.index, w.now).unwrap();
    assert_eq!(event.kind, EventKind::Aborted);
    w.rollouts.insert("web".into(), r);
    w.broken.clear();
    w.run(80);
    assert_eq!(w.versions("web").get("4"), Some(&100));
    assert_eq!(w.rollouts["web"].id, 2);
    let per_node = w.accepted.iter().filter(|(_, t)| t == "4").count();
    assert_eq!(per_node, 100);
}

#[test]
fn resume_accepts_the_failures_so_far() {
    let policy = "[[policy]]\nname = \"p\"\nmax_unavailable = \"1\"\nfailure_budget = 1\n";
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("g", 3, "1");
    w.broken = vec!["2".into()];
    w.run(5);
    assert!(matches!(w.rollouts["g"].state, RolloutState::Paused { .. }));
    assert_eq!(w.accepted.len(), 1);
    w.broken.clear();
    let mut r = w.rollouts["g"].clone();
    assert_eq!(
        resume(&mut r, &w.index, w.now).unwrap().kind,
        EventKind::Resumed
    );
    w.rollouts.insert("g".into(), r);
    w.run(10);
    // The failed node is not asked again in this rollout; the other two move.
    assert_eq!(w.versions("g").get("2"), Some(&2));
    assert!(matches!(
        w.rollouts["g"].state,
        RolloutState::Completed { .. }
    ));
}

#[test]
fn a_window_that_wraps_into_monday_opens_at_night_only() {
    let policy = r#"
[[policy]]
name = "nights"
windows = [{ days = ["sun"], start = "22:00", length = "4h" }]
"#;
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("g", 2, "1");
    w.now = MONDAY + 3 * 3600; // Monday 03:00: closed
    let d = w.tick();
    assert!(d.orders.is_empty());
    assert!(d
        .waiting
        .values()
        .all(|r| r.contains("outside its maintenance windows")));
    w.now = MONDAY + 3600; // Monday 01:00, inside Sunday 22:00 + 4 h
    w.advance(0);
    assert_eq!(w.tick().orders.len(), 2);
}

#[test]
fn a_rate_limit_holds_across_a_failover_and_across_rollouts() {
    let policy = "[[policy]]\nname = \"slow\"\nrate = \"2/hour\"\n";
    let mut w = World::new(policy, &["1", "2", "3"]);
    w.add_group("g", 6, "1");
    w.run(10);
    assert_eq!(w.accepted.len(), 2);
    // A new leader: it has only what was stored (the JSON round trip in World::tick).
    let stored = serde_json::to_string(&w.rollouts).unwrap();
    w.rollouts = serde_json::from_str(&stored).unwrap();
    w.run(10);
    assert_eq!(w.accepted.len(), 2, "still within the hour");
    w.advance(3600);
    w.run(3);
    assert_eq!(w.accepted.len(), 4);
    // A newer release mid-way: the new rollout still counts the last hour's starts.
    w.index.publish(common::release("4")).unwrap();
    w.run(30);
    let recent: Vec<_> = w.accepted.iter().skip(4).collect();
    assert!(recent.len() <= 2, "{recent:?}");
}

#[test]
fn a_quorum_group_never_loses_its_majority() {
    let policy = "[[policy]]\nname = \"etcd\"\ngroups = [\"etcd\"]\nquorum = true\nmax_unavailable = \"3\"\n";
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("etcd", 3, "1");
    w.upgrade_ticks = 3;
    for _ in 0..20 {
        w.tick();
        assert!(w.in_flight("etcd") <= 1, "3 members: one at a time");
        w.advance(10);
    }
    assert_eq!(w.versions("etcd").get("2"), Some(&3));
    // 5 members, one unhealthy: one more may go down (3 healthy left), not two.
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("etcd", 5, "1");
    w.inventory.get_mut("etcd-0000").unwrap().report.healthy = false;
    let d = w.tick();
    assert_eq!(d.orders.len(), 1, "{:?}", d.waiting);
    assert!(d.waiting.values().any(|r| r.contains("quorum")));
}

#[test]
fn every_applicable_policy_must_allow_a_step() {
    let policy = r#"
[[policy]]
name = "wide"
max_unavailable = "50%"
[[policy]]
name = "zone-a-closed"
labels = { zone = "a" }
windows = [{ days = ["sat"], start = "00:00", length = "1h" }]
"#;
    let mut w = World::new(policy, &["1", "2"]);
    for i in 0..4 {
        let mut n = common::node(&format!("n{i}"), "g", "1");
        n.labels
            .insert("zone".into(), if i < 2 { "a" } else { "b" }.into());
        w.add(n);
    }
    let d = w.tick();
    let ordered: Vec<_> = d.orders.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(ordered.len(), 2, "{ordered:?}");
    assert!(ordered.iter().all(|n| *n == "n2" || *n == "n3"));
}

#[test]
fn a_node_that_never_commits_fails_after_the_timeout_and_a_soak_failure_counts() {
    let policy = "[[policy]]\nname = \"p\"\nmax_unavailable = \"2\"\nupgrade_timeout = \"5m\"\nwaves = [{ percent = 50, soak = \"10m\" }, { percent = 100 }]\n";
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("g", 4, "1");
    w.upgrade_ticks = 1000; // never finishes
    w.tick();
    w.advance(301);
    w.tick();
    let failed = w
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Failed)
        .count();
    assert_eq!(failed, 2);
    assert!(w
        .events
        .iter()
        .any(|e| e.detail.contains("no healthy commit of 2 within 300 s")));
    // A soaking node that turns unhealthy fails.
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("g", 4, "1");
    w.run(3);
    let soaking: Vec<String> = w.rollouts["g"]
        .nodes
        .iter()
        .filter(|(_, p)| matches!(p.step, Step::Soaking { .. }))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(soaking.len(), 2);
    w.inventory.get_mut(&soaking[0]).unwrap().report.healthy = false;
    w.tick();
    assert!(matches!(
        w.rollouts["g"].nodes[&soaking[0]].step,
        Step::Failed { .. }
    ));
}

#[test]
fn an_unconfirmed_order_is_sent_again_only_to_a_node_that_provably_did_not_take_it() {
    let mut w = World::new(
        "[[policy]]\nname = \"p\"\nmax_unavailable = \"1\"\n",
        &["1", "2"],
    );
    w.add_group("g", 2, "1");
    // The leader stored the start and died before sending: no World::tick delivery.
    let d = slate_rollout::tick(&w.tick_input());
    let node = d.orders[0].node.clone();
    w.rollouts = d.rollouts.clone();
    w.advance(10);
    assert!(
        slate_rollout::tick(&w.tick_input()).orders.is_empty(),
        "too early"
    );
    w.advance(30);
    let again = slate_rollout::tick(&w.tick_input());
    assert_eq!(again.orders.len(), 1);
    assert_eq!(again.orders[0].node, node);
    // A busy node (it did take it) is not asked again.
    w.inventory.get_mut(&node).unwrap().report.busy = true;
    assert!(slate_rollout::tick(&w.tick_input()).orders.is_empty());
}

#[test]
fn a_yanked_target_ends_a_running_rollout_and_the_next_release_follows() {
    let mut w = World::new(
        "[[policy]]\nname = \"p\"\nmax_unavailable = \"1\"\n",
        &["1", "2"],
    );
    w.add_group("g", 5, "1");
    w.upgrade_ticks = 5;
    w.run(2);
    let asked_before_yank = w.accepted.len();
    assert!(asked_before_yank >= 1);
    w.index.yank("2", "bad").unwrap();
    w.index.publish(common::release("3")).unwrap();
    w.run(1);
    assert!(
        matches!(&w.rollouts["g"].state, RolloutState::Aborted { reason, .. } if reason.contains("yanked"))
    );
    w.run(60);
    assert!(
        w.accepted[asked_before_yank..]
            .iter()
            .all(|(_, t)| t == "3"),
        "nothing asked for the yanked version: {:?}",
        w.accepted
    );
    assert_eq!(w.versions("g").get("3"), Some(&5));
}

#[test]
fn the_plan_names_each_nodes_wave_and_why_it_waits() {
    let mut w = World::new(WAVES, &["1", "2"]);
    w.add_group("web", 100, "1");
    let rows = slate_rollout::plan(&w.tick_input());
    assert_eq!(rows.len(), 100);
    let canaries: Vec<_> = rows.iter().filter(|r| r.state == "starts now").collect();
    assert_eq!(canaries.len(), 1);
    assert_eq!(canaries[0].wave, Some(1));
    let last = rows.iter().rfind(|r| r.wave == Some(4)).unwrap();
    assert_eq!(last.state, "waiting");
    assert!(
        last.not_before.unwrap() >= w.now + 120,
        "two soaks of 60 s before wave 4"
    );
    assert!(w.rollouts.is_empty(), "the plan stores nothing");
}

#[test]
fn a_probe_gates_the_soak_and_a_failed_probe_fails_the_node() {
    let policy = r#"
[[policy]]
name = "p"
max_unavailable = "1"
probe = "http://{host}:8080/healthz"
waves = [{ percent = 50, soak = "30s" }, { percent = 100 }]
"#;
    let mut w = World::new(policy, &["1", "2"]);
    w.add_group("g", 2, "1");
    w.run(3);
    let canary = w.accepted[0].0.clone();
    assert!(matches!(
        w.rollouts["g"].nodes[&canary].step,
        Step::Soaking { .. }
    ));
    // The soak is over, but no probe has answered yet: still soaking.
    w.advance(60);
    w.tick();
    assert!(matches!(
        w.rollouts["g"].nodes[&canary].step,
        Step::Soaking { .. }
    ));
    w.probes.insert(canary.clone(), true);
    w.tick();
    assert!(matches!(
        w.rollouts["g"].nodes[&canary].step,
        Step::Done { .. }
    ));
    // The second node's probe fails while it soaks.
    w.run(3);
    let second = w.accepted[1].0.clone();
    w.probes.insert(second.clone(), false);
    w.tick();
    let Step::Failed { reason, .. } = &w.rollouts["g"].nodes[&second].step else {
        panic!("{:?}", w.rollouts["g"].nodes[&second].step)
    };
    assert!(reason.contains("probe failed"), "{reason}");
}
