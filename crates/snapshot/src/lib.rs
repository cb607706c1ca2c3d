//! The Btrfs snapshot engine's decisions, as values (docs/formats.md §12): what an upgrade
//! names its snapshot, what its boot entry says, the integrity manifest and its HMAC, the
//! fstab rewrite, validation, pruning, the fallback and the rollback choice; and the ESP
//! writes (register, bless, rollback, remove) over the [`slate_disk::Disk`] trait, for
//! systemd-boot (`esp`) and GRUB (`grub`, `grub_menu`), replayed by the crash matrix. Subvolumes, files and processes are the edge's
//! (`slate-snapshot-engine`, `slate-host`).

pub mod entry;
pub mod esp;
pub mod fstab;
pub mod grub;
pub mod grub_menu;
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

/// Why a value was refused or an ESP operation failed.
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
    #[error("ESP: {0}")]
    Esp(String),
}

/// The steps of an upgrade, in order, as `--dry-run` prints them.
pub fn upgrade_plan(
    source: &str,
    new: &SnapshotName,
    change: &str,
    entry_file: &str,
    prune: &[SnapshotName],
    grub: bool,
) -> Vec<String> {
    let pruned = if prune.is_empty() {
        "nothing to prune".to_owned()
    } else {
        prune
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if grub {
        return vec![
            format!("(1) snapshot {source} -> {new} (writable, copy-on-write)"),
            format!("(2) upgrade {new}: {change}"),
            format!("(3) validate {new}: kernel + initramfs in /boot, /sbin/init, fstab root subvol={new}"),
            format!("(4) register: menu entry --id {new} in {} (GRUB reads its /boot in the pool)", grub_menu::MENU_PATH),
            format!("(5) manifest: HMAC-SHA256 over /usr and /boot -> .slate/manifests/{new}.manifest"),
            format!("(6) next boot: grubenv next_entry={new} (one-shot); saved_entry unchanged"),
            format!("(7) keep fallback {source}; prune: {pruned}"),
        ];
    }
    vec![
        format!("(1) snapshot {source} -> {new} (writable, copy-on-write)"),
        format!("(2) upgrade {new}: {change}"),
        format!("(3) validate {new}: kernel + initramfs in /boot, /sbin/init, fstab root subvol={new}"),
        format!("(4) register: copy kernel and initramfs to ESP:/{}/, entry loader/entries/{entry_file}", entry::esp_dir(new)),
        format!("(5) manifest: HMAC-SHA256 over /usr, /boot and the ESP copies -> .slate/manifests/{new}.manifest"),
        format!("(6) next boot: {entry_file} sorts first (loader.conf default {}); default pattern unchanged", entry::LOADER_DEFAULT),
        format!("(7) keep fallback {source}; prune: {pruned}"),
    ]
}
