//! An upgrade on GRUB: the inactive slot written completely, then META `Upgrade`, then the
//! one-shot `next_entry` (the order and why: [`crate::Bootloader::upgrade`] on [`Grub`]).

use std::io;

use fatfs::ReadWriteSeek;
use slate_bootspec::grub_entry_index;
use slate_disk::Disk;
use slate_esp::{fat, session, GRUB_SLOTS, SLOT_CMDLINE, SLOT_INITRAMFS, SLOT_KERNEL};

use super::config::slot_cmdline_cfg;
use super::{menu, Grub, GrubWriteOrder, SlotPayload};
use crate::parts::{fat_err, invalid, Result};
use crate::{BootloaderError, UpgradeOutcome};

impl<D: Disk> Grub<D> {
    /// Upgrade the inactive slot to `payload` and make it GRUB's one-shot `next_entry`. See
    /// [`crate::Bootloader::upgrade`] for the order of the writes.
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
            session::with_esp_writing(&mut self.disk, self.source_date_epoch, bytes, |fs| {
                fat::write_file_atomically(fs, &path, bytes)
            })
            .map_err(BootloaderError::from)?;
        }
        Ok(())
    }
}

fn remove_if_present<T: ReadWriteSeek>(dir: &fatfs::Dir<'_, T>, name: &str) -> io::Result<()> {
    match dir.remove(name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
