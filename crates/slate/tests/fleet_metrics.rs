//! The daemons' `/metrics` scraped by a real Prometheus (Debian's, started on loopback with a
//! generated configuration) during a simulated-fleet rollout: a 3-member etcd cluster, Debian's
//! docker-registry holding the release index, `slate operator run` (scraped over mutual TLS
//! with a reader certificate), `slate fleetlock serve`, and simulated nodes (slate-fleet-sim)
//! heartbeating to the operator. What Prometheus answers through its HTTP API must follow the
//! rollout: every node on version 1, then every node on version 2; the lock requests counted by
//! outcome. `promtool check metrics` passes on both endpoints' text, and bad scrapes are
//! refused.
#![cfg(feature = "etcd")]

mod fleet_support;

#[path = "../../transport/tests/support/registry.rs"]
#[allow(dead_code)]
mod registry;

use fleet_support::{start_operator, Daemon, Index, ToOperator};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use registry::TestRegistry;
use slate_api::{client_cert_file, client_key_file, Client, Role};
use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Identities};
use slate_testkit::prometheus::{https_get, promtool_check, require_prometheus, Prometheus};

const NODES: usize = 30;

const POLICY: &str = r#"
[[policy]]
name = "fleet"
max_unavailable = "50%"
waves = [{ percent = 10, soak = "1s" }, { percent = 100 }]
failure_budget = 3
"#;

