//! A group's rollout as numbers (the operator's metrics), followed through a simulated world.

mod common;

use common::World;
use slate_rollout::progress;

const WAVES: &str = r#"
[[policy]]
name = "fleet"
max_unavailable = "10%"
waves = [{ percent = 1, soak = "60s" }, { percent = 10, soak = "60s" }, { percent = 50 }, { percent = 100 }]
failure_budget = 3
"#;

#[test]
fn waves_counts_and_budget_follow_the_rollout() {
    let mut w = World::new(WAVES, &["1", "2"]);
    w.add_group("web", 200, "1");
    assert!(progress(&w.inventory, &w.policies, &w.rollouts).is_empty());
    w.tick();
    let p = &progress(&w.inventory, &w.policies, &w.rollouts)[0];
    assert_eq!(
        (p.group.as_str(), p.target.as_str(), p.state),
        ("web", "2", "running")
    );
    assert_eq!((p.wave, p.waves), (Some(1), 4));
    assert_eq!((p.done, p.in_flight, p.failed), (0, 2, 0));
    assert_eq!(p.failure_budget_left, Some(3));
    w.run(60);
    let p = &progress(&w.inventory, &w.policies, &w.rollouts)[0];
    assert_eq!(p.state, "completed");
    assert_eq!(
        (p.wave, p.done, p.in_flight, p.failed),
        (Some(4), 200, 0, 0)
    );
}

#[test]
fn failures_spend_the_budget() {
    let mut w = World::new(WAVES, &["1", "2"]);
    w.broken = vec!["2".into()];
    w.add_group("web", 200, "1");
    w.run(30);
    let p = &progress(&w.inventory, &w.policies, &w.rollouts)[0];
    // Both canaries revert: two of the three failures the budget allows are spent, and wave 2
    // opens (failures below the budget do not hold a wave back).
    assert!(p.failed >= 2, "{p:?}");
    assert_eq!(p.failure_budget_left, Some(3usize.saturating_sub(p.failed)));
    if p.failed >= 3 {
        assert_eq!(p.state, "paused");
    }
}
