//! The boot loader on the pool's ESP, chosen by what is there (docs/formats.md §12.9): slate's
//! GRUB layout for snapshot roots (`grub/grub.cfg` with its marker) means GRUB and its
//! generated menu (`slate_bootloader::grub::snapshots`); otherwise systemd-boot's Type #1
//! entries (`slate_bootloader::sdboot::snapshots`). One view of both for list, prune, commit
//! and rollback.
//!
//! GRUB has no "bad" mark and its one-shot leaves no trace once consumed, so on GRUB the engine
//! records what it put on trial, and what it rolled back from, under `<top>/.slate/grub/` (one
//! file per snapshot, `trial` or `bad`): outside every snapshot, beside the manifests, removed
//! with the snapshot. The records never change what boots (GRUB does not read them); they let
//! `list`, the fallback and pruning tell a trial that ended without a commit.

use std::collections::BTreeMap;
use std::fs;

use slate_bootloader::grub::snapshots::{self as grub, GrubScan, Mark};
use slate_bootloader::sdboot::snapshots as sdboot;
use slate_bootspec::BootState;
use slate_snapshot::SnapshotName;

use crate::tree::write_atomically;
use crate::{io_err, Pool, Result};

/// What the ESP says about the snapshots.
#[derive(Debug)]
pub(crate) enum Boot {
    SystemdBoot(sdboot::EspScan),
    Grub {
        scan: GrubScan,
        marks: BTreeMap<SnapshotName, Mark>,
        running: Option<SnapshotName>,
    },
}

/// The directory of GRUB trial and bad records on the top level.
const MARKS_DIR: &str = "grub";

impl Pool {
    fn marks_dir(&self) -> std::path::PathBuf {
        self.engine_dir().join(MARKS_DIR)
    }

    /// Records `mark` for `snapshot` (written and fsync'd before the ESP write it precedes).
    pub(crate) fn mark_boot(&self, snapshot: &SnapshotName, mark: Mark) -> Result<()> {
        let dir = self.marks_dir();
        fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        let text: &[u8] = match mark {
            Mark::Trial => b"trial\n",
            Mark::Bad => b"bad\n",
        };
        write_atomically(&dir.join(snapshot.as_str()), text, 0o600)
    }

    pub(crate) fn unmark_boot(&self, snapshot: &SnapshotName) -> Result<()> {
        let path = self.marks_dir().join(snapshot.as_str());
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("removing", &path)(e)),
            _ => Ok(()),
        }
    }

    /// The records; one that is neither `trial` nor `bad` counts as a trial (never good).
    fn boot_marks(&self) -> Result<BTreeMap<SnapshotName, Mark>> {
        let dir = self.marks_dir();
        let Ok(rd) = fs::read_dir(&dir) else {
            return Ok(BTreeMap::new());
        };
        let mut out = BTreeMap::new();
        for e in rd.filter_map(|e| e.ok()) {
            let Some(name) = e
                .file_name()
                .to_str()
                .and_then(|n| SnapshotName::parse(n).ok())
            else {
                continue;
            };
            let text = fs::read(e.path()).map_err(io_err("reading", &e.path()))?;
            let mark = if text == b"bad\n" {
                Mark::Bad
            } else {
                Mark::Trial
            };
            out.insert(name, mark);
        }
        Ok(out)
    }
}

impl Boot {
    /// Reads the ESP (read-only) and, on GRUB, the records.
    pub(crate) fn read(pool: &Pool) -> Result<Boot> {
        let disk = pool.open_esp_read_only()?;
        if grub::is_grub_layout(&disk)? {
            Ok(Boot::Grub {
                scan: grub::scan(&disk)?,
                marks: pool.boot_marks()?,
                running: pool.running.clone(),
            })
        } else {
            Ok(Boot::SystemdBoot(sdboot::scan(&disk)?))
        }
    }

    pub(crate) fn is_grub(&self) -> bool {
        matches!(self, Boot::Grub { .. })
    }

    pub(crate) fn state_of(&self, s: &SnapshotName) -> Option<BootState> {
        match self {
            Boot::SystemdBoot(scan) => scan.state_of(s),
            Boot::Grub {
                scan,
                marks,
                running,
            } => scan.state_of(s, running.as_ref(), marks.get(s).copied()),
        }
    }

    pub(crate) fn has_entry(&self, s: &SnapshotName) -> bool {
        self.entry_label(s).is_some()
    }

    /// The entry's file name (systemd-boot) or `menuentry <snapshot>` (GRUB).
    pub(crate) fn entry_label(&self, s: &SnapshotName) -> Option<String> {
        match self {
            Boot::SystemdBoot(scan) => scan.entry_of(s).map(|f| f.name.file_name().to_owned()),
            Boot::Grub { scan, .. } => scan
                .entry_of(s)
                .map(|e| format!("menuentry {}", e.snapshot)),
        }
    }

    /// The snapshot that boots next.
    pub(crate) fn next(&self) -> Option<SnapshotName> {
        match self {
            Boot::SystemdBoot(scan) => scan.selected().and_then(|f| f.snapshot.clone()),
            Boot::Grub { scan, .. } => scan.selected().map(|e| e.snapshot.clone()),
        }
    }

    pub(crate) fn next_label(&self) -> Option<String> {
        match self {
            Boot::SystemdBoot(scan) => scan.selected().map(|f| f.name.file_name().to_owned()),
            Boot::Grub { .. } => self.next().and_then(|s| self.entry_label(&s)),
        }
    }

    pub(crate) fn warnings(&self) -> Vec<String> {
        match self {
            Boot::SystemdBoot(scan) => scan.warnings.clone(),
            Boot::Grub { scan, .. } => scan.warnings.clone(),
        }
    }
}

/// Removes `snapshot`'s boot entry: systemd-boot's entry and ESP copies, or GRUB's menu entry.
pub(crate) fn remove_entry(pool: &Pool, snapshot: &SnapshotName) -> Result<()> {
    let mut disk = pool.open_esp()?;
    if grub::is_grub_layout(&disk)? {
        grub::remove(&mut disk, snapshot)?;
    } else {
        sdboot::remove(&mut disk, snapshot)?;
    }
    Ok(())
}

/// The state of `snapshot`'s entry, as `list` reports it (machined asks it after a failed
/// boot: only a snapshot on trial is rolled back).
pub fn boot_state(pool: &Pool, snapshot: &SnapshotName) -> Result<Option<BootState>> {
    Ok(Boot::read(pool)?.state_of(snapshot))
}
