//! Rollback by hand on GRUB: the other slot, when it holds a complete version, boots next
//! through the one-shot `next_entry` with the running slot recorded in META `Upgrade` — an
//! upgrade whose slot is already written. GRUB keeps no record of which slot failed: a slot a
//! revert left behind is as eligible as one that was committed before.

use slate_disk::Disk;
use slate_esp::GRUB_SLOTS;

use super::Grub;
use crate::parts::{invalid, Result};
use crate::{BootloaderError, RollbackPlan};

impl<D: Disk> Grub<D> {
    /// The checks of a GRUB rollback, nothing written: no upgrade pending, the other slot
    /// complete, its version not below META `VersionFloor`.
    pub fn plan_slot_rollback(&self, running_entry: &str) -> Result<RollbackPlan> {
        let status = self.grub_status()?.writable()?;
        if let Some(pending) = status.upgrade_tag.as_deref().filter(|t| !t.is_empty()) {
            return Err(invalid(format!(
                "an upgrade is pending (its fallback is slot {pending}): it commits or reverts \
                 on the next boot; roll back after that"
            )));
        }
        let running = status
            .slot(running_entry)
            .ok_or_else(|| BootloaderError::EntryNotFound(running_entry.to_owned()))?;
        let other = 1 - running;
        let slot = &status.slots[other];
        let version = match slot.version() {
            Some(version) if slot.complete() => version.to_owned(),
            _ => {
                return Err(invalid(format!(
                    "nothing to roll back to: slot {} holds no complete version",
                    GRUB_SLOTS[other]
                )))
            }
        };
        crate::parts::check_rollback_floor(&self.disk, &version)?;
        Ok(RollbackPlan {
            from: GRUB_SLOTS[running].to_owned(),
            from_marked: GRUB_SLOTS[running].to_owned(),
            to: GRUB_SLOTS[other].to_owned(),
            to_on_trial: GRUB_SLOTS[other].to_owned(),
            version,
        })
    }

    /// META `Upgrade` = the running slot (flushed), then `next_entry` = the other one
    /// (grubenv rewritten in place, flushed): a cut between the two boots the running slot
    /// with the marker naming it, and its commit drops the marker.
    pub(super) fn execute_slot_rollback(&mut self, plan: &RollbackPlan) -> Result<()> {
        let mut env = self.grub_status()?.writable()?.env;
        env.set("next_entry", &plan.to_on_trial)?;
        self.set_tag(Some(&plan.from))?;
        self.write_env(&env)
    }
}
