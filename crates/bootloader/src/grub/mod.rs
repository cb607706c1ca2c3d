//! The GRUB backend: two slots `A/` and `B/` on the ESP (kernel, initramfs, `cmdline.cfg`), a
//! static `grub/grub.cfg`, and the environment block `grub/grubenv` choosing the slot
//! (`next_entry` one shot, `saved_entry` default) — the layout of [`config`].
//!
//! Everything goes through the [`Disk`] trait: the ESP with `fatfs` behind a [`SectorBuffer`],
//! META with `slate-meta`, as in the systemd-boot backend. `grubenv` is rewritten whole (1024
//! bytes) over its own clusters, never re-created: GRUB's `save_env` writes it in place through
//! the block list it finds at boot.
//!
//! Which slot boots is answered by [`slate_bootspec::grub_select`], over what is on the disk.
//! The crash matrix (`tests/grub_crash.rs`) replays upgrade, commit and revert over a
//! fault-injecting disk and asks that model, for every power-cut state, which slot boots.
//!
//! Beside this file: what is read in one pass (`status.rs`), the upgrade's writes
//! (`upgrade.rs`), rollback, the second record, `slate boot explain`'s value (`explain.rs`),
//! the text GRUB reads ([`config`]), and GRUB on a Btrfs snapshot root ([`snapshots`]), which
//! shares grub.cfg's choice of entry and the environment block writer (`write_block`).

pub mod config;
pub(crate) mod explain;
mod record;
mod rollback;
pub mod snapshots;
mod status;
mod upgrade;

pub use status::{GrubStatus, SlotStatus};

use config::{grub_entry_title, parse_slot_cmdline_cfg};

use slate_bootspec::{
    BootState, GrubEnv, GrubEnvError, GrubMenuEntry, GrubReason, Reason, Selection,
};
use slate_disk::Disk;
use slate_esp::{
    session, EspError, GRUBENV_PATH, GRUB_SLOTS, SLOT_CMDLINE, SLOT_INITRAMFS, SLOT_KERNEL,
};

use crate::parts::{self, invalid, Result};
use crate::{
    BootStatus, Bootloader, BootloaderError, CommitOutcome, EntryStatus, UpgradeOutcome,
    UpgradeRequest,
};

/// What a slot boots: the pieces of a UKI, laid out for GRUB.
#[derive(Clone, PartialEq, Eq)]
pub struct SlotPayload {
    pub kernel: Vec<u8>,
    pub initramfs: Vec<u8>,
    pub cmdline: String,
}

impl std::fmt::Debug for SlotPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPayload")
            .field("kernel", &format_args!("<{} bytes>", self.kernel.len()))
            .field(
                "initramfs",
                &format_args!("<{} bytes>", self.initramfs.len()),
            )
            .field("cmdline", &self.cmdline)
            .finish()
    }
}

impl SlotPayload {
    /// The `.linux`, `.initrd` and `.cmdline` sections of a UKI (bundles carry UKIs; GRUB
    /// boots their parts).
    pub fn from_uki(uki: &[u8]) -> Result<Self> {
        let section = |name: &str| {
            slate_uki::section_data(uki, name)
                .map_err(|e| invalid(format!("the UKI: {e}")))?
                .ok_or_else(|| invalid(format!("the UKI has no {name} section")))
        };
        let cmdline = String::from_utf8_lossy(section(".cmdline")?)
            .trim_end_matches(['\0', '\n', ' '])
            .to_owned();
        Ok(Self {
            kernel: section(".linux")?.to_vec(),
            initramfs: section(".initrd")?.to_vec(),
            cmdline,
        })
    }
}

/// The menu slate's `grub.cfg` declares.
pub fn menu() -> Vec<GrubMenuEntry> {
    GRUB_SLOTS
        .iter()
        .map(|s| GrubMenuEntry {
            title: grub_entry_title(s),
            id: (*s).to_owned(),
        })
        .collect()
}

