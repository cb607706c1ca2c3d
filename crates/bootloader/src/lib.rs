//! The [`Bootloader`] trait — status, upgrade, commit, revert — and its systemd-boot backend
//! [`SystemdBoot`], pure over the [`slate_disk::Disk`] trait: the ESP is read and written with
//! the userspace `fatfs` crate over a partition view, META with `slate-meta`, EFI variables
//! through the small [`EfiVars`] trait. No mounts, no syscalls.
//!
//! Which entry boots is answered by slate's own model of systemd-boot (`slate-bootspec`,
//! [`IdStyle::Sd252`] for Debian 12's loader), over what is actually on the disk. The crash
//! matrix (`tests/crash.rs`) replays every operation over a fault-injecting disk and asks that
//! model, for each power-cut state, which version boots.
//!
//! Write orders (each step durable — disk flushed — before the next starts):
//! - **upgrade**: prune to `keep_versions` (and more if the ESP lacks room) → new UKI under a hidden temp name → META
//!   `Upgrade` = the running entry's file name → drop stale `LoaderEntryDefault`/`OneShot` if the
//!   model says they would hide the new entry → rename the temp file to `<name>-<version>+<tries>.efi`
//!   (the flip: loader.conf's `default <name>-*` glob picks the highest version not bad).
//! - **commit**: bless the running entry (drop its counter) → delete META `Upgrade`.
//! - **revert**: mark the failed entry bad (`+0-DONE`) → delete META `Upgrade`.
//!
//! See `SystemdBoot`'s methods for why each order is safe.
//!
//! The GRUB backend [`Grub`] keeps two slots (`A/`, `B/`: kernel, initramfs, `cmdline.cfg`) on
//! the ESP and flips with grubenv: upgrade writes the inactive slot completely, then META
//! `Upgrade`, then `next_entry` (one shot); commit sets `saved_entry`; revert returns
//! `saved_entry` to the tag's slot. [`probe`] picks the backend a disk was installed with.
//!
//! One component per loader, as bootupd keeps one per boot loader: each loader's directory
//! also writes the boot entries of a Btrfs snapshot root (`sdboot::snapshots`: Type #1
//! entries with boot counting; `grub::snapshots`: GRUB's generated menu and grubenv), which
//! `slate-snapshot-engine` drives. Every backend opens the ESP through `slate_esp::session`.
//!
//! [`boot_options`]: slate's own firmware boot options, so that a loader that returns with an
//! error (a kernel that cannot start) is started again by the firmware, through the
//! [`BootVars`] trait.

pub mod boot_options;
mod efivars;
mod enrolled;
pub mod explain;
pub mod grub;
mod parts;
pub mod sdboot;

pub use efivars::{
    loader_vars, BootVars, EfiVars, EfiVarsError, MemBootVars, MemEfiVars, BOOT_ORDER,
    LOADER_ENTRY_DEFAULT, LOADER_ENTRY_LAST_BOOTED, LOADER_ENTRY_ONESHOT,
};
pub use enrolled::enrolled_db_auth;
pub use explain::{BootExplanation, EntryState, ExplainedEntry, NextBootReason};
pub use grub::{menu as grub_menu, Grub, GrubStatus, GrubWriteOrder, SlotPayload, SlotStatus};
pub use sdboot::{KexecPlan, SystemdBoot, DEFAULT_ENTRY_NAME};
pub use slate_bootspec::IdStyle;
pub use slate_disk::SectorBuffer;
pub use slate_esp::{fat_space, FatSpace, ReadOnly};

use slate_bootspec::{BootState, LoaderConf, Selection};

/// One UKI in `EFI/Linux`, as found on the ESP (directory order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryStatus {
    pub file_name: String,
    /// From the file name `<name>-<version>[+counter].efi` (the `.osrel` is not read).
    pub version: Option<String>,
    pub state: BootState,
    pub len: u64,
}

/// What is on the disk, and what the loader will do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootStatus {
    pub entries: Vec<EntryStatus>,
    /// Hidden temp files (`.<name>.tmp`) left by an interrupted write: never booted, reclaimed
    /// by the next upgrade.
    pub temp_files: Vec<String>,
    /// `loader/loader.conf` as parsed (`None` if absent or unparsable; see `warnings`).
    pub loader_conf: Option<LoaderConf>,
    /// META `Upgrade`: the label to return to while an upgrade is uncommitted.
    pub upgrade_tag: Option<String>,
    /// META `PinnedVersions` (empty when unreadable: see `warnings`).
    pub pinned: Vec<String>,
    /// The entry systemd-boot boots by default, by the selection model.
    pub selected: Option<Selection>,
    pub free_bytes: u64,
    pub warnings: Vec<String>,
}

