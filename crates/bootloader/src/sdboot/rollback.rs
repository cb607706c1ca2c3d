//! Rollback by hand on systemd-boot: the previous version, still on the ESP, is put on trial
//! exactly as an upgrade puts a new one, with the running entry as its recorded fallback. From
//! there the upgrade transaction's own decision takes over: a healthy boot of the previous
//! version commits it, a failed one reverts to the version that was running.

use slate_bootspec::{sorted, BootState, EntryName};
use slate_disk::Disk;
use slate_esp::uki_file_name;
use slate_meta::tags;

use super::SystemdBoot;
use crate::efivars::EfiVars;
use crate::parts::{invalid, Result};
use crate::{BootloaderError, RollbackPlan};

impl<D: Disk, V: EfiVars> SystemdBoot<D, V> {
    /// Every check of [`crate::Bootloader::rollback`], with the disk only read: no upgrade is
    /// pending, the running entry is found, the previous version is the first of the OS's
    /// other entries in menu order that has not failed, it is not below META `VersionFloor`,
    /// and with it on trial and the running entry marked bad the selection model boots it.
    pub fn plan_rollback(&self, running_entry: &str, tries: u32) -> Result<RollbackPlan> {
        let scan = self.scan()?;
        if let Some(pending) = scan.tag.as_deref().filter(|t| !t.is_empty()) {
            return Err(invalid(format!(
                "an upgrade is pending (its fallback is {pending}): it commits or reverts on \
                 the next boot; roll back after that"
            )));
        }
        let running = scan
            .find(running_entry)
            .ok_or_else(|| BootloaderError::EntryNotFound(running_entry.to_owned()))?;
        let running_id = scan.entries[running].id(self.style);
        let prefix = format!("{}-", self.name);
        let version_of = |name: &EntryName| {
            name.stem()
                .strip_prefix(&prefix)
                .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
                .map(str::to_owned)
        };
        let previous = sorted(&scan.entries, self.style)
            .into_iter()
            .find(|&i| {
                let entry = &scan.entries[i];
                i != running
                    && entry.state() != BootState::Bad
                    && entry.id(self.style) != running_id
                    && version_of(&entry.name).is_some()
            })
            .ok_or_else(|| {
                invalid(format!(
                    "nothing to roll back to: the EFI partition holds no other version of {} \
                     that has not failed (only {})",
                    self.name,
                    scan.entries[running].file_name()
                ))
            })?;
        let previous_name = scan.entries[previous].name.clone();
        let version = version_of(&previous_name).unwrap_or_default();
        crate::parts::check_rollback_floor(&self.disk, &version)?;
        let on_trial = EntryName::parse(&uki_file_name(&self.name, &version, Some(tries))?)
            .map_err(invalid)?;
        let running_bad = scan.entries[running].name.marked_bad().map_err(invalid)?;
        let mut after = scan.entries.clone();
        after[previous].name = on_trial.clone();
        after[running].name = running_bad.clone();
        let selected = self
            .selection(&after, &scan.conf(), &self.vars)
            .map(|s| s.file_name);
        if selected.as_deref() != Some(on_trial.file_name()) {
            return Err(BootloaderError::WouldNotBoot {
                wanted: on_trial.file_name().to_owned(),
                selected: selected.unwrap_or_default(),
            });
        }
        Ok(RollbackPlan {
            from: scan.entries[running].file_name().to_owned(),
            from_marked: running_bad.file_name().to_owned(),
            to: previous_name.file_name().to_owned(),
            to_on_trial: on_trial.file_name().to_owned(),
            version,
        })
    }

    /// The writes, in this order, each flushed: META `Upgrade` = the running entry; the
    /// previous entry renamed on trial (`+tries`); the running entry marked bad, which lets the
    /// previous one sort first. A cut before the second rename leaves the running entry the
    /// default with the marker naming it: its next Running commits it again (the rollback
    /// undone, nothing lost). A cut after it boots the previous version on trial with the
    /// running one recorded to return to. A cut inside a rename leaves that entry nameless
    /// (`rename_entry`): inside the first, the running entry boots; inside the second, the
    /// previous one boots on trial, but the entry it would return to is gone.
    pub(super) fn execute_rollback(&mut self, plan: &RollbackPlan) -> Result<()> {
        self.with_meta(|meta| {
            meta.set(tags::UPGRADE, plan.from.as_bytes())?;
            Ok(meta.flush()?)
        })?;
        if plan.to != plan.to_on_trial {
            self.rename_entry(&plan.to, &plan.to_on_trial)?;
        }
        if plan.from != plan.from_marked {
            self.rename_entry(&plan.from, &plan.from_marked)?;
        }
        Ok(())
    }
}
