//! Shared by the integration tests: certificates, a recording reporter, small waits.

#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slate_api::{Client, Role};
use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Reporter};
use slate_rollout::NodeReport;

/// Collects every report in arrival order.
#[derive(Debug, Default)]
pub struct Recorder {
    pub reports: Mutex<Vec<NodeReport>>,
}

impl Reporter for Recorder {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        self.reports.lock().unwrap().push(report.clone());
        Ok(())
    }
}

impl Recorder {
    pub fn of(&self, id: &str) -> Vec<NodeReport> {
        let reports = self.reports.lock().unwrap();
        reports.iter().filter(|r| r.id == id).cloned().collect()
    }
}

/// A certificate set whose node certificate names 127.0.0.1 (gen_certs always adds it).
pub fn certs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    slate_api::gen_certs(dir.path(), &[]).unwrap();
    dir
}

/// Fast upgrades: 300 ms to the reboot, 200 ms down.
pub fn quick() -> Behaviour {
    Behaviour {
        upgrade_time: Duration::from_millis(300),
        reboot_time: Duration::from_millis(200),
        ..Behaviour::default()
    }
}

pub fn start(
    certs: &Path,
    groups: &[(&str, usize)],
    behaviour: Behaviour,
) -> (Fleet, Arc<Recorder>) {
    let mut spec = FleetSpec::new(certs);
    for (name, count) in groups {
        spec = spec.group(name, *count, "stable", "1.0.0");
    }
    spec.behaviour = behaviour;
    spec.heartbeat_interval = Duration::from_secs(1);
    spec.seed = 42;
    let recorder = Arc::new(Recorder::default());
    let fleet = Fleet::start(spec, recorder.clone()).unwrap();
    (fleet, recorder)
}

/// `/v1/upgrade` needs the admin role today, so the tests drive nodes as admin.
pub fn admin(fleet: &Fleet, certs: &Path, id: &str) -> Client {
    let endpoint = fleet.node_endpoint(id).unwrap();
    Client::from_dir(&endpoint, certs, Role::Admin)
        .unwrap()
        .with_server_name(id)
        .unwrap()
        .with_timeout(Duration::from_secs(10))
}

pub fn image(version: &str) -> String {
    format!("registry.example:5000/slate/installer:{version}")
}

pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}