impl BootStatus {
    /// The selected entry's file name.
    pub fn selected_file(&self) -> Option<&str> {
        self.selected.as_ref().map(|s| s.file_name.as_str())
    }

    /// The entry `reference` names: its file name (a GRUB slot label), or for systemd-boot
    /// any name or ID of it (with or without boot counter).
    pub fn entry(&self, reference: &str) -> Option<&EntryStatus> {
        self.entries.iter().find(|e| {
            e.file_name == reference
                || slate_bootspec::EntryName::parse(&e.file_name).is_ok_and(|name| {
                    slate_bootspec::refers_to(&slate_bootspec::Entry::new(name), reference)
                })
        })
    }
}

/// What to install by [`Bootloader::upgrade`].
#[derive(Debug, Clone, Copy)]
pub struct UpgradeRequest<'a> {
    pub uki: &'a [u8],
    /// Entry name, e.g. `slate` (the file is `<name>-<version>+<tries>.efi`).
    pub name: &'a str,
    pub version: &'a str,
    /// Boot-counting budget of the new entry (3 in slate).
    pub tries: u32,
    /// The entry the machine booted (file name, with or without counter, or an entry ID); it
    /// becomes the fallback and is never pruned.
    pub running_entry: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeOutcome {
    /// The new entry's file name.
    pub file_name: String,
    /// The label recorded in META `Upgrade`.
    pub fallback: String,
    /// Entries deleted to make room (or replaced: an older copy of the same version).
    pub removed: Vec<String>,
    /// EFI variables removed because they would have kept the old version booting.
    pub cleared_vars: Vec<&'static str>,
}

/// A rollback by hand ([`Bootloader::rollback`]): the previous version boots next, on trial,
/// with the running one recorded in META `Upgrade` as its fallback.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RollbackPlan {
    /// The running entry, recorded as the fallback (systemd-boot: its file name; GRUB: its
    /// slot).
    pub from: String,
    /// What it is renamed to: marked bad, so that it sorts after the previous version
    /// (systemd-boot); the same label on GRUB.
    pub from_marked: String,
    /// The previous version's entry as it is, and as it will be while on trial.
    pub to: String,
    pub to_on_trial: String,
    /// The previous version.
    pub version: String,
}

/// What [`Bootloader::pin`] left in META `PinnedVersions`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PinOutcome {
    /// Every pinned version, in the order they were pinned.
    pub pinned: Vec<String>,
    /// Whether the list changed (pinning a pinned version, or unpinning one that was not, does
    /// not write).
    pub changed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The running entry's file name after blessing.
    pub blessed: String,
    /// The Upgrade tag that was deleted, if any.
    pub previous: Option<String>,
}

