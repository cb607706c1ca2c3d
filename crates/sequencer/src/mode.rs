//! Runtime modes and the capabilities each allows.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign, Sub};
use std::str::FromStr;

/// Operations a runtime mode may or may not allow. A hand-rolled bit set (no dependency for
/// five flags); bit values follow Talos' `ModeCapability`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(u64);

impl Capabilities {
    /// Rebooting the node.
    pub const REBOOT: Self = Self(1 << 0);
    /// Rolling back to the other boot slot.
    pub const ROLLBACK: Self = Self(1 << 1);
    /// Shutting the node down.
    pub const SHUTDOWN: Self = Self(1 << 2);
    /// Upgrading the node's image.
    pub const UPGRADE: Self = Self(1 << 3);
    /// Reading and writing the META partition.
    pub const META_KV: Self = Self(1 << 4);

    /// No capability.
    pub const NONE: Self = Self(0);
    /// Every capability.
    pub const ALL: Self = Self(0b1_1111);

    const NAMES: [(Self, &'static str); 5] = [
        (Self::REBOOT, "Reboot"),
        (Self::ROLLBACK, "Rollback"),
        (Self::SHUTDOWN, "Shutdown"),
        (Self::UPGRADE, "Upgrade"),
        (Self::META_KV, "MetaKV"),
    ];

    /// The raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// The set with these bits, unknown bits dropped.
    pub const fn from_bits_truncate(bits: u64) -> Self {
        Self(bits & Self::ALL.0)
    }

    /// Whether every capability in `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Capabilities {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for Capabilities {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for Capabilities {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

impl Sub for Capabilities {
    type Output = Self;
    fn sub(self, rhs: Self) -> Self {
        Self(self.0 & !rhs.0)
    }
}

impl fmt::Debug for Capabilities {
    /// `Capabilities(Reboot | Upgrade)`, readable in test failures.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| *name)
            .collect();
        if names.is_empty() {
            write!(f, "Capabilities(none)")
        } else {
            write!(f, "Capabilities({})", names.join(" | "))
        }
    }
}

/// Where the node runs. The same sequences run everywhere; the mode decides which operations
/// make sense (a container cannot reboot its host or rewrite a boot disk).
///
/// Also the node API's `Mode` (feature `serde`): on the wire it is the same lowercase name as
/// on the kernel command line ([`Mode::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum Mode {
    /// A cloud VM: installed by the platform, so no install step.
    Cloud,
    /// A container: no reboot, shutdown, upgrade, rollback or META of its own.
    Container,
    /// Bare metal (or a local VM) that installs itself to disk.
    Metal,
    /// Bare metal managed by an agent.
    MetalAgent,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 4] = [Mode::Cloud, Mode::Container, Mode::Metal, Mode::MetalAgent];

    /// The lowercase name used on the kernel command line and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Cloud => "cloud",
            Mode::Container => "container",
            Mode::Metal => "metal",
            Mode::MetalAgent => "metal-agent",
        }
    }

    /// Parses a mode name (`cloud`, `container`, `metal`, `metal-agent`), exactly — a
    /// misspelled mode on the command line is refused, not guessed.
    pub fn parse(name: &str) -> Result<Mode, ParseModeError> {
        Mode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == name)
            .ok_or_else(|| ParseModeError(name.to_owned()))
    }

    /// What the mode allows: everything, except in a container, where the five operations
    /// that belong to the host (reboot, rollback, shutdown, upgrade, META) are stripped.
    pub fn capabilities(self) -> Capabilities {
        match self {
            Mode::Cloud | Mode::Metal | Mode::MetalAgent => Capabilities::ALL,
            Mode::Container => {
                Capabilities::ALL
                    - (Capabilities::REBOOT
                        | Capabilities::SHUTDOWN
                        | Capabilities::UPGRADE
                        | Capabilities::ROLLBACK
                        | Capabilities::META_KV)
            }
        }
    }

    /// Whether the mode allows `capability`.
    pub fn supports(self, capability: Capabilities) -> bool {
        self.capabilities().contains(capability)
    }

    /// Whether the node installs itself to disk (the Install sequence does real work): only
    /// on metal; a cloud image is already installed, a container has no disk of its own.
    pub fn requires_install(self) -> bool {
        self == Mode::Metal
    }

    /// Whether the node runs in a container.
    pub fn in_container(self) -> bool {
        self == Mode::Container
    }

    /// Whether the node runs as an agent.
    pub fn is_agent(self) -> bool {
        self == Mode::MetalAgent
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::parse(s)
    }
}

/// A mode name that is not one of `cloud`, `container`, `metal`, `metal-agent`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown runtime mode {0:?} (expected cloud, container, metal or metal-agent)")]
pub struct ParseModeError(pub String);
