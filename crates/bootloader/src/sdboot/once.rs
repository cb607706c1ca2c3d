//! One boot of a chosen entry (`slate reboot --entry`, `POST /v1/reboot` with `entry`):
//! systemd-boot's `LoaderEntryOneShot`, which it deletes as soon as it has read it, so the boot
//! after that one is the default's again. Nothing on the ESP changes.

use slate_bootspec::BootState;
use slate_disk::Disk;

use super::SystemdBoot;
use crate::efivars::{EfiVars, LOADER_ENTRY_ONESHOT};
use crate::parts::{invalid, Result};
use crate::BootloaderError;

impl<D: Disk, V: EfiVars> SystemdBoot<D, V> {
    /// The checks of [`SystemdBoot::boot_once`], nothing written: the entry is on the ESP and
    /// not marked bad, no upgrade is pending (its trial boot must be the next one), and the
    /// selection model, given the one-shot, starts it. Returns the ID to write.
    pub fn plan_boot_once(&self, reference: &str) -> Result<String> {
        let scan = self.scan()?;
        if let Some(pending) = scan.tag.as_deref().filter(|t| !t.is_empty()) {
            return Err(invalid(format!(
                "an upgrade is pending (its fallback is {pending}): its trial boot comes next; \
                 choose an entry after it commits or reverts"
            )));
        }
        let index = scan
            .find(reference)
            .ok_or_else(|| BootloaderError::EntryNotFound(reference.to_owned()))?;
        let entry = &scan.entries[index];
        if entry.state() == BootState::Bad {
            return Err(invalid(format!(
                "{} is marked bad (it failed its boot tries); systemd-boot would start it, but \
                 slate will not ask it to",
                entry.file_name()
            )));
        }
        let id = entry.id(self.style);
        let mut vars = crate::MemEfiVars::new();
        vars.set(LOADER_ENTRY_ONESHOT, &id)?;
        let selected = self
            .selection(&scan.entries, &scan.conf(), &vars)
            .map(|s| s.file_name);
        if selected.as_deref() != Some(entry.file_name()) {
            return Err(BootloaderError::WouldNotBoot {
                wanted: entry.file_name().to_owned(),
                selected: selected.unwrap_or_default(),
            });
        }
        Ok(id)
    }

    /// Makes `reference` (a file name or an entry ID) the next boot's entry, once, by setting
    /// `LoaderEntryOneShot` after [`SystemdBoot::plan_boot_once`]'s checks. Returns the ID.
    pub fn boot_once(&mut self, reference: &str) -> Result<String> {
        let id = self.plan_boot_once(reference)?;
        self.vars.set(LOADER_ENTRY_ONESHOT, &id)?;
        Ok(id)
    }
}
