//! Pins on systemd-boot: META `PinnedVersions` names versions whose UKIs pruning never deletes
//! (`plan.rs`). A version is pinned only while one of the OS's entries holds it, so a pin
//! always keeps something bootable; unpinning a version no longer on the ESP is allowed, so a
//! stale pin can always be dropped.

use slate_disk::Disk;
use slate_meta::pins;

use super::SystemdBoot;
use crate::efivars::EfiVars;
use crate::parts::{self, invalid, Result};
use crate::PinOutcome;

impl<D: Disk, V: EfiVars> SystemdBoot<D, V> {
    /// The pins after pinning (`pin`) or unpinning `version`, with the checks, nothing
    /// written.
    pub fn plan_pin(&self, version: &str, pin: bool) -> Result<PinOutcome> {
        let scan = self.scan()?;
        let mut pinned = scan.pinned.clone().map_err(|e| {
            invalid(format!(
                "META PinnedVersions cannot be read ({e}): set it again with `slate meta set` \
                 or delete it"
            ))
        })?;
        pins::check_version(version).map_err(invalid)?;
        let changed = if pin {
            let prefix = format!("{}-", self.name);
            let on_esp = scan
                .entries
                .iter()
                .any(|e| e.name.stem().strip_prefix(&prefix) == Some(version));
            if !on_esp {
                let held: Vec<&str> = scan
                    .entries
                    .iter()
                    .filter_map(|e| e.name.stem().strip_prefix(&prefix))
                    .collect();
                return Err(invalid(format!(
                    "no UKI of version {version} is on the ESP (it holds {}): only a version \
                     still on the disk can be pinned",
                    if held.is_empty() {
                        "none".to_owned()
                    } else {
                        held.join(", ")
                    }
                )));
            }
            pins::pin(&mut pinned, version).map_err(invalid)?
        } else {
            pins::unpin(&mut pinned, version)
        };
        Ok(PinOutcome { pinned, changed })
    }

    /// [`SystemdBoot::plan_pin`], then META `PinnedVersions` written (one flush) if it changed.
    pub fn set_pin(&mut self, version: &str, pin: bool) -> Result<PinOutcome> {
        let outcome = self.plan_pin(version, pin)?;
        if outcome.changed {
            parts::set_pinned(&mut self.disk, &outcome.pinned)?;
        }
        Ok(outcome)
    }
}
