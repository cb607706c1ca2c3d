//! What machined counts for the node API's `/metrics`, since it started (so: this boot's):
//! sequences by outcome, the last upgrade's phases as the sequencer timed them, the health
//! checks' last results, the watchdog, API rollbacks, bytes pulled and found cached, the update
//! agent's next window. The API derives the rest from the status.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use slate_sequencer::{SequenceKind, Span};

#[derive(Debug, Default)]
pub struct Counters {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// (sequence, ok) → how many finished so.
    sequences: BTreeMap<(String, bool), u64>,
    /// The phases of the upgrade running or last run, in the order they ended.
    upgrade_phases: Vec<(String, f64)>,
    /// An upgrade ended since its phases were last recorded: the next phase starts anew.
    upgrade_ended: bool,
    health: Vec<(String, bool)>,
    watchdog: Option<Duration>,
    rollbacks: BTreeMap<&'static str, u64>,
    downloaded: u64,
    reused: u64,
    next_window: Option<u64>,
}

impl Counters {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A span the sequencer timed: an upgrade's phases are kept.
    pub fn span(&self, span: &Span) {
        if span.task.is_some()
            || !matches!(
                span.sequence,
                SequenceKind::Upgrade | SequenceKind::StageUpgrade
            )
        {
            return;
        }
        let mut inner = self.inner();
        if std::mem::take(&mut inner.upgrade_ended) {
            inner.upgrade_phases.clear();
        }
        inner
            .upgrade_phases
            .push((span.phase.clone(), span.took.as_secs_f64()));
    }

    /// A sequence ended (`ok`: without an error).
    pub fn finished(&self, sequence: &str, ok: bool) {
        let mut inner = self.inner();
        *inner
            .sequences
            .entry((sequence.to_owned(), ok))
            .or_default() += 1;
        if sequence == SequenceKind::Upgrade.to_string()
            || sequence == SequenceKind::StageUpgrade.to_string()
        {
            inner.upgrade_ended = true;
        }
    }

    /// The health checks' results, by check, as last run.
    pub fn health(&self, results: Vec<(String, bool)>) {
        self.inner().health = results;
    }

    /// A pull: bytes fetched from the registry and found in the cache.
    pub fn pulled(&self, fetched: u64, cached: u64) {
        let mut inner = self.inner();
        inner.downloaded += fetched;
        inner.reused += cached;
    }

    /// When the update agent's window opens (Unix seconds), while it waits for it.
    pub fn next_window(&self, at: Option<u64>) {
        self.inner().next_window = at;
    }

    pub fn watchdog(&self, timeout: Duration) {
        self.inner().watchdog = Some(timeout);
    }

    /// A rollback asked through the API: `done` (the loader's writes made) or `failed`.
    pub fn rollback(&self, outcome: &'static str) {
        *self.inner().rollbacks.entry(outcome).or_default() += 1;
    }

    /// The API's view: upgrades are the Upgrade sequences (`installed`: it ended without an
    /// error, the new version set to boot; `failed`) and StageUpgrade ones (`staged`).
    pub fn snapshot(&self, journal_lines_dropped: u64) -> slate_api::NodeMetrics {
        let inner = self.inner();
        let count = |sequence: SequenceKind, ok: bool| {
            inner
                .sequences
                .get(&(sequence.to_string(), ok))
                .copied()
                .unwrap_or(0)
        };
        slate_api::NodeMetrics {
            upgrades: vec![
                ("installed", count(SequenceKind::Upgrade, true)),
                ("failed", count(SequenceKind::Upgrade, false)),
                ("staged", count(SequenceKind::StageUpgrade, true)),
                ("stage_failed", count(SequenceKind::StageUpgrade, false)),
            ],
            rollbacks: ["done", "failed"]
                .into_iter()
                .map(|o| (o, inner.rollbacks.get(o).copied().unwrap_or(0)))
                .collect(),
            last_upgrade_phases: inner.upgrade_phases.clone(),
            health_checks: inner.health.clone(),
            watchdog: inner.watchdog.map(|t| t.as_secs_f64()),
            journal_lines_dropped,
            bytes_downloaded: inner.downloaded,
            bytes_reused: inner.reused,
            next_window: inner.next_window,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn phase(sequence: SequenceKind, phase: &str, ms: u64) -> Span {
        Span {
            sequence,
            phase: phase.into(),
            task: None,
            started: Instant::now(),
            took: Duration::from_millis(ms),
            ok: true,
        }
    }

    #[test]
    fn the_last_upgrade_s_phases_and_the_outcomes_are_counted() {
        let c = Counters::default();
        c.span(&phase(SequenceKind::Boot, "health", 5));
        c.span(&phase(SequenceKind::Upgrade, "drain", 100));
        c.span(&phase(SequenceKind::Upgrade, "install", 2000));
        c.finished("upgrade", false);
        c.span(&phase(SequenceKind::Upgrade, "drain", 50));
        c.finished("upgrade", true);
        c.finished("boot", true);
        c.rollback("done");
        let m = c.snapshot(7);
        assert_eq!(m.last_upgrade_phases, vec![("drain".to_owned(), 0.05)]);
        assert!(m.upgrades.contains(&("installed", 1)), "{:?}", m.upgrades);
        assert!(m.upgrades.contains(&("failed", 1)), "{:?}", m.upgrades);
        assert_eq!(m.rollbacks, vec![("done", 1), ("failed", 0)]);
        assert_eq!(m.journal_lines_dropped, 7);
    }
}
