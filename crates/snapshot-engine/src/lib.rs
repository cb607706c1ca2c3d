//! The Btrfs snapshot engine on a machine (docs/update-transaction.md, "Btrfs snapshots"):
//! `slate snapshot upgrade | commit | rollback | verify | generate-manifest | list | prune`.
//! Decisions are `slate-snapshot`'s values; this crate does the I/O around them: the pool's
//! top level mounted at `/run/slate/btrfs-<uuid>`, subvolumes through `slate-host`'s ioctls,
//! the manifest key and manifests under `<top>/.slate/`, the ESP's boot entries through
//! `slate-bootloader` (`sdboot::snapshots`, `grub::snapshots`) over the Disk trait.

mod boot;
pub mod mountinfo;
mod ops;
mod pool;
mod seed;
pub mod tree;
mod units;
mod upgrade;

use std::path::{Path, PathBuf};

pub use boot::boot_state;
pub use ops::{
    commit, generate_manifest, list, prune, rollback, verify, verify_one, CommitOutcome, ListEntry,
    Listing, RollbackOutcome, VerifyOutcome,
};
pub use pool::{Pool, ENGINE_DIR};
pub use seed::{seed_engine_dir, SeedReport};
pub use slate_snapshot::policy::VerifyPolicy;
pub use units::install_units;
pub use upgrade::{clean_up_interrupted, upgrade, Change, UpgradeOptions, UpgradeReport};

/// Why a snapshot command failed. Every message names the step and the path.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Host(#[from] slate_host::HostError),
    #[error(transparent)]
    Snapshot(#[from] slate_snapshot::SnapshotError),
    #[error(transparent)]
    Boot(#[from] slate_bootloader::BootloaderError),
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// The pool's lock is held: by another `slate snapshot` command, or by machined settling
    /// the boot. Nothing was done.
    #[error("another slate snapshot command holds {}", .0.display())]
    Locked(PathBuf),
    #[error("validation of {snapshot} failed: {}", problems.join("; "))]
    Validation {
        snapshot: String,
        problems: Vec<String>,
    },
    #[error("the upgrade command failed in {snapshot}: {status}")]
    CommandFailed { snapshot: String, status: String },
    #[error("interrupted by {0}; the half-built snapshot was removed")]
    Interrupted(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

pub(crate) fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_path_buf();
    move |source| EngineError::Io {
        action,
        path,
        source,
    }
}
