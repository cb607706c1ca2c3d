//! The Btrfs snapshot engine's decisions, as values (docs/formats.md §12): what an upgrade
//! names its snapshot, what its boot entry says, the integrity manifest and its HMAC, the
//! fstab rewrite, validation, pruning, the fallback and the rollback choice. No I/O: the boot
//! entries are written to the ESP by `slate-bootloader` (`sdboot::snapshots`,
//! `grub::snapshots`), with the boot loaders' other writes; subvolumes, files and processes
//! are the edge's (`slate-snapshot-engine`, `slate-host`).

pub mod entry;
pub mod fstab;
pub mod manifest;
mod name;
pub mod policy;
pub mod units;
pub mod validate;

pub use name::{SnapshotName, PREFIX};

/// The pool's subvolume mounted at `/home` on a slate snapshot root: outside every snapshot,
/// so a rollback keeps it (formats.md §12.8).
pub const HOME_SUBVOLUME: &str = "@home";
/// The pool's subvolume mounted at `/system/state`: the machine configuration
/// (`config/machine.toml`) and what machined keeps on STATE on an A/B disk.
pub const STATE_SUBVOLUME: &str = "@state";

/// Why a value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("invalid snapshot name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("{0}")]
    Invalid(String),
    #[error("manifest line {line}: {reason}")]
    BadManifest { line: usize, reason: String },
    #[error("the manifest's HMAC does not match: it was changed, or written under another key")]
    BadMac,
    #[error("fstab: {0}")]
    Fstab(String),
    #[error("rollback refused: {0}")]
    NoRollbackTarget(String),
}
