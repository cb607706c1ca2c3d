//! `slate installer rollback --disk D`: the rollback by hand on a disk that is not running —
//! the previous version on trial with the entry the loader boots now recorded as its fallback
//! ([`slate_bootloader::Bootloader::rollback`], the node's `POST /v1/rollback`). Offline there
//! are no firmware variables: the entry "running" is the one the loader would boot.

use std::path::{Path, PathBuf};

use slate_bootloader::{BootloaderError, MemEfiVars, RollbackPlan};
use slate_bootspec::InstallTriesError;
use slate_disk::FileDisk;

#[derive(Debug, thiserror::Error)]
pub enum RollbackModeError {
    #[error(transparent)]
    Tries(#[from] InstallTriesError),
    #[error("opening {}", disk.display())]
    Open {
        disk: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the boot entries on {}", disk.display())]
    BootEntries {
        disk: PathBuf,
        #[source]
        source: BootloaderError,
    },
    #[error("the boot loader on {} would boot nothing: nothing to roll back from", disk.display())]
    NothingBoots { disk: PathBuf },
    #[error("rolling back {} from {running}", disk.display())]
    Refused {
        disk: PathBuf,
        running: String,
        #[source]
        source: BootloaderError,
    },
}

/// Roll `disk` back (or, with `dry_run`, plan it with the disk opened read-only).
pub fn rollback(disk: &Path, tries: u32, dry_run: bool) -> Result<RollbackPlan, RollbackModeError> {
    let tries = slate_bootspec::check_install_tries(tries)?;
    let opened = if dry_run {
        FileDisk::open_read_only(disk)
    } else {
        FileDisk::open(disk)
    }
    .map_err(|source| RollbackModeError::Open {
        disk: disk.to_owned(),
        source,
    })?;
    let entries_error = |source| RollbackModeError::BootEntries {
        disk: disk.to_owned(),
        source,
    };
    let mut loader = slate_bootloader::probe(opened, MemEfiVars::new()).map_err(entries_error)?;
    let running = loader
        .status()
        .map_err(entries_error)?
        .selected_file()
        .map(str::to_owned)
        .ok_or_else(|| RollbackModeError::NothingBoots {
            disk: disk.to_owned(),
        })?;
    let outcome = if dry_run {
        loader.plan_rollback(&running, tries)
    } else {
        loader.rollback(&running, tries)
    };
    outcome.map_err(|source| RollbackModeError::Refused {
        disk: disk.to_owned(),
        running,
        source,
    })
}
