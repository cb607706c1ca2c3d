//! Simulated upgrades through the real node API: commit, lock, revert, the ground-truth log
//! and its concurrency tracker.

mod common;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use common::{admin, certs, image, quick, start, wait_for};
use slate_api::{ClientError, EventKind, Failure, Stage, UpgradeRequest};
use slate_fleet_sim::{Behaviour, SimEvent, SimEventKind, REVERT_REASON};

fn kinds_of(events: &[SimEvent], node: &str) -> Vec<SimEventKind> {
    events
        .iter()
        .filter(|e| e.node == node)
        .map(|e| e.kind.clone())
        .collect()
}

#[test]
fn fifty_nodes_in_two_groups_commit_and_report_busy_then_committed() {
    let certs = certs();
    let (fleet, recorder) = start(certs.path(), &[("a", 30), ("b", 20)], quick());
    assert_eq!(fleet.len(), 50);
    assert_eq!(fleet.versions(), BTreeMap::from([("1.0.0".to_owned(), 50)]));
    let ids = fleet.node_ids();
    assert_eq!(ids[0], "a-00000");
    assert_eq!(ids[49], "b-00019");

    for id in &ids {
        admin(&fleet, certs.path(), id)
            .upgrade(&UpgradeRequest::new(image("1.1.0")))
            .unwrap();
    }
    assert!(
        fleet.wait_idle(Duration::from_secs(20)),
        "upgrades did not finish"
    );
    assert_eq!(fleet.versions(), BTreeMap::from([("1.1.0".to_owned(), 50)]));
    assert!(fleet.api_errors().is_empty(), "{:?}", fleet.api_errors());

    let events = fleet.events();
    assert!(events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    for id in &ids {
        let mine: Vec<&SimEvent> = events.iter().filter(|e| &e.node == id).collect();
        assert_eq!(mine.len(), 2, "{id}: {mine:?}");
        assert_eq!(
            mine[0].kind,
            SimEventKind::Accepted {
                from: "1.0.0".into(),
                to: "1.1.0".into(),
                replace: false,
            }
        );
        assert_eq!(
            mine[1].kind,
            SimEventKind::Committed {
                version: "1.1.0".into()
            }
        );
        // Upgrade (300 ms) plus reboot (200 ms), no jitter.
        assert!(mine[1].at_ms - mine[0].at_ms >= 500, "{mine:?}");
        assert_eq!(mine[0].group, &id[..1]);
    }
    let per_node = fleet.upgrades_per_node();
    assert_eq!(per_node.len(), 50);
    assert!(per_node.values().all(|v| v == &["1.1.0".to_owned()]));

    // The committed report is queued once the API is back: wait for the last ones to land.
    assert!(wait_for(Duration::from_secs(5), || ids
        .iter()
        .all(|id| recorder.of(id).iter().any(|r| r.version == "1.1.0"))));
    for id in &ids {
        let reports = recorder.of(id);
        let busy = reports
            .iter()
            .position(|r| r.busy && r.version == "1.0.0")
            .unwrap_or_else(|| panic!("{id}: no busy report: {reports:?}"));
        let done = reports
            .iter()
            .position(|r| !r.busy && r.committed && r.healthy && r.version == "1.1.0")
            .unwrap_or_else(|| panic!("{id}: no committed report: {reports:?}"));
        assert!(busy < done, "{id}: {reports:?}");
        // Stamped strictly increasing when taken (a periodic report may overtake a state
        // change's in delivery: the stamp says which is newer).
        assert!(reports[busy].sent_at_ms < reports[done].sent_at_ms);
        let stamps: std::collections::BTreeSet<u64> =
            reports.iter().map(|r| r.sent_at_ms).collect();
        assert_eq!(stamps.len(), reports.len(), "{id}: {reports:?}");
        assert_eq!(reports[done].endpoint, fleet.node_endpoint(id).unwrap());
        assert_eq!(reports[done].channel, "stable");
        assert_eq!(reports[done].group, &id[..1]);
        assert!(reports[done].last_failure.is_none());
    }

    let status = admin(&fleet, certs.path(), "b-00007").status().unwrap();
    assert_eq!(status.version, "1.1.0");
    assert_eq!(status.stage, Stage::Running);
    assert_eq!(status.running_sequence, None);
    assert_eq!(status.node_name.as_deref(), Some("b-00007"));
    assert_eq!(fleet.report_stats().failed, 0);
}

#[test]
fn a_busy_node_answers_locked_and_refusals_are_logged() {
    let certs = certs();
    let (fleet, _recorder) = start(certs.path(), &[("a", 2)], quick());
    let client = admin(&fleet, certs.path(), "a-00000");
    client
        .upgrade(&UpgradeRequest::new(image("1.1.0")))
        .unwrap();
    let status = client.status().unwrap();
    assert_eq!(status.stage, Stage::Upgrading);
    assert_eq!(status.running_sequence.as_deref(), Some("Upgrade"));
    match client.upgrade(&UpgradeRequest::new(image("1.2.0"))) {
        Err(ClientError::Locked(_)) => {}
        other => panic!("expected Locked, got {other:?}"),
    }

    let other = admin(&fleet, certs.path(), "a-00001");
    let not_newer = other.upgrade(&UpgradeRequest::new(image("1.0.0")));
    assert!(
        matches!(not_newer, Err(ClientError::InvalidArgument(_))),
        "{not_newer:?}"
    );
    let no_tag = other.upgrade(&UpgradeRequest::new(
        "registry.example:5000/slate/installer",
    ));
    assert!(
        matches!(no_tag, Err(ClientError::InvalidArgument(_))),
        "{no_tag:?}"
    );
    let mut downgrade = UpgradeRequest::new(image("0.9.0"));
    downgrade.allow_downgrade = true;
    other.upgrade(&downgrade).unwrap();

    assert!(fleet.wait_idle(Duration::from_secs(10)));
    let events = fleet.events();
    let first = kinds_of(&events, "a-00000");
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(matches!(&first[0], SimEventKind::Accepted { to, .. } if to == "1.1.0"));
    assert!(
        matches!(&first[1], SimEventKind::Refused { reason } if reason.starts_with("locked")),
        "{first:?}"
    );
    assert_eq!(
        first[2],
        SimEventKind::Committed {
            version: "1.1.0".into()
        }
    );
    let second = kinds_of(&events, "a-00001");
    assert_eq!(second.len(), 4, "{second:?}");
    assert!(matches!(&second[0], SimEventKind::Refused { reason } if reason.contains("not newer")));
    assert!(
        matches!(&second[1], SimEventKind::Refused { reason } if reason.contains("no version"))
    );
    assert_eq!(
        second[2],
        SimEventKind::Accepted {
            from: "1.0.0".into(),
            to: "0.9.0".into(),
            replace: false,
        }
    );
    // Refusals are not upgrades.
    assert_eq!(
        fleet.upgrades_per_node(),
        BTreeMap::from([
            ("a-00000".to_owned(), vec!["1.1.0".to_owned()]),
            ("a-00001".to_owned(), vec!["0.9.0".to_owned()]),
        ])
    );
}

#[test]
fn a_failing_version_reverts_with_last_failure_and_behaviour_changes_at_runtime() {
    let certs = certs();
    let behaviour = Behaviour {
        fail_versions: ["2.0.0".to_owned()].into(),
        ..quick()
    };
    let (fleet, recorder) = start(certs.path(), &[("a", 3)], behaviour);
    admin(&fleet, certs.path(), "a-00000")
        .upgrade(&UpgradeRequest::new(image("2.0.0")))
        .unwrap();
    assert!(fleet.wait_idle(Duration::from_secs(10)));
    let failure = Failure {
        version: "2.0.0".into(),
        reason: REVERT_REASON.into(),
    };
    let status = admin(&fleet, certs.path(), "a-00000").status().unwrap();
    assert_eq!(status.version, "1.0.0");
    assert_eq!(status.stage, Stage::Running);
    assert_eq!(status.last_failure.as_ref(), Some(&failure));
    assert_eq!(
        kinds_of(&fleet.events(), "a-00000")[1],
        SimEventKind::Reverted {
            from_target: "2.0.0".into(),
            back_to: "1.0.0".into()
        }
    );
    assert!(wait_for(Duration::from_secs(5), || recorder
        .of("a-00000")
        .iter()
        .any(|r| !r.busy
            && r.committed
            && r.version == "1.0.0"
            && r.last_failure.is_some())));
    let reported = recorder
        .of("a-00000")
        .into_iter()
        .find_map(|r| r.last_failure)
        .unwrap();
    assert_eq!(
        (reported.version.as_str(), reported.reason.as_str()),
        ("2.0.0", REVERT_REASON)
    );

    // Make 1.1.0 bad while the fleet runs.
    let mut b = fleet.behaviour();
    b.fail_versions.insert("1.1.0".into());
    fleet.set_behaviour(b);
    admin(&fleet, certs.path(), "a-00001")
        .upgrade(&UpgradeRequest::new(image("1.1.0")))
        .unwrap();
    assert!(fleet.wait_idle(Duration::from_secs(10)));
    assert!(matches!(
        &kinds_of(&fleet.events(), "a-00001")[1],
        SimEventKind::Reverted { from_target, .. } if from_target == "1.1.0"
    ));
    assert_eq!(fleet.versions(), BTreeMap::from([("1.0.0".to_owned(), 3)]));
}

#[test]
fn max_in_flight_is_exact_when_k_upgrades_start_at_once() {
    let certs = certs();
    let behaviour = Behaviour {
        upgrade_time: Duration::from_secs(2),
        ..quick()
    };
    let (fleet, _recorder) = start(certs.path(), &[("a", 12), ("b", 3)], behaviour);
    assert_eq!(fleet.max_in_flight("a"), (0, 0));
    let k = 7;
    let begun = Instant::now();
    for i in 0..k {
        admin(&fleet, certs.path(), &format!("a-{i:05}"))
            .upgrade(&UpgradeRequest::new(image("1.1.0")))
            .unwrap();
    }
    assert!(
        begun.elapsed() < Duration::from_secs(2),
        "too slow to overlap"
    );
    assert_eq!(fleet.in_flight("a"), k);
    assert!(fleet.wait_idle(Duration::from_secs(10)));
    assert_eq!(fleet.in_flight("a"), 0);
    let events = fleet.events();
    let kth_accepted = events
        .iter()
        .filter(|e| matches!(e.kind, SimEventKind::Accepted { .. }))
        .nth(k - 1)
        .unwrap();
    assert_eq!(fleet.max_in_flight("a"), (k, kth_accepted.at_ms));

    // Fewer at once later does not move the peak; another group has its own count.
    for i in k..k + 3 {
        admin(&fleet, certs.path(), &format!("a-{i:05}"))
            .upgrade(&UpgradeRequest::new(image("1.1.0")))
            .unwrap();
    }
    admin(&fleet, certs.path(), "b-00000")
        .upgrade(&UpgradeRequest::new(image("1.1.0")))
        .unwrap();
    assert!(fleet.wait_idle(Duration::from_secs(10)));
    assert_eq!(fleet.max_in_flight("a"), (k, kth_accepted.at_ms));
    assert_eq!(fleet.max_in_flight("b").0, 1);
    assert_eq!(fleet.max_in_flight("nope"), (0, 0));
}

#[test]
fn a_rebooting_node_refuses_connections_then_comes_back_on_the_same_port() {
    let certs = certs();
    let behaviour = Behaviour {
        upgrade_time: Duration::from_millis(100),
        reboot_time: Duration::from_millis(1500),
        ..Behaviour::default()
    };
    let (fleet, _recorder) = start(certs.path(), &[("a", 1)], behaviour);
    let endpoint = fleet.node_endpoint("a-00000").unwrap();
    let client = admin(&fleet, certs.path(), "a-00000");
    client
        .upgrade(&UpgradeRequest::new(image("1.1.0")))
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    match client.status() {
        Err(ClientError::Connect { .. }) => {}
        other => panic!("a rebooting node answered: {other:?}"),
    }
    assert!(fleet.wait_idle(Duration::from_secs(10)));
    assert_eq!(fleet.node_endpoint("a-00000").unwrap(), endpoint);
    assert_eq!(client.status().unwrap().version, "1.1.0");
}

#[test]
fn events_stream_starts_with_the_current_stage_and_the_log_goes_to_a_file() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let mut spec = slate_fleet_sim::FleetSpec::new(certs.path()).group("a", 1, "stable", "1.0.0");
    spec.behaviour = quick();
    spec.events_file = Some(file.clone());
    let mut fleet =
        slate_fleet_sim::Fleet::start(spec, std::sync::Arc::new(common::Recorder::default()))
            .unwrap();
    let client = admin(&fleet, certs.path(), "a-00000");
    let mut seen = Vec::new();
    client
        .events(false, |e| {
            seen.push(e.kind);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(
        seen.first(),
        Some(&EventKind::Stage {
            stage: Stage::Running
        })
    );
    client
        .upgrade(&UpgradeRequest::new(image("1.1.0")))
        .unwrap();
    assert!(fleet.wait_idle(Duration::from_secs(10)));
    fleet.shutdown();
    let lines: Vec<SimEvent> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, fleet.events());
    assert_eq!(lines.len(), 2);
}

#[test]
fn outcomes_are_deterministic_per_seed() {
    let certs = certs();
    let run = |seed: u64| {
        let mut spec =
            slate_fleet_sim::FleetSpec::new(certs.path()).group("a", 16, "stable", "1.0.0");
        spec.behaviour = Behaviour {
            fail_probability: 0.5,
            jitter: Duration::from_millis(50),
            ..quick()
        };
        spec.seed = seed;
        let fleet =
            slate_fleet_sim::Fleet::start(spec, std::sync::Arc::new(common::Recorder::default()))
                .unwrap();
        for id in fleet.node_ids() {
            admin(&fleet, certs.path(), &id)
                .upgrade(&UpgradeRequest::new(image("1.1.0")))
                .unwrap();
        }
        assert!(fleet.wait_idle(Duration::from_secs(10)));
        let mut reverted: Vec<String> = fleet
            .events()
            .into_iter()
            .filter(|e| matches!(e.kind, SimEventKind::Reverted { .. }))
            .map(|e| e.node)
            .collect();
        reverted.sort();
        reverted
    };
    let first = run(7);
    assert_eq!(first, run(7));
    assert!(!first.is_empty() && first.len() < 16, "{first:?}");
    assert_ne!(first, run(8));
}
