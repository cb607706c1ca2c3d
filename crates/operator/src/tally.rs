//! Heartbeats as counts, news as lines. At fleet scale a line per heartbeat drowns the log (a
//! 400-node rollout wrote about 16,000 lines; 10,000 nodes would write 2,000 a second, issue
//! 44), and almost all of them say "still here". So a routine heartbeat is counted, and one
//! line per [`TALLY_EVERY`] sums them up; a report that changes something a person acts on — a
//! node that joins, changes version, turns unhealthy or reports a failed upgrade — keeps a line
//! of its own, as do failed heartbeats (the API logs those) and the leader's events.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use slate_rollout::NodeReport;

/// How often routine heartbeats are summed up in one line (at the first heartbeat after it).
pub const TALLY_EVERY: Duration = Duration::from_secs(30);

/// The heartbeats of the current window.
#[derive(Debug, Default)]
pub struct HeartbeatTally {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    start: Option<Instant>,
    count: u64,
    written: u64,
    nodes: HashSet<String>,
}

impl HeartbeatTally {
    /// Count one accepted heartbeat from `node` (`written`: it changed the stored record).
    /// Returns the summary of the window before it when that window is [`TALLY_EVERY`] old.
    pub fn record(&self, node: &str, written: bool, now: Instant) -> Option<String> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let start = *w.start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        let summary = (elapsed >= TALLY_EVERY).then(|| {
            let line = format!(
                "heartbeats: {} from {} nodes in the last {} s ({} written)",
                w.count,
                w.nodes.len(),
                elapsed.as_secs(),
                w.written
            );
            *w = Window {
                start: Some(now),
                ..Window::default()
            };
            line
        });
        w.count += 1;
        w.written += u64::from(written);
        if !w.nodes.contains(node) {
            w.nodes.insert(node.to_owned());
        }
        summary
    }
}

/// Whether an API log line is a heartbeat that was answered 200: counted by
/// [`HeartbeatTally`] instead (a refused or failed one is still logged as it is).
pub fn is_routine(api_line: &str) -> bool {
    api_line.ends_with(" POST /v1/fleet/heartbeat -> 200")
}

/// The line a stored report's successor deserves, if any (`old`: the stored report).
pub fn news(old: Option<&NodeReport>, new: &NodeReport) -> Option<String> {
    let id = &new.id;
    let Some(old) = old else {
        return Some(format!(
            "node {id} joined group {} on {}",
            new.group, new.version
        ));
    };
    let mut said = Vec::new();
    if old.version != new.version {
        said.push(format!("version {} → {}", old.version, new.version));
    }
    if old.group != new.group {
        said.push(format!("group {} → {}", old.group, new.group));
    }
    if old.healthy != new.healthy {
        said.push(
            if new.healthy {
                "healthy again"
            } else {
                "unhealthy"
            }
            .to_owned(),
        );
    }
    if old.last_failure != new.last_failure {
        if let Some(f) = &new.last_failure {
            said.push(format!("upgrade to {} failed: {}", f.version, f.reason));
        }
    }
    (!said.is_empty()).then(|| format!("node {id}: {}", said.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str, version: &str) -> NodeReport {
        NodeReport::settled(id, "edge", "127.0.0.1:50000".into(), version)
    }

    /// What the operator's log gets for `lines` API lines and heartbeats over `seconds`.
    fn logged(nodes: usize, beats_each: usize, every: Duration) -> Vec<String> {
        let tally = HeartbeatTally::default();
        let t0 = Instant::now();
        let mut log = Vec::new();
        for round in 0..beats_each {
            for n in 0..nodes {
                let now = t0 + every * round as u32 + Duration::from_millis(n as u64);
                let api = format!("api: 10.0.0.{n}:4000 (node) POST /v1/fleet/heartbeat -> 200");
                if !is_routine(&api) {
                    log.push(api);
                }
                log.extend(tally.record(&format!("node-{n}"), round == 0, now));
            }
        }
        log
    }

    #[test]
    fn four_hundred_heartbeats_are_a_bounded_number_of_lines() {
        // 400 nodes, one heartbeat each: one window, no line yet.
        assert_eq!(logged(400, 1, Duration::from_secs(5)), Vec::<String>::new());
        // 400 nodes every 5 s for 2 minutes (9,600 heartbeats): one line per 30 s.
        let log = logged(400, 24, Duration::from_secs(5));
        assert_eq!(log.len(), 3, "{log:#?}");
        assert_eq!(
            log[0],
            "heartbeats: 2400 from 400 nodes in the last 30 s (400 written)"
        );
        assert_eq!(
            log[1],
            "heartbeats: 2400 from 400 nodes in the last 30 s (0 written)"
        );
    }

    #[test]
    fn a_failed_heartbeat_keeps_its_own_line() {
        assert!(!is_routine(
            "api: 10.0.0.1:4000 (node) POST /v1/fleet/heartbeat -> 403"
        ));
        assert!(!is_routine(
            "api: 10.0.0.1:4000 (admin) POST /v1/fleet/pause -> 200"
        ));
    }

    #[test]
    fn news_is_what_changed_and_nothing_else() {
        let v1 = report("n1", "1.0.0");
        assert_eq!(
            news(None, &v1).as_deref(),
            Some("node n1 joined group edge on 1.0.0")
        );
        let mut later = v1.clone();
        later.sent_at_ms = 99;
        later.busy = true;
        assert_eq!(news(Some(&v1), &later), None);
        let mut v2 = v1.clone();
        v2.version = "2.0.0".into();
        v2.healthy = false;
        assert_eq!(
            news(Some(&v1), &v2).as_deref(),
            Some("node n1: version 1.0.0 → 2.0.0; unhealthy")
        );
    }
}
