//! The ground truth: every upgrade request a node accepted or refused and how each ended, in
//! the order it happened, with the per-group concurrency it caused. Tests judge the operator
//! by this log, never by what the operator believes, so it must be exact: every entry and the
//! counters are updated under one lock, at the moment the node's own state changes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// One line of the ground-truth log (and of the JSON-lines file: `{"at_ms":…,"node":…,
/// "group":…,"kind":"accepted","from":…,"to":…}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimEvent {
    /// Milliseconds since the fleet started; never decreases along the log.
    pub at_ms: u64,
    pub node: String,
    pub group: String,
    #[serde(flatten)]
    pub kind: SimEventKind,
}

/// What happened to a node's upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SimEventKind {
    /// `POST /v1/upgrade` was accepted: the upgrade is in flight from here. `replace`: the
    /// request asked for a replacement (fresh data partitions) rather than in place.
    Accepted {
        from: String,
        to: String,
        #[serde(default)]
        replace: bool,
    },
    /// `POST /v1/upgrade` was refused (locked, not newer, no version in the reference, …);
    /// `reason` is the error the client got.
    Refused { reason: String },
    /// The node came back up on the new version and committed it.
    Committed { version: String },
    /// The new version failed its health checks; the node is back on `back_to`.
    Reverted {
        from_target: String,
        back_to: String,
    },
}

/// In-flight upgrades of one group, now and at the worst moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Flight {
    now: usize,
    max: usize,
    max_at_ms: u64,
}

#[derive(Debug)]
struct Inner {
    events: Vec<SimEvent>,
    flight: BTreeMap<String, Flight>,
    file: Option<BufWriter<File>>,
    file_error: Option<String>,
}

#[derive(Debug)]
pub(crate) struct EventLog {
    start: Instant,
    inner: Mutex<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EventLog {
    /// A log starting now, also written line by line to `file` when given (created or
    /// truncated).
    pub(crate) fn new(file: Option<&Path>) -> std::io::Result<Self> {
        let file = file.map(File::create).transpose()?.map(BufWriter::new);
        Ok(EventLog {
            start: Instant::now(),
            inner: Mutex::new(Inner {
                events: Vec::new(),
                flight: BTreeMap::new(),
                file,
                file_error: None,
            }),
        })
    }

    /// Milliseconds since the fleet started.
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Appends an event and updates the group's in-flight count. The timestamp is taken under
    /// the lock, so the log's order and its timestamps agree.
    pub(crate) fn record(&self, node: &str, group: &str, kind: SimEventKind) {
        let mut inner = lock(&self.inner);
        let at_ms = self.now_ms();
        let flight = inner.flight.entry(group.to_owned()).or_default();
        match kind {
            SimEventKind::Accepted { .. } => {
                flight.now += 1;
                if flight.now > flight.max {
                    flight.max = flight.now;
                    flight.max_at_ms = at_ms;
                }
            }
            SimEventKind::Committed { .. } | SimEventKind::Reverted { .. } => {
                flight.now = flight.now.saturating_sub(1);
            }
            SimEventKind::Refused { .. } => {}
        }
        let event = SimEvent {
            at_ms,
            node: node.to_owned(),
            group: group.to_owned(),
            kind,
        };
        let Inner {
            file, file_error, ..
        } = &mut *inner;
        if let Some(out) = file {
            let written = serde_json::to_writer(&mut *out, &event)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"))
                .and_then(|()| out.flush());
            if let Err(e) = written {
                file_error.get_or_insert_with(|| e.to_string());
            }
        }
        inner.events.push(event);
    }

    pub(crate) fn events(&self) -> Vec<SimEvent> {
        lock(&self.inner).events.clone()
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).events.len()
    }

    /// `(in flight now, max ever, when the max was first reached)`.
    pub(crate) fn flight(&self, group: &str) -> (usize, usize, u64) {
        let inner = lock(&self.inner);
        let f = inner.flight.get(group).copied().unwrap_or_default();
        (f.now, f.max, f.max_at_ms)
    }

    pub(crate) fn in_flight_total(&self) -> usize {
        lock(&self.inner).flight.values().map(|f| f.now).sum()
    }

    /// The first error writing the JSON-lines file, if any (the in-memory log is complete
    /// regardless).
    pub(crate) fn file_error(&self) -> Option<String> {
        lock(&self.inner).file_error.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_is_counted_per_group_with_its_peak() {
        let log = EventLog::new(None).unwrap();
        let acc = || SimEventKind::Accepted {
            from: "1".into(),
            to: "2".into(),
            replace: false,
        };
        log.record("a-1", "a", acc());
        log.record("a-2", "a", acc());
        log.record("b-1", "b", acc());
        log.record(
            "a-1",
            "a",
            SimEventKind::Committed {
                version: "2".into(),
            },
        );
        log.record("a-3", "a", SimEventKind::Refused { reason: "x".into() });
        assert_eq!(log.flight("a").0, 1);
        assert_eq!(log.flight("a").1, 2);
        assert_eq!(log.flight("b").1, 1);
        assert_eq!(log.flight("c"), (0, 0, 0));
        assert_eq!(log.in_flight_total(), 2);
        let events = log.events();
        assert!(events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        let json = serde_json::to_string(&events[0]).unwrap();
        assert!(json.contains(r#""kind":"accepted""#), "{json}");
        assert_eq!(serde_json::from_str::<SimEvent>(&json).unwrap(), events[0]);
    }
}
