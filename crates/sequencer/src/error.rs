//! Typed sequence errors, and what the top-level handler should do about each.

use std::error::Error;
use std::fmt;
use std::str::FromStr;

use crate::kind::SequenceKind;

/// Why the lock was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Another sequence runs and the requested one may not take it over.
    #[error("locked: the {running} sequence is running")]
    Locked {
        /// The sequence holding (or about to hold) the lock.
        running: SequenceKind,
    },
    /// The running sequence was cancelled but did not release the lock within the takeover
    /// timeout.
    #[error("takeover timed out: the {running} sequence did not stop")]
    TakeoverTimeout {
        /// The sequence still holding the lock.
        running: SequenceKind,
    },
}

/// How the node goes down once a sequence asks for it.
///
/// Also the node API's `RebootMode` (feature `serde`): the wire carries `default`,
/// `powercycle` and `kexec` only; the shutdown sequence uses [`PowerOff`](Self::PowerOff), which the API
/// neither accepts nor sends (a reboot request must not power a node off). The sequencer only
/// carries the value: acting on it is the top-level handler's job, after teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum RebootMode {
    /// Restart the way the node is configured to (`[reboot] mode` in its machine
    /// configuration or image): kexec when that says `kexec`, else through the firmware.
    #[default]
    Default,
    /// Restart through the firmware, never kexec (for a clean hardware reset).
    Powercycle,
    /// Restart by kexec into the entry the boot loader would start next, skipping the
    /// firmware; the node falls back to the firmware when kexec cannot be used (and says why).
    Kexec,
    /// Power the machine off instead of restarting.
    #[cfg_attr(feature = "serde", serde(skip))]
    PowerOff,
}

impl RebootMode {
    /// The lowercase name used by the API and the client.
    pub fn as_str(self) -> &'static str {
        match self {
            RebootMode::Default => "default",
            RebootMode::Powercycle => "powercycle",
            RebootMode::Kexec => "kexec",
            RebootMode::PowerOff => "poweroff",
        }
    }
}

impl fmt::Display for RebootMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reboot mode name that is not one of `default`, `powercycle`, `kexec`, `poweroff`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reboot mode {0:?} (expected default, powercycle, kexec or poweroff)")]
pub struct ParseRebootModeError(pub String);

impl FromStr for RebootMode {
    type Err = ParseRebootModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(RebootMode::Default),
            "powercycle" => Ok(RebootMode::Powercycle),
            "kexec" => Ok(RebootMode::Kexec),
            "poweroff" => Ok(RebootMode::PowerOff),
            other => Err(ParseRebootModeError(other.to_owned())),
        }
    }
}

/// How the text of a [`SequenceError::Reboot`] begins: the event stream carries sequence errors
/// as text, and a watcher must not take a reboot for a failure.
pub const REBOOT_REQUESTED: &str = "reboot requested";

/// Why a sequence did not complete.
///
/// Rebooting is an error on purpose: a task never reboots the machine itself, it returns
/// [`Reboot`](Self::Reboot) and the error unwinds — remaining phases unrun — to machined's
/// top-level handler, which tears down (kill processes, unmount, sync) before rebooting. Match on
/// [`disposition`](Self::disposition) there.
#[derive(Debug, thiserror::Error)]
pub enum SequenceError {
    /// A task asked for the node to go down; not a failure.
    #[error("reboot requested (mode {mode})")]
    Reboot {
        /// How to go down.
        mode: RebootMode,
    },
    /// Another sequence holds the lock and may not be taken over by this one.
    #[error("locked: the {running} sequence is running")]
    Locked {
        /// The sequence holding the lock.
        running: SequenceKind,
    },
    /// The sequence holding the lock was cancelled for a takeover but did not release it in
    /// time: one of its tasks ignores cancellation.
    #[error("takeover timed out: the {running} sequence did not stop")]
    TakeoverTimeout {
        /// The sequence still holding the lock.
        running: SequenceKind,
    },
    /// The sequence was cancelled (taken over) before it completed.
    #[error("{sequence} sequence cancelled")]
    Cancelled {
        /// The sequence that stopped.
        sequence: SequenceKind,
    },
    /// A task failed (or panicked); the sequence stopped after that phase's tasks finished.
    #[error("{sequence} sequence: phase {phase}: task {task} failed")]
    Fatal {
        /// The sequence that stopped.
        sequence: SequenceKind,
        /// The failing task's phase.
        phase: String,
        /// The failing task.
        task: String,
        /// What the task reported.
        #[source]
        source: Box<dyn Error + Send + Sync + 'static>,
    },
}

/// What machined's top-level handler does with a sequence's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Tear down, then go down as requested.
    Reboot(RebootMode),
    /// Nothing: the node keeps running (the lock was busy, or a takeover is in charge now).
    Swallow,
    /// Tear down, revert the bootloader if an upgrade was in flight, reboot — or with `panic=0`
    /// wait forever so the failure can be inspected.
    Fatal,
}

impl SequenceError {
    /// Locked and Cancelled are expected outcomes of contention, not faults: the sequence that
    /// won is in charge, so the node keeps running.
    pub fn is_swallowed(&self) -> bool {
        matches!(
            self,
            SequenceError::Locked { .. } | SequenceError::Cancelled { .. }
        )
    }

    /// The handler's action for this error.
    ///
    /// A takeover timeout is fatal, not swallowed: the running sequence is wedged (it ignores
    /// cancellation), and the fatal path's teardown and reboot is the way out of that.
    pub fn disposition(&self) -> Disposition {
        match self {
            SequenceError::Reboot { mode } => Disposition::Reboot(*mode),
            _ if self.is_swallowed() => Disposition::Swallow,
            _ => Disposition::Fatal,
        }
    }
}

impl From<LockError> for SequenceError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Locked { running } => SequenceError::Locked { running },
            LockError::TakeoverTimeout { running } => SequenceError::TakeoverTimeout { running },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reboot_reads_as_one_in_the_event_stream() {
        let reboot = SequenceError::Reboot {
            mode: RebootMode::Default,
        };
        assert!(reboot.to_string().starts_with(REBOOT_REQUESTED));
        let locked = SequenceError::Locked {
            running: SequenceKind::Boot,
        };
        assert!(!locked.to_string().starts_with(REBOOT_REQUESTED));
    }
}
