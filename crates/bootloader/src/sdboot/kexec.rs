//! A restart by kexec that keeps systemd-boot's promises: the entry started is the one
//! systemd-boot would start next (by the same selection model), and its boot attempt is
//! counted the way systemd-boot counts it — the `+L-D` → `+(L-1)-(D+1)` rename, flushed, before
//! the jump — so an entry that never comes up still runs out of tries and falls back.
//!
//! What the firmware path would do that a kexec cannot — consume `LoaderEntryOneShot`, update
//! `LoaderEntryLastBooted` for an `@saved` default — needs EFI variable writes, which a node
//! does not make: [`SystemdBoot::plan_kexec`] refuses those selections, and the caller
//! restarts through the firmware instead.
//!
//! The started kernel learns which entry it is from `slate.entry=<file name>` appended to the
//! UKI's command line: systemd-boot's volatile `LoaderEntrySelected` still names the entry of
//! the boot before the kexec.

use slate_bootspec::EntryName;
use slate_disk::Disk;

use super::SystemdBoot;
use crate::efivars::{EfiVars, LOADER_ENTRY_DEFAULT, LOADER_ENTRY_ONESHOT};
use crate::parts::Result;
use crate::BootloaderError;

/// The kernel argument naming the entry a kexec started (`slate.entry=slate-2.0.0+2-1.efi`).
pub const ENTRY_KERNEL_ARG: &str = "slate.entry";

/// The next boot as a kexec makes it.
#[derive(Clone, PartialEq, Eq)]
pub struct KexecPlan {
    /// The entry systemd-boot would start, as it is named now.
    pub entry: String,
    /// Its name once the attempt is counted (`slate-2+3.efi` → `slate-2+2-1.efi`); the same
    /// name for an entry without a counter.
    pub counted: String,
    /// The `.linux`, `.initrd` and command line of its UKI; the command line is the UKI's
    /// `.cmdline` with `slate.entry=<counted>` appended.
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
    pub cmdline: String,
}

impl std::fmt::Debug for KexecPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KexecPlan")
            .field("entry", &self.entry)
            .field("counted", &self.counted)
            .field("kernel", &self.kernel.len())
            .field("initrd", &self.initrd.len())
            .field("cmdline", &self.cmdline)
            .finish()
    }
}

/// A UKI's parts for kexec: `.linux`, `.initrd` and `.cmdline` (NULs and surrounding blanks
/// trimmed). Refused when the UKI is not a PE or lacks the kernel or the initramfs.
pub fn uki_kexec_parts(uki: &[u8]) -> Result<(Vec<u8>, Vec<u8>, String)> {
    let section = |name: &str| {
        slate_uki::section_data(uki, name)
            .map_err(|e| BootloaderError::NoKexec(format!("the UKI is unreadable: {e}")))
    };
    let kernel = section(".linux")?
        .ok_or_else(|| BootloaderError::NoKexec("the UKI has no .linux section".into()))?;
    let initrd = section(".initrd")?
        .ok_or_else(|| BootloaderError::NoKexec("the UKI has no .initrd section".into()))?;
    let cmdline = section(".cmdline")?.unwrap_or_default();
    let cmdline = String::from_utf8_lossy(cmdline)
        .trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_owned();
    Ok((kernel.to_vec(), initrd.to_vec(), cmdline))
}

