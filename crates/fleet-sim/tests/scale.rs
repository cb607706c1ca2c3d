//! 2,000 nodes in one process: all listen, all answer `status`, all heartbeat.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_api::{Client, Role, Stage};
use slate_fleet_sim::{Fleet, FleetSpec};

#[test]
fn two_thousand_nodes_start_answer_status_and_heartbeat() {
    let certs = common::certs();
    let spec = FleetSpec {
        heartbeat_interval: Duration::from_secs(1),
        ..FleetSpec::new(certs.path())
            .group("edge", 1500, "stable", "1.0.0")
            .group("core", 500, "beta", "1.0.0")
    };
    let recorder = Arc::new(common::Recorder::default());
    let begun = Instant::now();
    let fleet = Fleet::start(spec, recorder.clone()).unwrap();
    let started = begun.elapsed();
    assert_eq!(fleet.len(), 2000);

    let read = |name: &str| std::fs::read(certs.path().join(name)).unwrap();
    let (ca, cert, key) = (read("ca.crt"), read("reader.crt"), read("reader.key"));
    assert_eq!(slate_api::client_cert_file(Role::Reader), "reader.crt");
    let ids = fleet.node_ids();
    let next = AtomicUsize::new(0);
    let answered = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { break };
                let endpoint = fleet.node_endpoint(id).unwrap();
                // Each node's certificate names it (not the address).
                let status = Client::new(&endpoint, &ca, &cert, &key)
                    .unwrap()
                    .with_server_name(id)
                    .unwrap()
                    .status()
                    .unwrap_or_else(|e| panic!("{id} at {endpoint}: {e}"));
                assert_eq!(status.node_name.as_deref(), Some(id.as_str()));
                assert_eq!(status.stage, Stage::Running);
                answered.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(answered.load(Ordering::Relaxed), 2000);
    let queried = begun.elapsed();

    // Every node has reported at least once within about one interval of the start.
    let all_reported = common::wait_for(Duration::from_secs(3), || {
        let reports = recorder.reports.lock().unwrap();
        let ids: std::collections::BTreeSet<&str> = reports.iter().map(|r| r.id.as_str()).collect();
        ids.len() == 2000
    });
    assert!(all_reported);
    eprintln!(
        "2000 nodes: started in {started:?}, all answered status by {queried:?}, stats {:?}",
        fleet.report_stats()
    );
    assert!(
        begun.elapsed() < Duration::from_secs(30),
        "{:?}",
        begun.elapsed()
    );
}
