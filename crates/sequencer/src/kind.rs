//! The sequences machined knows, and which of them may preempt which.

use std::fmt;
use std::str::FromStr;

/// A lifecycle sequence. Names follow Talos (`initialize`, `stageUpgrade`, …), so events and
/// logs read the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SequenceKind {
    /// First after switch-root: requirements, early services, META, configuration.
    Initialize,
    /// Installs to disk and reboots; does real work only when the node is not installed.
    Install,
    /// Brings an installed node up (STATE, EPHEMERAL, the API, health).
    Boot,
    /// Stops services and powers off.
    Shutdown,
    /// Installs a new image into the other slot and reboots into it.
    Upgrade,
    /// Records an upgrade to be applied on the next boot.
    StageUpgrade,
    /// Wipes the node's state and reboots (or powers off).
    Reset,
    /// Stops services and reboots.
    Reboot,
    /// Frees space on the system volumes when they are too full to boot normally.
    EmergencyVolumeCleanup,
}

impl SequenceKind {
    /// Every kind, in declaration order.
    pub const ALL: [SequenceKind; 9] = [
        SequenceKind::Initialize,
        SequenceKind::Install,
        SequenceKind::Boot,
        SequenceKind::Shutdown,
        SequenceKind::Upgrade,
        SequenceKind::StageUpgrade,
        SequenceKind::Reset,
        SequenceKind::Reboot,
        SequenceKind::EmergencyVolumeCleanup,
    ];

    /// The name used in logs, events and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            SequenceKind::Initialize => "initialize",
            SequenceKind::Install => "install",
            SequenceKind::Boot => "boot",
            SequenceKind::Shutdown => "shutdown",
            SequenceKind::Upgrade => "upgrade",
            SequenceKind::StageUpgrade => "stageUpgrade",
            SequenceKind::Reset => "reset",
            SequenceKind::Reboot => "reboot",
            SequenceKind::EmergencyVolumeCleanup => "emergencyVolumeCleanup",
        }
    }
}

impl fmt::Display for SequenceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sequence name that is not one of [`SequenceKind::as_str`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sequence {0:?}")]
pub struct ParseSequenceKindError(pub String);

impl FromStr for SequenceKind {
    type Err = ParseSequenceKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SequenceKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| ParseSequenceKindError(s.to_owned()))
    }
}

/// Whether a `requested` sequence may preempt (cancel) the `running` one.
///
/// The matrix is deliberately small and asymmetric:
///
/// | running ↓ / requested → | reboot | reset | upgrade | emergencyVolumeCleanup |
/// |-------------------------|--------|-------|---------|------------------------|
/// | boot                    | yes    | yes   | yes     | yes                    |
/// | reboot                  | yes    | no    | no      | no                     |
/// | reset                   | yes    | no    | no      | no                     |
///
/// and no for every other pair. Boot yields to what an operator or controller fires while a
/// node is still coming up; upgrade and reset never preempt each other (either could leave the
/// disk half-written); only a reboot preempts a reboot or a reset (the operator insists). A
/// running Initialize, Install, Upgrade, … yields to nothing except the explicit takeover
/// ([`PriorityLock::lock_with_takeover`](crate::PriorityLock::lock_with_takeover)).
pub fn can_take_over(running: SequenceKind, requested: SequenceKind) -> bool {
    use SequenceKind::{Boot, EmergencyVolumeCleanup, Reboot, Reset, Upgrade};
    matches!(
        (running, requested),
        (Boot, Reboot | Reset | Upgrade | EmergencyVolumeCleanup)
            | (Reboot, Reboot)
            | (Reset, Reboot)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in SequenceKind::ALL {
            assert_eq!(kind.as_str().parse::<SequenceKind>(), Ok(kind));
        }
        assert!("Boot".parse::<SequenceKind>().is_err());
    }
}
