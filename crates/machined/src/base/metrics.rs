//! What machined counts for the node API's `/metrics`. The outcome counters — upgrades,
//! rollbacks and boots by outcome — outlive a boot: once STATE is mounted they are read from
//! `metrics/counters` there (docs/formats.md §16) and every count is written back at once, so
//! a commit or a revert at boot is still counted when the reboot that follows wipes memory.
//! The rest counts since machined started (so: this boot's): the last upgrade's phases as the
//! sequencer timed them, the health checks' last results, the watchdog, bytes pulled and found
//! cached, the update agent's next window. The API derives the rest from the status.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use slate_metrics::node_counters::{self as kept, NodeCounters};
use slate_sequencer::{SequenceKind, Span};

/// The record under the STATE mount.
pub const RECORD_PATH: &str = "metrics/counters";
/// Where an unreadable record is moved, so that whoever looks can see what it held.
const UNREADABLE_PATH: &str = "metrics/counters.unreadable";

/// The outcomes every scrape names, 0 until counted (a series that appears only at its first
/// event makes `increase` miss that event).
const UPGRADE_OUTCOMES: &[&str] = &[
    "installed",
    "failed",
    "staged",
    "stage_failed",
    "committed",
    "reverted",
];
const ROLLBACK_OUTCOMES: &[&str] = &["done", "failed", "reverted", "fallback"];
const BOOT_OUTCOMES: &[&str] = &["committed", "failed"];

#[derive(Debug, Default)]
pub struct Counters {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The phases of the upgrade running or last run, in the order they ended.
    upgrade_phases: Vec<(String, f64)>,
    /// An upgrade ended since its phases were last recorded: the next phase starts anew.
    upgrade_ended: bool,
    health: Vec<(String, bool)>,
    watchdog: Option<Duration>,
    downloaded: u64,
    reused: u64,
    next_window: Option<u64>,
    /// The outcome counters: STATE's record once attached, plus what this boot counted.
    kept: NodeCounters,
    /// STATE's mount point once it is mounted and the record was read.
    state: Option<PathBuf>,
}

/// Reads the record under `state`: none yet is an empty one; one that cannot be read or
/// parsed is moved aside and the counters start from zero, with the reason to log.
fn load(state: &Path) -> (NodeCounters, Option<String>) {
    let path = state.join(RECORD_PATH);
    let bytes = match std::fs::File::open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (NodeCounters::default(), None)
        }
        Err(e) => Err(e.to_string()),
        Ok(file) => {
            let mut bytes = Vec::new();
            // One byte past the bound, so that a longer file is refused rather than cut.
            file.take(kept::MAX_RECORD_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map(|_| bytes)
                .map_err(|e| e.to_string())
        }
    };
    match bytes.and_then(|b| NodeCounters::parse(&b).map_err(|e| e.to_string())) {
        Ok(record) => (record, None),
        Err(reason) => {
            let aside = state.join(UNREADABLE_PATH);
            let moved = match std::fs::rename(&path, &aside) {
                Ok(()) => format!("moved to {}", aside.display()),
                Err(e) => format!("not moved aside: {e}"),
            };
            (
                NodeCounters::default(),
                Some(format!(
                    "{}: {reason}; the upgrade, rollback and boot counters start from zero \
                     ({moved})",
                    path.display()
                )),
            )
        }
    }
}

