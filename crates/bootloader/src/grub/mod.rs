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

pub mod config;
mod record;
mod rollback;
pub mod snapshots;

use config::{grub_entry_title, parse_slot_cmdline_cfg, slot_cmdline_cfg};

use std::io::{self, Read};

use fatfs::ReadWriteSeek;
use slate_bootspec::{
    grub_entry_index, grub_select_with_record, GrubEnv, GrubEnvError, GrubMenuEntry, GrubReason,
    GrubSelection, Reason, Selection,
};
use slate_disk::Disk;
use slate_esp::fat;
use slate_esp::{
    fat_space, session, EspError, FatSpace, GRUBENV_PATH, GRUB_CFG_PATH, GRUB_DEFAULT_ENV_PATH,
    GRUB_SLOTS, SLOT_CMDLINE, SLOT_INITRAMFS, SLOT_KERNEL,
};

use crate::parts::{self, fat_err, invalid, Result};
use crate::{
    BootStatus, Bootloader, BootloaderError, CommitOutcome, EntryStatus, UpgradeOutcome,
    UpgradeRequest,
};
use slate_bootspec::BootState;

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

/// One slot as found on the ESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotStatus {
    pub label: &'static str,
    pub kernel_len: Option<u64>,
    pub initramfs_len: Option<u64>,
    /// From `cmdline.cfg`: (version, command line). `None`: absent or not slate's format.
    pub config: Option<(String, String)>,
}

impl SlotStatus {
    /// Kernel, initramfs and `cmdline.cfg` present: the slot was completely written
    /// (`cmdline.cfg` is removed first and written last).
    pub fn complete(&self) -> bool {
        self.kernel_len.is_some() && self.initramfs_len.is_some() && self.config.is_some()
    }
    pub fn version(&self) -> Option<&str> {
        self.config.as_ref().map(|(v, _)| v.as_str())
    }
    fn len(&self) -> u64 {
        self.kernel_len.unwrap_or(0) + self.initramfs_len.unwrap_or(0)
    }
}

/// What is on the ESP and in META for GRUB, read in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrubStatus {
    pub slots: Vec<SlotStatus>,
    /// `grub/grubenv` as read; an empty block when it could not be ([`Self::env_error`]).
    pub env: GrubEnv,
    /// Why `grub/grubenv` could not be read (corrupted, unsigned, not 1024 bytes). GRUB then
    /// loads nothing from it, `grub.cfg` takes `saved_entry` from the second record, and slate
    /// refuses every write to the loader ([`Self::writable`]).
    pub env_error: Option<GrubEnvError>,
    /// `grub/slate-default.env`, the second record of the committed slot: `None` when absent
    /// (a disk imaged before it existed), `Some(Err)` when unreadable.
    pub default_record: Option<std::result::Result<GrubEnv, GrubEnvError>>,
    /// META `Upgrade`: the slot to return to while an upgrade is uncommitted.
    pub upgrade_tag: Option<String>,
    /// What GRUB does on the next boot, by the selection model.
    pub selection: Option<GrubSelection>,
    /// Hidden temp files left in the slots by an interrupted write (never booted).
    pub temp_files: Vec<String>,
    pub space: FatSpace,
    pub warnings: Vec<String>,
}

