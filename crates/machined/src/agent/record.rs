//! What the agent keeps across reboots, on STATE (`agent/record.json`): the give-up counter
//! and the upgrade it started, whose outcome only the next boot can judge. One value, written
//! whole by one atomic replace.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slate_release::FailureCounter;

/// The file under the STATE mount.
pub const RECORD_PATH: &str = "agent/record.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRecord {
    #[serde(default)]
    pub failures: FailureCounter,
    /// The upgrade the agent handed to the transaction and has not judged yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<Attempt>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    pub from: String,
    pub to: String,
}

/// How the last attempt ended, judged from a committed boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No attempt was pending.
    Nothing,
    /// The node runs the version it moved to.
    Committed { version: String },
    /// The node came back on another version: the attempt was reverted (`reverts` so far).
    Reverted {
        version: String,
        reverts: u32,
        gave_up: bool,
    },
}

impl AgentRecord {
    /// Judge the pending attempt now that `running` is committed, and forget failures of
    /// versions the node has left behind.
    pub fn settle(&mut self, running: &str) -> Outcome {
        let outcome = match self.attempt.take() {
            None => Outcome::Nothing,
            Some(attempt) if slate_release::compare(&attempt.to, running).is_eq() => {
                Outcome::Committed {
                    version: attempt.to,
                }
            }
            Some(attempt) => self.failed(&attempt.to),
        };
        self.failures.forget_up_to(running);
        outcome
    }

    /// Count a failed attempt at `version` (a reverted boot, or an upgrade that failed before
    /// its reboot).
    pub fn failed(&mut self, version: &str) -> Outcome {
        let gave_up = self.failures.record_revert(version);
        Outcome::Reverted {
            version: version.to_owned(),
            reverts: self.failures.reverts(version),
            gave_up,
        }
    }
}

fn path(state: &Path) -> PathBuf {
    state.join(RECORD_PATH)
}

/// The record on STATE; a missing file is an empty record, an unreadable one is reported and
/// replaced (the counter is advice, not a safety property: the boot counter reverts anyway).
pub fn load(state: &Path) -> (AgentRecord, Option<String>) {
    let path = path(state);
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (AgentRecord::default(), None),
        Err(e) => (
            AgentRecord::default(),
            Some(format!("{}: {e}; starting afresh", path.display())),
        ),
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(record) => (record, None),
            Err(e) => (
                AgentRecord::default(),
                Some(format!(
                    "{} is not readable ({e}); starting afresh",
                    path.display()
                )),
            ),
        },
    }
}

pub fn store(state: &Path, record: &AgentRecord) -> Result<(), String> {
    let path = path(state);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
    crate::base::files::write_atomically(&path, &bytes, 0o600)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(to: &str) -> Option<Attempt> {
        Some(Attempt {
            from: "1.0.0".into(),
            to: to.into(),
        })
    }

    #[test]
    fn a_committed_attempt_is_cleared_and_a_reverted_one_counted_until_given_up() {
        let mut record = AgentRecord {
            attempt: attempt("2.0.0"),
            ..AgentRecord::default()
        };
        assert_eq!(
            record.settle("2.0.0"),
            Outcome::Committed {
                version: "2.0.0".into()
            }
        );
        assert_eq!(record.attempt, None);
        for n in 1..=3 {
            record.attempt = attempt("3.0.0");
            assert_eq!(
                record.settle("2.0.0"),
                Outcome::Reverted {
                    version: "3.0.0".into(),
                    reverts: n,
                    gave_up: n == 3
                }
            );
        }
        assert_eq!(record.failures.skipped(), vec!["3.0.0".to_owned()]);
        assert_eq!(record.settle("2.0.0"), Outcome::Nothing);
        // Once the node is past it, the version is forgotten.
        record.settle("3.1.0");
        assert!(record.failures.skipped().is_empty());
    }

    #[test]
    fn the_record_survives_a_store_and_a_corrupt_one_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = AgentRecord {
            attempt: attempt("2.0.0"),
            ..AgentRecord::default()
        };
        record.failed("1.5.0");
        store(dir.path(), &record).unwrap();
        assert_eq!(load(dir.path()), (record, None));
        std::fs::write(dir.path().join(RECORD_PATH), b"{not json").unwrap();
        let (fresh, warning) = load(dir.path());
        assert_eq!(fresh, AgentRecord::default());
        assert!(
            warning.unwrap().contains("not readable"),
            "warning names the cause"
        );
    }
}