fn store(state: &Path, record: &NodeCounters) -> Result<(), String> {
    let path = state.join(RECORD_PATH);
    crate::base::files::write_atomically(&path, &record.format(), 0o644)
        .map_err(|e| format!("{}: {e}", path.display()))
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

    /// STATE is mounted at `state`: read the record there, add what this boot counted
    /// before, and keep every count there from now on. Returns what to log when the record
    /// was unreadable or could not be written.
    pub fn attach(&self, state: &Path) -> Vec<String> {
        let (mut record, note) = load(state);
        let mut notes: Vec<String> = note.into_iter().collect();
        let mut inner = self.inner();
        record.merge(&inner.kept);
        if !inner.kept.is_empty() {
            if let Err(err) = store(state, &record) {
                notes.push(format!("the counters are not kept: {err}"));
            }
        }
        inner.kept = record;
        inner.state = Some(state.to_owned());
        notes
    }

    /// One more of each (family, outcome), kept on STATE when it is mounted: `Ok(false)` when
    /// not yet (this boot's memory holds it until [`Counters::attach`]).
    pub fn count(&self, counted: &[(&str, &str)]) -> Result<bool, String> {
        let mut inner = self.inner();
        for (family, outcome) in counted {
            inner.kept.add(family, outcome, 1);
        }
        match &inner.state {
            Some(state) => store(state, &inner.kept).map(|()| true),
            None => Ok(false),
        }
    }

    /// A sequence ended (`ok`: it did what it was for, a reboot at its end included): an
    /// upgrade's outcome is counted, and its phases are closed.
    pub fn finished(&self, sequence: &str, ok: bool) -> Result<bool, String> {
        let outcome = if sequence == SequenceKind::Upgrade.to_string() {
            if ok {
                "installed"
            } else {
                "failed"
            }
        } else if sequence == SequenceKind::StageUpgrade.to_string() {
            if ok {
                "staged"
            } else {
                "stage_failed"
            }
        } else {
            return Ok(true);
        };
        self.inner().upgrade_ended = true;
        self.count(&[(kept::UPGRADES, outcome)])
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
    pub fn rollback(&self, outcome: &'static str) -> Result<bool, String> {
        self.count(&[(kept::ROLLBACKS, outcome)])
    }

    /// The API's view, with machined's CPU time (`cpu_seconds`).
    pub fn snapshot(
        &self,
        journal_lines_dropped: u64,
        cpu_seconds: Option<f64>,
    ) -> slate_api::NodeMetrics {
        let inner = self.inner();
        slate_api::NodeMetrics {
            upgrades: inner.kept.family(kept::UPGRADES, UPGRADE_OUTCOMES),
            rollbacks: inner.kept.family(kept::ROLLBACKS, ROLLBACK_OUTCOMES),
            boots: inner.kept.family(kept::BOOTS, BOOT_OUTCOMES),
            cpu_seconds,
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

    fn of(m: &[(String, u64)], outcome: &str) -> u64 {
        m.iter()
            .find(|(o, _)| o == outcome)
            .map_or(u64::MAX, |(_, n)| *n)
    }

    #[test]
    fn the_last_upgrade_s_phases_and_the_outcomes_are_counted() {
        let c = Counters::default();
        c.span(&phase(SequenceKind::Boot, "health", 5));
        c.span(&phase(SequenceKind::Upgrade, "drain", 100));
        c.span(&phase(SequenceKind::Upgrade, "install", 2000));
        assert_eq!(c.finished("upgrade", false), Ok(false));
        c.span(&phase(SequenceKind::Upgrade, "drain", 50));
        c.finished("upgrade", true).unwrap();
        c.finished("boot", true).unwrap();
        c.rollback("done").unwrap();
        let m = c.snapshot(7, Some(1.5));
        assert_eq!(m.last_upgrade_phases, vec![("drain".to_owned(), 0.05)]);
        assert_eq!(of(&m.upgrades, "installed"), 1, "{:?}", m.upgrades);
        assert_eq!(of(&m.upgrades, "failed"), 1, "{:?}", m.upgrades);
        assert_eq!(of(&m.upgrades, "committed"), 0, "{:?}", m.upgrades);
        assert_eq!(of(&m.rollbacks, "done"), 1);
        assert_eq!(of(&m.rollbacks, "reverted"), 0);
        assert_eq!(m.journal_lines_dropped, 7);
        assert_eq!(m.cpu_seconds, Some(1.5));
    }

    /// A boot counts, reboots, and the next boot (a new `Counters`) goes on from there; what
    /// was counted before STATE was mounted is added to the record.
    #[test]
    fn the_outcome_counters_outlive_a_boot() {
        let state = tempfile::tempdir().unwrap();
        let first = Counters::default();
        assert!(first.attach(state.path()).is_empty());
        first.finished("upgrade", true).unwrap();
        let second = Counters::default();
        // A revert on the fatal path before STATE is mounted: in memory until it is.
        assert_eq!(
            second.count(&[(kept::UPGRADES, "reverted"), (kept::ROLLBACKS, "reverted")]),
            Ok(false)
        );
        assert!(second.attach(state.path()).is_empty());
        assert_eq!(second.count(&[(kept::BOOTS, "committed")]), Ok(true));
        let third = Counters::default();
        third.attach(state.path());
        let m = third.snapshot(0, None);
        assert_eq!(of(&m.upgrades, "installed"), 1);
        assert_eq!(of(&m.upgrades, "reverted"), 1);
        assert_eq!(of(&m.rollbacks, "reverted"), 1);
        assert_eq!(of(&m.boots, "committed"), 1);
        let text = std::fs::read_to_string(state.path().join(RECORD_PATH)).unwrap();
        assert_eq!(
            text,
            "slate-node-counters 1\nboots committed 1\nrollbacks reverted 1\n\
             upgrades installed 1\nupgrades reverted 1\n"
        );
    }

    /// An unreadable record: a clear reason, moved aside, counting starts from zero and the
    /// next count writes a good record.
    #[test]
    fn an_unreadable_record_is_set_aside_and_counting_starts_again() {
        let state = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(state.path().join("metrics")).unwrap();
        let bad = "slate-node-counters 1\nupgrades committed x\n";
        std::fs::write(state.path().join(RECORD_PATH), bad).unwrap();
        let c = Counters::default();
        let notes = c.attach(state.path());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("line 2: the count is not a decimal number")
                && notes[0].contains("start from zero")
                && notes[0].contains("counters.unreadable"),
            "{notes:?}"
        );
        assert_eq!(
            std::fs::read_to_string(state.path().join(UNREADABLE_PATH)).unwrap(),
            bad
        );
        assert_eq!(of(&c.snapshot(0, None).upgrades, "committed"), 0);
        c.count(&[(kept::UPGRADES, "committed")]).unwrap();
        let again = Counters::default();
        assert!(again.attach(state.path()).is_empty());
        assert_eq!(of(&again.snapshot(0, None).upgrades, "committed"), 1);
    }
}