/// The order of an upgrade's writes. [`GrubWriteOrder::SlotThenFlip`] is what slate uses; the
/// other exists so the crash matrix can show why (`tests/grub_crash.rs`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GrubWriteOrder {
    #[default]
    SlotThenFlip,
    FlipThenSlot,
}

/// GRUB on a whole disk with the slate layout (partitions `EFI` and `META`, the GRUB files of
/// [`config`] on the ESP).
#[derive(Debug)]
pub struct Grub<D> {
    disk: D,
    source_date_epoch: u64,
    order: GrubWriteOrder,
}

impl<D: Disk> Grub<D> {
    pub fn new(disk: D) -> Self {
        Self {
            disk,
            source_date_epoch: 0,
            order: GrubWriteOrder::default(),
        }
    }

    pub fn with_source_date_epoch(mut self, epoch: u64) -> Self {
        self.source_date_epoch = epoch;
        self
    }

    #[doc(hidden)]
    pub fn with_write_order(mut self, order: GrubWriteOrder) -> Self {
        self.order = order;
        self
    }

    pub fn disk(&self) -> &D {
        &self.disk
    }

    pub fn into_disk(self) -> D {
        self.disk
    }

    /// The content of a file on the ESP (`/`-separated path).
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        parts::read_esp_file(&self.disk, path)
    }

    /// A slot's payload and version, if it is complete.
    pub fn read_slot(&self, label: &str) -> Result<(SlotPayload, String)> {
        let cfg = self.read_file(&format!("{label}/{SLOT_CMDLINE}"))?;
        let (version, cmdline) = parse_slot_cmdline_cfg(&String::from_utf8_lossy(&cfg))
            .ok_or_else(|| invalid(format!("{label}/{SLOT_CMDLINE} is not slate's")))?;
        Ok((
            SlotPayload {
                kernel: self.read_file(&format!("{label}/{SLOT_KERNEL}"))?,
                initramfs: self.read_file(&format!("{label}/{SLOT_INITRAMFS}"))?,
                cmdline,
            },
            version,
        ))
    }

    /// META `Upgrade` set to `label` (`Some`) or deleted (`None`), flushed (both copies).
    fn set_tag(&mut self, label: Option<&str>) -> Result<()> {
        parts::set_upgrade_tag(&mut self.disk, label)
    }

    /// Rewrite `grub/grubenv` in place: the same 1024 bytes over the same clusters (flushed).
    fn write_env(&mut self, env: &GrubEnv) -> Result<()> {
        write_block(&mut self.disk, self.source_date_epoch, GRUBENV_PATH, env)
    }

    /// What GRUB does at power-on, for tests and dry runs: select, consume a one-shot
    /// `next_entry` (grubenv rewritten in place, as `save_env` does), start the selected slot
    /// or — if it is incomplete — the fallback. Returns the slot started.
    pub fn simulate_boot(&mut self) -> Result<Option<&'static str>> {
        let status = self.grub_status()?;
        if let Some(after) = status.selection.as_ref().and_then(|s| s.env_after.clone()) {
            self.write_env(&after)?;
        }
        Ok(status.booted_slot())
    }
}

/// An environment block (grubenv, the second record) rewritten in place, flushed: the same
/// 1024 bytes over the same clusters, as GRUB's `save_env` writes it. A block of another
/// length is refused as GRUB's reader refuses it.
pub(crate) fn write_block<D: Disk>(
    disk: &mut D,
    source_date_epoch: u64,
    path: &str,
    env: &GrubEnv,
) -> Result<()> {
    session::rewrite_in_place(disk, source_date_epoch, path, &env.to_bytes()).map_err(|e| match e {
        EspError::WrongLength { len, .. } => {
            let err = GrubEnvError::WrongLength { len: len as usize };
            if path == GRUBENV_PATH {
                err.into()
            } else {
                invalid(format!("{path}: {err}"))
            }
        }
        EspError::File {
            path,
            action,
            source,
        } => BootloaderError::Fat {
            action,
            path,
            source,
        },
        e => e.into(),
    })
}

