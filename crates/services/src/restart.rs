//! When a service that ended starts again: its policy decides whether, the backoff when.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `restart`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Whenever it ends, however it ended.
    #[default]
    Always,
    /// When it exits non-zero or is killed by a signal.
    OnFailure,
    /// Never: it ran once (a job), and its exit is recorded.
    Never,
}

/// How a service's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => write!(f, "signal {signal}"),
        }
    }
}

impl Exit {
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl RestartPolicy {
    /// Whether a service that ended with `exit` (not stopped by machined) starts again.
    pub fn restarts(self, exit: Exit) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => !exit.success(),
            RestartPolicy::Never => false,
        }
    }
}

/// Exponential backoff: the first restart after `initial`, each further one in a row after
/// twice the one before, at most `max`. A run that lasted [`Backoff::STABLE`] or longer ends
/// the row: the next failure waits `initial` again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// A run at least this long was not a crash loop.
    pub const STABLE: Duration = Duration::from_secs(30);

    pub fn new(initial_ms: u64, max_ms: u64) -> Self {
        Backoff {
            initial: Duration::from_millis(initial_ms),
            max: Duration::from_millis(max_ms.max(initial_ms)),
        }
    }

    /// The delay before restart number `failures_in_a_row` (1 for the first).
    pub fn delay(&self, failures_in_a_row: u32) -> Duration {
        let doublings = failures_in_a_row.saturating_sub(1).min(32);
        self.initial
            .checked_mul(1 << doublings.min(31))
            .map_or(self.max, |d| d.min(self.max))
    }

    /// The failures in a row after a run of `ran` that ended a row of `before`.
    pub fn failures_after(before: u32, ran: Duration) -> u32 {
        if ran >= Self::STABLE {
            1
        } else {
            before.saturating_add(1)
        }
    }
}
