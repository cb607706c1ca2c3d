//! The backend's answers without a machine.
use slate_api::{Mode, Stage};

use super::*;

fn backend(cmdline: &str) -> (Backend, std::sync::mpsc::Receiver<Request>) {
    let (node, requests) = Node::for_tests(cmdline);
    (Backend(node), requests)
}

#[test]
fn a_reboot_takes_the_lock_and_hands_it_to_the_main_loop() {
    let (backend, requests) = backend("");
    backend.reboot(RebootMode::Powercycle).unwrap();
    let Ok(Request::Reboot(mode, guard)) = requests.try_recv() else {
        panic!("no reboot request");
    };
    assert_eq!(mode, RebootMode::Powercycle);
    assert_eq!(guard.kind(), SequenceKind::Reboot);
    // The status shows who holds the lock until the main loop is done with it.
    assert_eq!(backend.status().running_sequence.as_deref(), Some("reboot"));
    drop(guard);
    assert_eq!(backend.status().running_sequence, None);
}

#[test]
fn a_shutdown_asks_the_main_loop_to_power_off_and_waits_for_no_sequence() {
    let (backend, requests) = backend("");
    backend.shutdown().unwrap();
    let Ok(Request::Reboot(mode, guard)) = requests.try_recv() else {
        panic!("no shutdown request");
    };
    assert_eq!(mode, RebootMode::PowerOff);
    assert_eq!(guard.kind(), SequenceKind::Shutdown);
    // While it runs, a second one (or a reboot) is refused at once, not queued.
    assert!(matches!(backend.shutdown(), Err(BackendError::Locked(_))));
    assert!(matches!(
        backend.reboot(RebootMode::Default),
        Err(BackendError::Locked(_))
    ));
    drop(guard);
}

#[test]
fn a_request_the_running_sequence_may_not_yield_to_is_locked_at_once() {
    let (backend, requests) = backend("");
    backend.reboot(RebootMode::Default).unwrap();
    let held = requests.try_recv().unwrap();
    // Talos' matrix: a reset does not take over a reboot.
    let err = backend.reset().unwrap_err();
    assert!(
        matches!(&err, BackendError::Locked(m) if m.contains("reboot")),
        "{err}"
    );
    assert!(
        requests.try_recv().is_err(),
        "nothing reaches the main loop"
    );
    drop(held);
    backend.reset().unwrap();
    assert!(matches!(requests.try_recv(), Ok(Request::Reset(_))));
}

#[test]
fn a_container_may_not_reboot_or_upgrade() {
    let (backend, requests) = backend("slate.platform=container");
    assert_eq!(
        backend.reboot(RebootMode::Default),
        Err(BackendError::Unsupported(
            "reboot is not available in container mode".into()
        ))
    );
    let err = backend
        .upgrade(UpgradeRequest::new("bundle:sha256:00"))
        .unwrap_err();
    assert_eq!(
        err,
        BackendError::Unsupported("upgrade is not available in container mode".into())
    );
    assert!(matches!(
        backend.receive_bundle(&mut std::io::empty()),
        Err(BackendError::Unsupported(_))
    ));
    assert!(requests.try_recv().is_err());
    assert_eq!(backend.status().running_sequence, None, "no lock taken");
    assert_eq!(backend.status().mode, Mode::Container);
}

#[test]
fn an_upgrade_to_a_bundle_not_received_is_refused_before_the_lock() {
    let (backend, requests) = backend("");
    let err = backend
        .upgrade(UpgradeRequest::new("registry.example/slate:2.0.0"))
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidArgument(m) if m.contains("upload the bundle first")),
        "{err}"
    );
    assert!(requests.try_recv().is_err());
    assert_eq!(backend.status().running_sequence, None);
}

#[test]
fn a_registry_upgrade_must_be_pinned_forward_and_immediate() {
    let (backend, requests) = backend("");
    let hex = "ab".repeat(32);
    let pinned = format!("10.0.2.2:5000/slate/os:2.0.0@sha256:{hex}");
    for (image, stage, downgrade) in [
        ("10.0.2.2:5000/slate/os:2.0.0".to_owned(), false, false),
        (format!("10.0.2.2:5000/slate/os@sha256:{hex}"), false, false),
        (pinned.clone(), true, false),
        (pinned.clone(), false, true),
    ] {
        let mut req = UpgradeRequest::new(image.clone());
        req.stage = stage;
        req.allow_downgrade = downgrade;
        assert!(
            matches!(backend.upgrade(req), Err(BackendError::InvalidArgument(_))),
            "{image} stage={stage} downgrade={downgrade}"
        );
    }
    // Refused before the lock: nothing runs, nothing is asked of the main loop.
    assert_eq!(backend.status().running_sequence, None);
    assert!(requests.try_recv().is_err());
}