impl<D: Disk> Bootloader for Grub<D> {
    /// Slots as entries (file name = slot label, state Good when complete, Bad when not),
    /// the Upgrade tag, and the slot GRUB boots (`selected`: reason `OneShot` for
    /// `next_entry`, `EfiDefault` for `saved_entry`, `FirstAutoSelectable` otherwise).
    fn status(&self) -> Result<BootStatus> {
        let s = self.grub_status()?;
        let entries = s
            .slots
            .iter()
            .map(|slot| EntryStatus {
                file_name: slot.label.to_owned(),
                version: slot.version().map(str::to_owned),
                state: if slot.complete() {
                    BootState::Good
                } else {
                    BootState::Bad
                },
                len: slot.len(),
            })
            .collect();
        let selected = s.booted_slot().map(|label| {
            let index = GRUB_SLOTS.iter().position(|l| *l == label).unwrap_or(0);
            let sel = s.selection.as_ref().expect("a booted slot was selected");
            Selection {
                index,
                menu_position: index,
                file_name: label.to_owned(),
                id: label.to_owned(),
                reason: match sel.reason {
                    _ if sel.index != index => Reason::EfiDefault,
                    GrubReason::NextEntry => Reason::OneShot,
                    GrubReason::SavedEntry => Reason::EfiDefault,
                    GrubReason::FirstEntry => Reason::FirstAutoSelectable,
                },
            }
        });
        let mut warnings = s.warnings.clone();
        for (name, value) in s.env.vars() {
            warnings.push(format!("grubenv: {name}={value}"));
        }
        Ok(BootStatus {
            entries,
            temp_files: s.temp_files.clone(),
            loader_conf: None,
            upgrade_tag: s.upgrade_tag.clone(),
            pinned: Vec::new(),
            selected,
            free_bytes: s.space.free_clusters * s.space.cluster_size,
            warnings,
        })
    }

    fn explain(&self) -> Result<crate::BootExplanation> {
        Ok(explain::explain(&self.grub_status()?))
    }

    /// Refused before anything is read.
    fn boot_once(&mut self, reference: &str) -> Result<String> {
        Err(invalid(format!(
            "cannot boot {reference} once on a GRUB disk: its one-shot (grubenv next_entry) \
             belongs to the upgrade transaction"
        )))
    }

    fn read_uki(&self, reference: &str, _limit: u64) -> Result<Vec<u8>> {
        Err(invalid(format!(
            "slot {reference} holds no UKI: a GRUB slot is a kernel, an initramfs and a command \
             line"
        )))
    }

    /// Every check first — the UKI splits into kernel, initramfs and command line; grubenv
    /// parses (a corrupted, oversized or unsigned block is refused here, before any write) and
    /// `next_entry` fits; the running slot is complete; the inactive slot is not GRUB's saved
    /// default; it has room — then:
    ///
    /// 0. if the second record (`grub/slate-default.env`) lags grubenv's `saved_entry` (a
    ///    commit cut after its grubenv write), it is brought in line (flush): the record never
    ///    names the slot being emptied, so a damaged grubenv still boots the running slot;
    /// 1. empty the inactive slot, `cmdline.cfg` first (flush), and write kernel, initramfs,
    ///    `cmdline.cfg` (each temp name → rename, flushed). The slot is named by nothing in
    ///    grubenv, so a cut here boots the running slot, untouched;
    /// 2. META `Upgrade` = the running slot (copy 1, flush, copy 2, flush): the way back is
    ///    known before anything can boot the new slot;
    /// 3. the flip: grubenv `next_entry=<new slot>`, rewritten in place (flush). A one-shot:
    ///    GRUB consumes it before starting the slot, so a new version that dies before its
    ///    commit returns to `saved_entry` (the running slot) on the next boot, unattended.
    ///
    /// Why not flip first (the first idea): with `next_entry` set before the slot is
    /// complete, a cut mid-write makes GRUB start a slot holding the new kernel with the old
    /// initramfs (or none) once — and should that mix come up, it would be committed. The
    /// crash matrix shows such states for the flip-first order (`tests/grub_crash.rs`); with
    /// this order it finds none.
    fn upgrade(&mut self, req: &UpgradeRequest<'_>) -> Result<UpgradeOutcome> {
        let payload = SlotPayload::from_uki(req.uki)?;
        self.upgrade_slot(&payload, req.version, req.running_entry)
    }