/// `cmdline` with `slate.entry=<entry>` in place of any it carried: the argument must name the
/// entry this kexec starts, never one a UKI was built with.
pub fn kexec_cmdline(cmdline: &str, entry: &str) -> String {
    let prefix = format!("{ENTRY_KERNEL_ARG}=");
    cmdline
        .split_whitespace()
        .filter(|arg| !arg.starts_with(&prefix))
        .chain(std::iter::once(format!("{prefix}{entry}").as_str()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The entry `slate.entry=` names on a kernel command line (the last one wins, as the kernel's
/// own parameters do).
pub fn entry_from_cmdline(cmdline: &str) -> Option<String> {
    let prefix = format!("{ENTRY_KERNEL_ARG}=");
    cmdline
        .split_whitespace()
        .filter_map(|arg| arg.strip_prefix(prefix.as_str()))
        .rfind(|entry| !entry.is_empty())
        .map(str::to_owned)
}

impl<D: Disk, V: EfiVars> SystemdBoot<D, V> {
    /// What a kexec restart would start: the entry the selection model picks, its name after
    /// the counted attempt, its UKI taken apart (pure read). Refused
    /// ([`BootloaderError::NoKexec`]) when the selection depends on a variable systemd-boot
    /// would change on the way (`LoaderEntryOneShot`, an `@saved` default), or the UKI cannot
    /// be started by kexec.
    pub fn plan_kexec(&self) -> Result<KexecPlan> {
        if let Some(oneshot) = self.vars.get(LOADER_ENTRY_ONESHOT) {
            return Err(BootloaderError::NoKexec(format!(
                "LoaderEntryOneShot is set ({oneshot:?}): systemd-boot would consume it, and \
                 the node does not write EFI variables"
            )));
        }
        let scan = self.scan()?;
        let conf = scan.conf();
        let saved = |v: Option<&str>| v.is_some_and(|v| v.eq_ignore_ascii_case("@saved"));
        if saved(conf.default.as_deref()) || saved(self.vars.get(LOADER_ENTRY_DEFAULT).as_deref()) {
            return Err(BootloaderError::NoKexec(
                "the default entry is @saved: systemd-boot would record the entry it starts in \
                 LoaderEntryLastBooted, and the node does not write EFI variables"
                    .into(),
            ));
        }
        let sel = self
            .selection(&scan.entries, &conf, &self.vars)
            .ok_or_else(|| BootloaderError::NoKexec("the ESP holds no boot entry".into()))?;
        let name = &scan.entries[sel.index].name;
        let counted = name
            .after_boot_attempt()
            .map_err(|e| BootloaderError::Invalid(e.to_string()))?;
        let uki = self.read_entry(name.file_name())?;
        let (kernel, initrd, cmdline) = uki_kexec_parts(&uki)?;
        Ok(KexecPlan {
            entry: name.file_name().to_owned(),
            counted: counted.file_name().to_owned(),
            kernel,
            initrd,
            cmdline: kexec_cmdline(&cmdline, counted.file_name()),
        })
    }

    /// Count the attempt a kexec by `plan` makes, as systemd-boot counts its own: rename the
    /// entry to `plan.counted` and flush — before the jump, so a kernel that never comes up
    /// has spent the try. Refused, before any write, when the selection no longer picks the
    /// planned entry.
    pub fn count_kexec_attempt(&mut self, plan: &KexecPlan) -> Result<()> {
        let scan = self.scan()?;
        let selected = self
            .selection(&scan.entries, &scan.conf(), &self.vars)
            .map(|s| s.file_name);
        if selected.as_deref() != Some(plan.entry.as_str()) {
            return Err(BootloaderError::NoKexec(format!(
                "the entry to start changed since the kexec was planned: {} then, {} now",
                plan.entry,
                selected.as_deref().unwrap_or("none")
            )));
        }
        // The names must be the systemd-boot rename of each other: a forged plan must not
        // rename an entry into something else.
        let expected = EntryName::parse(&plan.entry)
            .and_then(|n| n.after_boot_attempt())
            .map_err(|e| BootloaderError::Invalid(e.to_string()))?;
        if expected.file_name() != plan.counted {
            return Err(BootloaderError::Invalid(format!(
                "{} is not the counted name of {}",
                plan.counted, plan.entry
            )));
        }
        if plan.counted != plan.entry {
            self.rename_entry(&plan.entry, &plan.counted)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_argument_is_appended_once_and_replaces_a_built_in_one() {
        assert_eq!(
            kexec_cmdline("console=ttyS0 quiet", "slate-2+2-1.efi"),
            "console=ttyS0 quiet slate.entry=slate-2+2-1.efi"
        );
        assert_eq!(
            kexec_cmdline("  console=ttyS0 slate.entry=old.efi\n", "slate-1.efi"),
            "console=ttyS0 slate.entry=slate-1.efi"
        );
        assert_eq!(kexec_cmdline("", "a.efi"), "slate.entry=a.efi");
    }

    #[test]
    fn the_booted_entry_is_read_back_from_the_command_line() {
        let line = kexec_cmdline("console=ttyS0", "slate-2+2-1.efi");
        assert_eq!(
            entry_from_cmdline(&line).as_deref(),
            Some("slate-2+2-1.efi")
        );
        assert_eq!(entry_from_cmdline("console=ttyS0 slate.slot=A"), None);
        assert_eq!(entry_from_cmdline("xslate.entry=a.efi slate.entry="), None);
        assert_eq!(
            entry_from_cmdline("slate.entry=a.efi slate.entry=b.efi").as_deref(),
            Some("b.efi")
        );
    }
}