#[test]
fn requests_fail_when_the_main_loop_is_gone() {
    let (backend, requests) = backend("");
    drop(requests);
    assert_eq!(
        backend.reset(),
        Err(BackendError::Failed("machined's main loop is gone".into()))
    );
    // The guard went down with the request: the lock is free again.
    assert_eq!(backend.status().running_sequence, None);
}

#[test]
fn status_and_version_describe_the_node() {
    let (backend, _requests) = backend("slate.platform=metal-agent");
    let status = backend.status();
    assert_eq!(status.mode, Mode::MetalAgent);
    assert_eq!(status.stage, Stage::Booting);
    assert_eq!(status.last_failure, None);
    *backend.0.last_failure.lock().unwrap() = Some(slate_api::Failure {
        version: "3.0.0".into(),
        reason: "health check failed".into(),
    });
    assert_eq!(
        backend.status().last_failure.map(|f| f.version).as_deref(),
        Some("3.0.0")
    );
    let version = backend.version();
    assert_eq!(version.version, backend.0.version);
    assert_eq!(version.arch, slate_bundle::NATIVE_ARCH);
}

#[test]
fn logs_replay_the_journal_and_end_unless_followed() {
    let (backend, _requests) = backend("");
    backend.0.journal.info("first");
    backend.log_api("GET /v1/logs by admin");
    let lines: Vec<String> = backend.logs(false).unwrap().collect();
    assert_eq!(lines, ["first", "api: GET /v1/logs by admin"]);
}

/// The node's `/metrics` through the real API server, as Prometheus reads it: a reader's
/// client certificate, the text `promtool` accepts, what machined counted in it.
#[test]
fn metrics_are_served_to_a_reader_and_pass_promtool() {
    if !slate_testkit::prometheus::require_prometheus() || !slate_testkit::require_tool("openssl") {
        return;
    }
    let (backend, _requests) = backend("");
    let journal = &backend.0.journal;
    journal.counters.finished("upgrade", true).unwrap();
    journal.counters.finished("upgrade", false).unwrap();
    journal.counters.rollback("done").unwrap();
    journal
        .counters
        .health(vec![("tcp 127.0.0.1:9".into(), true)]);
    journal.counters.watchdog(Duration::from_secs(60));
    let certs = tempfile::tempdir().unwrap();
    slate_api::gen_certs(certs.path(), &[]).unwrap();
    let config = slate_api::ServerConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        &std::fs::read(certs.path().join(slate_api::CLIENT_CA_CERT)).unwrap(),
        &std::fs::read(certs.path().join(slate_api::SERVICE_CERT)).unwrap(),
        &std::fs::read(certs.path().join(slate_api::SERVICE_KEY)).unwrap(),
    );
    let server = slate_api::spawn(config, Arc::new(backend)).unwrap();
    let get = |path: &str| {
        slate_testkit::prometheus::https_get(
            &server.local_addr().to_string(),
            &certs.path().join(slate_api::CA_CERT),
            &certs
                .path()
                .join(slate_api::client_cert_file(slate_api::Role::Reader)),
            &certs
                .path()
                .join(slate_api::client_key_file(slate_api::Role::Reader)),
            path,
        )
        .unwrap()
    };
    let (status, text) = get("/metrics");
    assert_eq!(status, 200, "{text}");
    for line in [
        "slate_node_upgrades_total{outcome=\"installed\"} 1",
        "slate_node_upgrades_total{outcome=\"failed\"} 1",
        "slate_node_upgrades_total{outcome=\"committed\"} 0",
        "slate_node_rollbacks_total{outcome=\"done\"} 1",
        "slate_node_rollbacks_total{outcome=\"reverted\"} 0",
        "slate_node_boots_total{outcome=\"failed\"} 0",
        "slate_node_health_check_passing{check=\"tcp 127.0.0.1:9\"} 1",
        "slate_node_watchdog_timeout_seconds 60",
        "slate_node_committed 0",
        "slate_api_connections_refused_total{limit=\"connections\"} 0",
    ] {
        assert!(text.contains(&format!("{line}\n")), "{line} in\n{text}");
    }
    // The test process' own CPU time: it has run this far, so more than nothing.
    let cpu: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("process_cpu_seconds_total in\n{text}"));
    assert!(cpu > 0.0, "{cpu}");
    slate_testkit::prometheus::promtool_check(&text).unwrap();
    let (status, text) = get("/metrics?name=x");
    assert_eq!(status, 400, "{text}");
    server.shutdown().unwrap();
}