/// `POST path` to the FleetLock server: the status.
fn lock_request(addr: SocketAddr, path: &str, id: &str) -> u16 {
    let body = format!(r#"{{"client_params":{{"id":"{id}","group":"web"}}}}"#);
    let (status, _) = plain(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nfleet-lock-protocol: true\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    status
}

/// One plain-HTTP request on its own connection: the status and the body.
fn plain(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    let _ = tcp.read_to_string(&mut raw);
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

fn start_fleetlock(store: &Path, log: &Path) -> (Daemon, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slate"))
        .args([
            "fleetlock",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--group",
            "web=2",
        ])
        .arg("--store")
        .arg(store)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Daemon(child), addr)
}

/// The value of each sample by one label.
fn by(samples: &[(serde_json::Value, f64)], label: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = samples
        .iter()
        .map(|(m, v)| (m[label].as_str().unwrap_or("").to_owned(), *v))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn prometheus_follows_a_rollout_and_the_lock_server() {
    let _serial = slate_testkit::etcd::one_at_a_time();
    if !require_prometheus() || !slate_testkit::require_tool("openssl") {
        return;
    }
    let Some(etcd) = slate_testkit::etcd::three_members() else {
        return;
    };
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[]).unwrap();
    let image = registry.image("slate/os");
    let mut index = Index::new(&image);
    index.publish("1");
    let (_operator, op_addr) = start_operator(
        &etcd.endpoints(),
        &certs,
        &image,
        &dir.path().join("operator.log"),
    );
    let admin = || Client::from_dir(&op_addr, &certs, Role::Admin).unwrap();
    admin()
        .call::<serde_json::Value, _>(
            "POST",
            "/v1/fleet/policy",
            Some(&serde_json::json!({ "text": POLICY })),
        )
        .unwrap();
    let (_fleetlock, lock_addr) =
        start_fleetlock(&dir.path().join("locks"), &dir.path().join("fleetlock.log"));

    let mut spec = FleetSpec::new(&certs).group("web", NODES, "stable", "1");
    spec.heartbeat_interval = Duration::from_secs(1);
    spec.behaviour = Behaviour {
        upgrade_time: Duration::from_millis(300),
        reboot_time: Duration::from_millis(200),
        ..Behaviour::default()
    };
    let reporter = ToOperator {
        addr: op_addr.clone(),
        identities: Identities::from_dir(&certs).unwrap(),
    };
    let fleet = Fleet::start(spec, Arc::new(reporter)).unwrap();

    // Prometheus scrapes the operator as a reader, over mutual TLS, and the lock server.
    let prom_dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = (
        certs.join(slate_api::CA_CERT),
        certs.join(client_cert_file(Role::Reader)),
        certs.join(client_key_file(Role::Reader)),
    );
    let scrape_configs = format!(
        "  - job_name: operator\n    scheme: https\n    tls_config:\n      ca_file: {}\n      \
         cert_file: {}\n      key_file: {}\n    static_configs:\n      - targets: ['{op_addr}']\n  \
         - job_name: fleetlock\n    static_configs:\n      - targets: ['{lock_addr}']\n",
        ca.display(),
        cert.display(),
        key.display(),
    );
    let prom = Prometheus::start(prom_dir, Duration::from_secs(1), &scrape_configs).unwrap();
    let minute = Duration::from_secs(60);

    // Every node on version 1, as the inventory holds it.
    let samples = prom
        .wait_for(
            "sum by (version) (slate_operator_nodes{group=\"web\"})",
            minute,
            |s| by(s, "version") == [("1".to_owned(), NODES as f64)],
        )
        .unwrap();
    eprintln!("before the release: {:?}", by(&samples, "version"));
    prom.wait_for("slate_operator_leader", minute, |s| {
        s.len() == 1 && s[0].1 == 1.0
    })
    .unwrap();

    // Version 2 is published: the leader rolls it out, and the gauge follows.
    index.publish("2");
    let samples = prom
        .wait_for(
            "sum by (version) (slate_operator_nodes{group=\"web\"})",
            Duration::from_secs(120),
            |s| by(s, "version") == [("2".to_owned(), NODES as f64)],
        )
        .unwrap();
    eprintln!("after the rollout: {:?}", by(&samples, "version"));
    assert_eq!(
        fleet.versions().get("2"),
        Some(&NODES),
        "the simulator agrees"
    );
    prom.wait_for(
        "slate_operator_rollout_info{group=\"web\",target=\"2\",state=\"completed\"}",
        minute,
        |s| s.len() == 1,
    )
    .unwrap();
    let done = prom
        .wait_for(
            "slate_operator_rollout_nodes{group=\"web\",step=\"done\"}",
            minute,
            |s| s.len() == 1 && s[0].1 == NODES as f64,
        )
        .unwrap();
    eprintln!("done: {done:?}");
    // Version 1's series went away at the next scrape; during the rollout, at some scrape,
    // nodes were in flight (or the rollout was quicker than a scrape).
    let seen = prom
        .query("max_over_time(slate_operator_rollout_nodes{step=\"in_flight\"}[5m])")
        .unwrap();
    eprintln!("most in flight at a scrape: {seen:?}");
    let events = prom
        .wait_for("slate_operator_events_written_total", minute, |s| {
            s.len() == 1 && s[0].1 >= (NODES * 3) as f64
        })
        .unwrap();
    eprintln!("events written: {events:?}");
    prom.wait_for("slate_operator_tick_duration_seconds_count", minute, |s| {
        s.len() == 1 && s[0].1 > 0.0
    })
    .unwrap();
    // The leader's ticks ran on a CPU for some time (the kernel's count, both states scraped).
    let cpu = prom
        .wait_for("slate_operator_tick_cpu_seconds_total", minute, |s| {
            s.len() == 2
                && s.iter()
                    .any(|(labels, v)| labels["state"] == "running" && *v > 0.0)
        })
        .unwrap();
    eprintln!("the leader's ticks on a CPU and waiting: {cpu:?}");

    // The lock server: two slots taken, a third refused (all slots held), one given back.
    for (path, id, want) in [
        ("/v1/pre-reboot", "n1", 200),
        ("/v1/pre-reboot", "n2", 200),
        ("/v1/pre-reboot", "n3", 500),
        ("/v1/steady-state", "n1", 200),
    ] {
        assert_eq!(lock_request(lock_addr, path, id), want, "{path} {id}");
    }
    let locks = prom
        .wait_for(
            "slate_fleetlock_requests_total{operation=\"lock\"}",
            minute,
            |s| by(s, "result") == [("failed_lock".to_owned(), 1.0), ("locked".to_owned(), 2.0)],
        )
        .unwrap();
    eprintln!("lock requests: {:?}", by(&locks, "result"));
    prom.wait_for("slate_fleetlock_slots_held{group=\"web\"}", minute, |s| {
        s.len() == 1 && s[0].1 == 1.0
    })
    .unwrap();
    prom.wait_for("up", minute, |s| {
        s.len() == 2 && s.iter().all(|(_, v)| *v == 1.0)
    })
    .unwrap();

    // Each endpoint's text passes promtool; bad scrapes are refused.
    let (status, text) = https_get(&op_addr, &ca, &cert, &key, "/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    promtool_check(&text).unwrap();
    let (status, text) = https_get(&op_addr, &ca, &cert, &key, "/metrics?x=1").unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("takes no query parameters"), "{text}");
    let (status, text) = plain(
        lock_addr,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{text}");
    promtool_check(&text).unwrap();
    let (status, text) = plain(
        lock_addr,
        "DELETE /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 405, "{text}");
    let (status, text) = plain(
        lock_addr,
        "GET /metrics?debug=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 400, "{text}");
    drop(fleet);
}
