//! Clients made from one [`ClientTls`] against the real server: they work, and (ignored, a
//! benchmark) what sharing the configuration saves per call against a client built per call,
//! the way the operator sent its upgrade orders before.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Fake;
use slate_api::{Client, ClientError, ClientTls, Role, UpgradeRequest};

fn upgrade(client: &Client) -> Result<(), ClientError> {
    client.upgrade(&UpgradeRequest::new("registry/os:2@sha256:00"))
}

#[test]
fn shared_clients_call_the_node_from_many_threads() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = common::start(fake.clone());
    let addr = server.local_addr().to_string();
    let tls = ClientTls::from_dir(dir.path(), Role::Operator).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..3 {
                    let client = tls.client(&addr).unwrap();
                    assert!(tls.made(&client));
                    // The fake's sequence lock may be held by another thread's call.
                    match upgrade(&client) {
                        Ok(()) | Err(ClientError::Locked(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    assert!(!fake.upgrades.lock().unwrap().is_empty());
    // The role is still the certificate's: a reader's shared configuration may not upgrade.
    let reader = ClientTls::from_dir(dir.path(), Role::Reader).unwrap();
    let refused = upgrade(&reader.client(&addr).unwrap());
    assert!(
        matches!(refused, Err(ClientError::PermissionDenied(_))),
        "{refused:?}"
    );
}

/// The handshakes the server counted, full and resumed, as a reader scrapes them (the scrape's
/// own handshake counted before it answers).
fn handshakes(client: &Client) -> (u64, u64) {
    let text = client.get_text("/metrics").unwrap();
    let count = |kind: &str| {
        let series = format!("slate_api_tls_handshakes_total{{kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series}in\n{text}"))
    };
    (count("full"), count("resumed"))
}

#[test]
fn a_client_called_again_resumes_its_session_with_its_certificates_role() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = common::start(fake.clone());
    let addr = server.local_addr().to_string();
    let reader = ClientTls::from_dir(dir.path(), Role::Reader).unwrap();
    assert_eq!(handshakes(&reader.client(&addr).unwrap()), (1, 0));
    assert_eq!(handshakes(&reader.client(&addr).unwrap()), (1, 1));
    // A resumed session is the reader's still: no more than a reader may do.
    let refused = upgrade(&reader.client(&addr).unwrap());
    assert!(
        matches!(refused, Err(ClientError::PermissionDenied(_))),
        "{refused:?}"
    );
    let operator = ClientTls::from_dir(dir.path(), Role::Operator).unwrap();
    upgrade(&operator.client(&addr).unwrap()).unwrap();
    upgrade(&operator.client(&addr).unwrap()).unwrap();
    assert_eq!(fake.upgrades.lock().unwrap().len(), 2);
    // The operator's second call and the reader's refused one resumed; a client built per call
    // (its own session cache) cannot.
    let own = Client::from_dir(&addr, dir.path(), Role::Reader).unwrap();
    assert_eq!(handshakes(&own), (3, 3));
    assert_eq!(handshakes(&reader.client(&addr).unwrap()), (3, 4));
}

/// `N` upgrade calls, `PARALLEL` threads at a time, as the operator sends orders (to
/// `NODES` servers: a node takes at most 8 connections of one client certificate).
const N: usize = 400;
const PARALLEL: usize = 24;
const NODES: usize = 4;

fn run(addrs: &[String], make: &(dyn Fn(&str) -> Client + Sync)) -> Duration {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..PARALLEL {
            let (next, addr) = (&next, &addrs[t % NODES]);
            s.spawn(move || {
                while next.fetch_add(1, Ordering::Relaxed) < N {
                    match upgrade(&make(addr)) {
                        Ok(()) | Err(ClientError::Locked(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    started.elapsed()
}

/// `cargo test -p slate-api --release --test shared_client -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark: prints per-call figures and the ratio"]
fn bench_shared_against_per_call() {
    let (dir, first) = common::start(Arc::new(Fake::default()));
    let mut servers = vec![first];
    while servers.len() < NODES {
        let config =
            slate_api::ServerConfig::from_dir("127.0.0.1:0".parse().unwrap(), dir.path()).unwrap();
        servers.push(slate_api::spawn(config, Arc::new(Fake::default())).unwrap());
    }
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let per_call = |addr: &str| Client::from_dir(addr, dir.path(), Role::Operator).unwrap();
    let tls = ClientTls::from_dir(dir.path(), Role::Operator).unwrap();
    let shared = |addr: &str| tls.client(addr).unwrap();
    // Alternate, three rounds each, so that the machine's load falls on both alike.
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        old.push(run(&addrs, &per_call));
        new.push(run(&addrs, &shared));
    }
    old.sort();
    new.sort();
    let per = |d: Duration| d.as_secs_f64() * 1e3 / N as f64;
    println!(
        "{N} upgrade calls, {PARALLEL} at a time, median of 3: client per call {:.3} ms/call \
         ({:.0} ms), shared ClientTls {:.3} ms/call ({:.0} ms): shared/per-call = {:.3}",
        per(old[1]),
        old[1].as_secs_f64() * 1e3,
        per(new[1]),
        new[1].as_secs_f64() * 1e3,
        new[1].as_secs_f64() / old[1].as_secs_f64(),
    );
}