impl GrubStatus {
    /// The slot GRUB starts next (before its fallback, see [`Self::booted_slot`]).
    pub fn selected_slot(&self) -> Option<&'static str> {
        self.selection.as_ref().map(|s| GRUB_SLOTS[s.index])
    }

    /// The slot that actually comes up: the selected one if complete, else GRUB's `fallback`
    /// (saved_entry) if that is complete.
    pub fn booted_slot(&self) -> Option<&'static str> {
        let sel = self.selection.as_ref()?;
        if self.slots[sel.index].complete() {
            return Some(GRUB_SLOTS[sel.index]);
        }
        sel.fallback
            .filter(|&f| self.slots[f].complete())
            .map(|f| GRUB_SLOTS[f])
    }

    fn slot(&self, reference: &str) -> Option<usize> {
        grub_entry_index(&menu(), reference)
    }

    /// The status, if slate may write the loader: refused while grubenv is unreadable (slate
    /// rewrites it in place and edits it line by line, and would not guess what it held).
    pub fn writable(self) -> Result<Self> {
        match self.env_error {
            Some(err) => Err(err.into()),
            None => Ok(self),
        }
    }

    /// The slot the second record names (`saved_entry`), when it is present and readable.
    pub fn record_entry(&self) -> Option<&str> {
        match &self.default_record {
            Some(Ok(record)) => record.get_nonempty("saved_entry"),
            _ => None,
        }
    }

    /// grubenv's `saved_entry` when it is exactly a slot's id (what `grub.cfg` tests before it
    /// reads the record).
    fn env_saved_slot(&self) -> Option<&'static str> {
        let saved = self.env.get("saved_entry")?;
        GRUB_SLOTS.iter().copied().find(|s| *s == saved)
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

    /// Everything GRUB and slate's flows read: the slots, grubenv (refused when GRUB could not
    /// load it, or slate could not rewrite it), META `Upgrade`, the selection.
    pub fn grub_status(&self) -> Result<GrubStatus> {
        let esp = session::read_only(&self.disk)?;
        let space = fat_space(&esp).map_err(fat_err("counting free clusters of", "/"))?;
        let fs = fat::mount(esp, self.source_date_epoch)?;
        let root = fs.root_dir();
        let mut warnings = Vec::new();
        // grub.cfg is written once by the installer: its absence means this is not a GRUB
        // layout at all.
        root.open_file(GRUB_CFG_PATH)
            .map_err(fat_err("opening", GRUB_CFG_PATH))?;
        let mut env_bytes = Vec::new();
        root.open_file(GRUBENV_PATH)
            .and_then(|mut f| f.read_to_end(&mut env_bytes))
            .map_err(fat_err("reading", GRUBENV_PATH))?;
        let (env, env_error) = match GrubEnv::parse(&env_bytes) {
            Ok(env) => (env, None),
            Err(err) => (GrubEnv::new(), Some(err)),
        };
        let mut record_bytes = Vec::new();
        let default_record = match root
            .open_file(GRUB_DEFAULT_ENV_PATH)
            .and_then(|mut f| f.read_to_end(&mut record_bytes))
        {
            Ok(_) => Some(GrubEnv::parse(&record_bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(fat_err("reading", GRUB_DEFAULT_ENV_PATH)(e)),
        };
        let (mut slots, mut temp_files) = (Vec::new(), Vec::new());
        for label in GRUB_SLOTS {
            let mut slot = SlotStatus {
                label,
                kernel_len: None,
                initramfs_len: None,
                config: None,
            };
            let dir = root.open_dir(label).map_err(fat_err("opening", label))?;
            for item in dir.iter() {
                let item = item.map_err(fat_err("listing", label))?;
                let name = item.file_name();
                if item.is_dir() {
                    continue;
                }
                match name.as_str() {
                    SLOT_KERNEL => slot.kernel_len = Some(item.len()),
                    SLOT_INITRAMFS => slot.initramfs_len = Some(item.len()),
                    SLOT_CMDLINE => {
                        let mut text = String::new();
                        item.to_file()
                            .read_to_string(&mut text)
                            .map_err(fat_err("reading", &format!("{label}/{name}")))?;
                        slot.config = parse_slot_cmdline_cfg(&text);
                        if slot.config.is_none() {
                            warnings.push(format!("{label}/{name}: not slate's format"));
                        }
                    }
                    n if n.starts_with('.') => temp_files.push(format!("{label}/{n}")),
                    n => warnings.push(format!("{label}/{n}: unexpected file, ignored")),
                }
            }
            slots.push(slot);
        }
        drop(root);
        drop(fs);
        let parts::MetaFacts {
            upgrade_tag,
            warnings: meta_warnings,
            ..
        } = parts::read_meta_facts(&self.disk)?;
        warnings.extend(meta_warnings);
        let record = default_record.as_ref().and_then(|r| r.as_ref().ok());
        let selection =
            grub_select_with_record(env_error.is_none().then_some(&env), record, &menu());
        warnings.extend(record::warnings(
            &env,
            env_error.as_ref(),
            default_record.as_ref(),
        ));
        Ok(GrubStatus {
            slots,
            env,
            env_error,
            default_record,
            upgrade_tag,
            selection,
            temp_files,
            space,
            warnings,
        })
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

    /// Upgrade the inactive slot to `payload` and make it GRUB's one-shot `next_entry`. See
    /// [`Bootloader::upgrade`] for the order of the writes.
    pub fn upgrade_slot(
        &mut self,
        payload: &SlotPayload,
        version: &str,
        running_entry: &str,
    ) -> Result<UpgradeOutcome> {
        if payload.kernel.is_empty() || payload.initramfs.is_empty() {
            return Err(invalid("the kernel or the initramfs is empty"));
        }
        let cfg = slot_cmdline_cfg(version, &payload.cmdline)
            .map_err(|err| BootloaderError::Invalid(err.to_string()))?;
        let status = self.grub_status()?.writable()?;
        let running = status
            .slot(running_entry)
            .ok_or_else(|| BootloaderError::EntryNotFound(running_entry.to_owned()))?;
        let running_label = GRUB_SLOTS[running];
        if !status.slots[running].complete() {
            return Err(invalid(format!(
                "the running slot {running_label} is incomplete"
            )));
        }
        let target = 1 - running;
        let target_label = GRUB_SLOTS[target];
        let menu = menu();
        let saved = status
            .env
            .get_nonempty("saved_entry")
            .and_then(|s| grub_entry_index(&menu, s));
        // The default GRUB falls back to, the record's when grubenv names no slot.
        let fallback = status.selection.as_ref().and_then(|s| s.fallback);
        if saved == Some(target) || fallback == Some(target) {
            return Err(invalid(format!(
                "slot {target_label} is GRUB's saved default (saved_entry) while {running_label} \
                 runs: an upgrade is uncommitted; commit or revert it first"
            )));
        }
        // The record must not name the slot about to be emptied: brought in line with
        // grubenv's saved_entry first (it lags only after a cut commit).
        let record_sync = status
            .env_saved_slot()
            .filter(|&s| status.default_record.is_some() && status.record_entry() != Some(s));
        // Room: what is free, plus what the old slot and stale temp files give back, for three
        // files and their directory entries.
        let space = status.space;
        let old = space.clusters_for(status.slots[target].kernel_len.unwrap_or(0))
            + space.clusters_for(status.slots[target].initramfs_len.unwrap_or(0))
            + 1;
        let needed = space.clusters_for(payload.kernel.len() as u64)
            + space.clusters_for(payload.initramfs.len() as u64)
            + space.clusters_for(cfg.len() as u64)
            + 3;
        if space.free_clusters + old < needed {
            return Err(BootloaderError::NoRoom {
                needed: needed * space.cluster_size,
                available: (space.free_clusters + old) * space.cluster_size,
            });
        }
        let mut env = status.env.clone();
        env.set("next_entry", target_label)?;
        let temps: Vec<String> = status
            .temp_files
            .iter()
            .filter(|t| t.starts_with(&format!("{target_label}/")))
            .cloned()
            .collect();

        // Writes start here.
        if let Some(slot) = record_sync {
            self.write_record(slot)?;
        }
        match self.order {
            GrubWriteOrder::SlotThenFlip => {
                self.write_slot(target_label, payload, &cfg, &temps)?;
                self.set_tag(Some(running_label))?;
                self.write_env(&env)?;
            }
            GrubWriteOrder::FlipThenSlot => {
                self.set_tag(Some(running_label))?;
                self.write_env(&env)?;
                self.write_slot(target_label, payload, &cfg, &temps)?;
            }
        }
        Ok(UpgradeOutcome {
            file_name: target_label.to_owned(),
            fallback: running_label.to_owned(),
            removed: Vec::new(),
            cleared_vars: Vec::new(),
        })
    }

    /// Empty the slot — `cmdline.cfg` first, so a half-rewritten slot is never complete — then
    /// write kernel, initramfs and `cmdline.cfg` last, each under a temp name and renamed,
    /// flushed.
    fn write_slot(
        &mut self,
        label: &str,
        payload: &SlotPayload,
        cfg: &str,
        temps: &[String],
    ) -> Result<()> {
        session::with_esp(&mut self.disk, self.source_date_epoch, |fs| -> Result<()> {
            let dir = fs
                .root_dir()
                .open_dir(label)
                .map_err(fat_err("opening", label))?;
            for name in [SLOT_CMDLINE, SLOT_KERNEL, SLOT_INITRAMFS] {
                remove_if_present(&dir, name)
                    .map_err(fat_err("removing", &format!("{label}/{name}")))?;
            }
            for t in temps {
                let name = t.rsplit('/').next().unwrap_or(t);
                remove_if_present(&dir, name).map_err(fat_err("removing", t))?;
            }
            Ok(())
        })?;
        for (name, bytes) in [
            (SLOT_KERNEL, payload.kernel.as_slice()),
            (SLOT_INITRAMFS, payload.initramfs.as_slice()),
            (SLOT_CMDLINE, cfg.as_bytes()),
        ] {
            let path = format!("{label}/{name}");
            session::with_esp(&mut self.disk, self.source_date_epoch, |fs| {
                fat::write_file_atomically(fs, &path, bytes)
            })
            .map_err(BootloaderError::from)?;
        }
        Ok(())
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

fn remove_if_present<T: ReadWriteSeek>(dir: &fatfs::Dir<'_, T>, name: &str) -> io::Result<()> {
    match dir.remove(name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
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
        Ok(crate::explain::grub(&self.grub_status()?))
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