/// Errors of every backend operation. Refusals (`Invalid*`, `NoRoom`, `*NotFound`,
/// `WouldNotBoot`) happen before the first write.
#[derive(Debug, thiserror::Error)]
pub enum BootloaderError {
    #[error("partition table")]
    Layout(#[from] slate_layout::LayoutError),
    #[error("EFI partition")]
    Esp(#[source] slate_esp::EspError),
    #[error("EFI partition: {action} {path}")]
    Fat {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("META partition")]
    Meta(#[from] slate_meta::MetaError),
    #[error("disk")]
    Disk(#[from] slate_disk::DiskError),
    #[error(transparent)]
    EfiVars(#[from] EfiVarsError),
    #[error("invalid upgrade: {0}")]
    Invalid(String),
    #[error("the EFI partition lacks room: {needed} bytes needed, {available} available even after pruning every entry that may go")]
    NoRoom { needed: u64, available: u64 },
    #[error("no boot entry matches {0:?}")]
    EntryNotFound(String),
    #[error("GRUB environment block {}", slate_esp::GRUBENV_PATH)]
    GrubEnv(#[from] slate_bootspec::GrubEnvError),
    #[error("after this change systemd-boot would boot {selected:?}, not {wanted:?}")]
    WouldNotBoot { wanted: String, selected: String },
    /// Why a restart cannot go by kexec (the caller restarts through the firmware).
    #[error("{0}")]
    NoKexec(String),
    /// A snapshot root's boot entry or menu (`sdboot::snapshots`, `grub::snapshots`) refused,
    /// before any write, or failed.
    #[error("ESP: {0}")]
    SnapshotEsp(String),
    /// A snapshot's name, entry text or menu entry refused.
    #[error(transparent)]
    Snapshot(#[from] slate_snapshot::SnapshotError),
}

/// The partition table and the disk are reported as such, whether the ESP's or META's.
impl From<slate_esp::EspError> for BootloaderError {
    fn from(err: slate_esp::EspError) -> Self {
        use slate_esp::EspError;
        match err {
            EspError::Layout(e) => Self::Layout(e),
            EspError::Disk(e) => Self::Disk(e),
            e => Self::Esp(e),
        }
    }
}

/// A boot loader slate drives. Every method reads or writes only the disk and EFI variables
/// the implementation was built over.
pub trait Bootloader {
    /// The entries, the Upgrade tag, and which entry boots next (pure read).
    fn status(&self) -> Result<BootStatus, BootloaderError>;
    /// Install a new version next to the running one and make it the default, recording the
    /// running entry in META `Upgrade`.
    fn upgrade(&mut self, request: &UpgradeRequest<'_>) -> Result<UpgradeOutcome, BootloaderError>;
    /// The running entry is good: bless it, then drop the Upgrade tag. Idempotent.
    fn commit(&mut self, running_entry: &str) -> Result<CommitOutcome, BootloaderError>;
    /// The running entry failed: return to the label in META `Upgrade` (returned), marking the
    /// failed entry bad, then drop the tag. `None` when there was nothing to revert to.
    fn revert(&mut self, failed_entry: &str) -> Result<Option<String>, BootloaderError>;
    /// Go back by hand: the previous version still on the disk boots next on trial (`tries`
    /// boot-counting attempts on systemd-boot, GRUB's one-shot `next_entry`), with the
    /// running entry recorded as its fallback, as an upgrade records it. Its boot is then
    /// committed or reverted like an upgrade's. Refused, before any write, while an upgrade
    /// is pending or when there is no previous version to go back to.
    fn rollback(
        &mut self,
        running_entry: &str,
        tries: u32,
    ) -> Result<RollbackPlan, BootloaderError>;
    /// The checks and the plan of [`Bootloader::rollback`], nothing written (a dry run).
    fn plan_rollback(
        &self,
        running_entry: &str,
        tries: u32,
    ) -> Result<RollbackPlan, BootloaderError>;
    /// Pin (`pin`) or unpin `version` in META `PinnedVersions`: pruning never deletes a pinned
    /// version's UKI. Only a version on the disk can be pinned; with `dry_run` the checks run
    /// and nothing is written. GRUB refuses: its two slots leave nothing to pin.
    fn pin(
        &mut self,
        version: &str,
        pin: bool,
        dry_run: bool,
    ) -> Result<PinOutcome, BootloaderError>;
    /// Every entry in menu order and which one boots next, and why (pure read; see
    /// [`explain`]).
    fn explain(&self) -> Result<BootExplanation, BootloaderError>;
    /// The UKI of the entry `reference` names (a file name, or an entry ID with or without
    /// boot counter, as [`BootStatus::entry`] resolves it), refused before it is read when it
    /// is longer than `limit` bytes (pure read; `slate upgrade --check` reads the booted one).
    /// GRUB refuses: its slots hold a kernel, an initramfs and a command line, not a UKI.
    fn read_uki(&self, reference: &str, limit: u64) -> Result<Vec<u8>, BootloaderError>;
    /// The entry `reference` names boots next, once (systemd-boot: `LoaderEntryOneShot`);
    /// refused before any write when it is not there, is marked bad, or an upgrade's trial
    /// boot comes next. Returns the entry's ID. GRUB refuses: its `next_entry` is the
    /// upgrade transaction's.
    fn boot_once(&mut self, reference: &str) -> Result<String, BootloaderError>;
}

/// Which boot loader a slate disk was installed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoaderKind {
    SystemdBoot,
    Grub,
}

/// The loader installed on `disk`: GRUB when its ESP holds `grub/grubenv` (the GRUB layout's
/// environment block), else systemd-boot. Reads only.
pub fn detect(disk: &impl slate_disk::Disk) -> Result<LoaderKind, BootloaderError> {
    let fs = slate_esp::session::mount_read_only(disk)?;
    let found = fs.root_dir().open_file(slate_esp::GRUBENV_PATH).is_ok();
    Ok(if found {
        LoaderKind::Grub
    } else {
        LoaderKind::SystemdBoot
    })
}

/// The backend for whatever loader `disk` was installed with (see [`detect`]); `vars` are the
/// EFI variables systemd-boot consults (GRUB has none).
pub fn probe<D, V>(disk: D, vars: V) -> Result<Box<dyn Bootloader>, BootloaderError>
where
    D: slate_disk::Disk + 'static,
    V: EfiVars + 'static,
{
    Ok(match detect(&disk)? {
        LoaderKind::Grub => Box::new(Grub::new(disk)),
        LoaderKind::SystemdBoot => Box::new(SystemdBoot::new(disk, vars)),
    })
}
