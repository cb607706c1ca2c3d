//! What GRUB and slate's flows read on an A/B GRUB disk, in one pass: the slots, grubenv, the
//! second record, META `Upgrade`, and the selection GRUB makes over them. Every write starts
//! from it, so a check and the write it guards see the same disk.

use std::io::{self, Read};

use slate_bootspec::{
    grub_entry_index, grub_select_with_record, GrubEnv, GrubEnvError, GrubSelection,
};
use slate_disk::Disk;
use slate_esp::{
    fat, fat_space, session, FatSpace, GRUBENV_PATH, GRUB_CFG_PATH, GRUB_DEFAULT_ENV_PATH,
    GRUB_SLOTS, SLOT_CMDLINE, SLOT_INITRAMFS, SLOT_KERNEL,
};

use super::config::parse_slot_cmdline_cfg;
use super::{menu, record, Grub};
use crate::parts::{self, fat_err, Result};

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
    pub(super) fn len(&self) -> u64 {
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

    pub(super) fn slot(&self, reference: &str) -> Option<usize> {
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
    pub(super) fn env_saved_slot(&self) -> Option<&'static str> {
        let saved = self.env.get("saved_entry")?;
        GRUB_SLOTS.iter().copied().find(|s| *s == saved)
    }
}

impl<D: Disk> Grub<D> {
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
}
