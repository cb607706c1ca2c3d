//! The policies' HTTP probes: before each tick the leader asks every soaking node's probe
//! URLs (`{host}` = the host of the node's API endpoint) and hands the answers to the tick,
//! which ends a probed soak only on a 2xx and fails the node on anything else.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use slate_rollout::{probe_target, Inventory, PolicySet, Rollout, Step};

/// One probe's connect and answer time limit.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Every soaking node whose covering policies name a probe: `true` when each of them
/// answered 2xx.
pub fn probe_soaking(
    policies: &PolicySet,
    inventory: &Inventory,
    rollouts: &BTreeMap<String, Rollout>,
    parallel: usize,
) -> BTreeMap<String, bool> {
    let mut asks: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for rollout in rollouts.values().filter(|r| r.state.is_active()) {
        for (id, progress) in &rollout.nodes {
            if !matches!(progress.step, Step::Soaking { .. }) {
                continue;
            }
            let Some(record) = inventory.get(id) else {
                continue;
            };
            let host = record
                .report
                .endpoint
                .rsplit_once(':')
                .map_or(record.report.endpoint.as_str(), |(h, _)| h)
                .trim_matches(['[', ']']);
            let targets: Vec<(String, String)> = policies
                .for_node(&record.report)
                .filter_map(|p| p.probe.as_deref())
                .filter_map(|url| probe_target(url, host))
                .collect();
            if !targets.is_empty() {
                asks.push((id.clone(), targets));
            }
        }
    }
    if asks.is_empty() {
        // Most ticks, with no probe in the policies: no thread started for nothing.
        return BTreeMap::new();
    }
    let next = AtomicUsize::new(0);
    let answers = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..parallel.clamp(1, asks.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((id, targets)) = asks.get(i) else {
                    break;
                };
                let ok = targets
                    .iter()
                    .all(|(authority, path)| get_ok(authority, path));
                answers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.clone(), ok);
            });
        }
    });
    answers.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// `GET path` on `authority` (HTTP/1.0, no redirects): whether the status is 2xx.
pub fn get_ok(authority: &str, path: &str) -> bool {
    let status = || -> std::io::Result<u16> {
        let addr = authority
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        let mut tcp = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        tcp.set_read_timeout(Some(PROBE_TIMEOUT))?;
        tcp.set_write_timeout(Some(PROBE_TIMEOUT))?;
        // One write: a server that answers after its first read and closes must not see
        // the rest of the request arrive on a closed socket (a reset would lose its answer).
        let request = format!(
            "GET {path} HTTP/1.0\r\nHost: {authority}\r\nUser-Agent: slate-operator\r\n\r\n"
        );
        tcp.write_all(request.as_bytes())?;
        let mut head = [0u8; 16];
        let mut read = 0;
        while read < 12 {
            let n = tcp.read(&mut head[read..])?;
            if n == 0 {
                break;
            }
            read += n;
        }
        std::str::from_utf8(&head[..read])
            .ok()
            .and_then(|h| h.strip_prefix("HTTP/1."))
            .and_then(|h| h.get(2..5))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other("not an HTTP answer"))
    };
    status().is_ok_and(|code| (200..300).contains(&code))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server answering each connection with `status`, on a thread.
    fn server(status: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                // The whole request head, as a real server reads it, before answering.
                let mut head = Vec::new();
                let mut buf = [0u8; 512];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
            }
        });
        addr
    }

    #[test]
    fn only_a_2xx_answer_passes() {
        assert!(get_ok(&server("200 OK"), "/healthz"));
        assert!(get_ok(&server("204 No Content"), "/"));
        assert!(!get_ok(&server("503 Service Unavailable"), "/healthz"));
        assert!(!get_ok(&server("301 Moved"), "/healthz"));
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(!get_ok(&closed.to_string(), "/"));
    }

    #[test]
    fn soaking_nodes_with_a_probe_are_asked_and_others_not() {
        use slate_rollout::{NodeProgress, NodeRecord, NodeReport, RolloutState, Strategy};
        let good = server("200 OK");
        let port = good.rsplit_once(':').unwrap().1.to_owned();
        let policies = PolicySet::parse(&format!(
            "[[policy]]\nname = \"p\"\ngroups = [\"g\"]\nprobe = \"http://{{host}}:{port}/ready\"\n"
        ))
        .unwrap();
        let report = |id: &str, host: &str| NodeReport {
            id: id.into(),
            group: "g".into(),
            labels: Default::default(),
            endpoint: format!("{host}:50000"),
            version: "2".into(),
            channel: "stable".into(),
            committed: true,
            healthy: true,
            busy: false,
            last_failure: None,
            sent_at_ms: 1,
        };
        let mut inventory = Inventory::new();
        // n1 answers on 127.0.0.1; n2's host has nothing listening on that port.
        for (id, host) in [
            ("n1", "127.0.0.1"),
            ("n2", "127.0.0.2"),
            ("n3", "127.0.0.1"),
        ] {
            inventory.insert(
                id.into(),
                NodeRecord {
                    report: report(id, host),
                    last_seen: 1,
                },
            );
        }
        let progress = |step| NodeProgress {
            from: Some("1".into()),
            started: Some(1),
            strategy: Strategy::InPlace,
            step,
        };
        let rollout = Rollout {
            id: 1,
            group: "g".into(),
            target: "2".into(),
            image: "r/o:2@sha256:00".into(),
            created: 1,
            state: RolloutState::Running,
            nodes: [
                ("n1".to_owned(), progress(Step::Soaking { committed: 1 })),
                ("n2".to_owned(), progress(Step::Soaking { committed: 1 })),
                ("n3".to_owned(), progress(Step::Done { at: 1 })),
            ]
            .into(),
            recent_starts: Vec::new(),
            acknowledged: Default::default(),
        };
        let answers = probe_soaking(
            &policies,
            &inventory,
            &[("g".to_owned(), rollout)].into(),
            4,
        );
        assert_eq!(
            answers,
            [("n1".to_owned(), true), ("n2".to_owned(), false)].into()
        );
    }
}