    /// `saved_entry` = the running slot, `next_entry` and `recordfail` cleared (unless
    /// `next_entry` names the other slot: an upgrade staged since this boot stays staged),
    /// flushed; the second record names the running slot (flush); then META `Upgrade` deleted
    /// (flush). A cut between them leaves the running slot the default and the tag: the next
    /// boot commits again (every step is idempotent, the record written when it differs).
    fn commit(&mut self, running_entry: &str) -> Result<CommitOutcome> {
        let status = self.grub_status()?.writable()?;
        let running = status
            .slot(running_entry)
            .ok_or_else(|| BootloaderError::EntryNotFound(running_entry.to_owned()))?;
        let label = GRUB_SLOTS[running];
        if !status.slots[running].complete() {
            return Err(invalid(format!("slot {label} is incomplete")));
        }
        let mut env = status.env.clone();
        env.set("saved_entry", label)?;
        let staged = env
            .get_nonempty("next_entry")
            .and_then(|n| status.slot(n))
            .is_some_and(|n| n != running);
        if !staged {
            env.unset("next_entry");
        }
        env.unset("recordfail");
        if env != status.env {
            self.write_env(&env)?;
        }
        self.sync_record(&status, label)?;
        let previous = status.upgrade_tag.clone();
        if previous.is_some() {
            self.set_tag(None)?;
        }
        Ok(CommitOutcome {
            blessed: label.to_owned(),
            previous,
        })
    }

    /// `saved_entry` = the slot in META `Upgrade`, `next_entry` cleared (flush), the second
    /// record names that slot (flush), then the tag deleted (flush). GRUB has no "bad" mark: the failed slot is simply no longer named. A
    /// cut before the grubenv write changes nothing (after a one-shot, saved_entry already
    /// names the previous slot; the tag is still there for the next failure or commit); after
    /// it, the previous slot boots with the tag naming itself, and its commit clears it.
    fn rollback(&mut self, running_entry: &str, _tries: u32) -> Result<crate::RollbackPlan> {
        let plan = self.plan_slot_rollback(running_entry)?;
        self.execute_slot_rollback(&plan)?;
        Ok(plan)
    }

    fn plan_rollback(&self, running_entry: &str, _tries: u32) -> Result<crate::RollbackPlan> {
        self.plan_slot_rollback(running_entry)
    }

    fn pin(&mut self, version: &str, _pin: bool, _dry_run: bool) -> Result<crate::PinOutcome> {
        Err(invalid(format!(
            "cannot pin {version}: GRUB keeps two slots, the running version and the next one, \
             so a pinned slot would block every upgrade (pins need systemd-boot)"
        )))
    }

    fn revert(&mut self, failed_entry: &str) -> Result<Option<String>> {
        let status = self.grub_status()?.writable()?;
        let Some(tag) = status.upgrade_tag.clone() else {
            return Ok(None);
        };
        if tag.is_empty() {
            self.set_tag(None)?;
            return Ok(None);
        }
        let prev = status
            .slot(&tag)
            .ok_or_else(|| BootloaderError::EntryNotFound(tag.clone()))?;
        if !status.slots[prev].complete() {
            return Err(invalid(format!(
                "the slot to return to, {tag}, is incomplete"
            )));
        }
        if status.slot(failed_entry) == Some(prev) {
            // The recorded fallback itself failed: nothing better to return to; keep it.
            self.set_tag(None)?;
            return Ok(Some(tag));
        }
        let mut env = status.env.clone();
        env.set("saved_entry", GRUB_SLOTS[prev])?;
        env.unset("next_entry");
        if env != status.env {
            self.write_env(&env)?;
        }
        self.sync_record(&status, GRUB_SLOTS[prev])?;
        self.set_tag(None)?;
        Ok(Some(tag))
    }
}
