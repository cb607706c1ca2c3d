//! Restarting by kexec: the next entry's kernel, initramfs and command line loaded from its UKI
//! with `kexec_file_load`, then a jump that skips the firmware and the boot loader.
//!
//! Boot counting holds because the attempt is counted here exactly as systemd-boot counts its
//! own (the entry's `+L-D` → `+(L-1)-(D+1)` rename through the Disk trait, flushed) after the
//! teardown and before the jump; the started kernel learns its entry from `slate.entry=` on
//! its command line (`LoaderEntrySelected` still names the entry the firmware last started).
//! Whenever kexec cannot keep those promises — GRUB, a one-shot or `@saved` selection, a
//! locked-down kernel, a refusal by the kernel — the node restarts through the firmware and
//! the journal says why.

use slate_bootloader::{KexecPlan, LoaderKind, SystemdBoot};
use slate_disk::FileDisk;
use slate_sequencer::{error_chain, RebootMode};

use crate::settle::transaction::FirmwareVars;

/// How the machine restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Firmware,
    Kexec,
}

/// The way `mode` restarts the node: `kexec` asks for kexec, `powercycle` for the firmware;
/// `default` follows `[reboot] mode` of the machine configuration, else of the image
/// (`/etc/slate/node.toml`), else the firmware.
pub fn via(
    mode: RebootMode,
    machine: Option<slate_machine_config::RebootMethod>,
    image: Option<slate_profile::RebootMethod>,
) -> Via {
    use slate_machine_config::RebootMethod as Machine;
    use slate_profile::RebootMethod as Image;
    match mode {
        RebootMode::Kexec => Via::Kexec,
        RebootMode::Powercycle | RebootMode::PowerOff => Via::Firmware,
        RebootMode::Default => match (machine, image) {
            (Some(Machine::Kexec), _) | (None, Some(Image::Kexec)) => Via::Kexec,
            _ => Via::Firmware,
        },
    }
}

/// Whether the kernel's lockdown level (the bracketed word of
/// `/sys/kernel/security/lockdown`; `None` without the lockdown LSM) lets kexec be tried.
/// Under `integrity` or `confidentiality` (Secure Boot turns it on) the kernel starts only
/// images signed by a key it trusts, which a UKI's kernel need not be: restart through the
/// firmware, whose own checks apply to the whole UKI.
pub fn lockdown_allows(level: Option<&str>) -> Result<(), String> {
    match level {
        None | Some("none") => Ok(()),
        Some(level) => Err(format!(
            "the kernel is locked down ({level}, as under Secure Boot) and starts only images \
             signed by a key it trusts"
        )),
    }
}

/// The next entry read and loaded into the kernel, and the system disk kept open for the
/// counted attempt after the teardown has unmounted everything.
pub struct Prepared {
    boot: SystemdBoot<FileDisk, FirmwareVars>,
    pub plan: KexecPlan,
}

/// Choose the next entry as systemd-boot would, read its UKI and load it
/// (`kexec_file_load`). Nothing is written. Runs beside the teardown, which keeps /sys and
/// /dev mounted (the system disk is opened at once, and read through that descriptor); the
/// lockdown level must have been checked before ([`lockdown_allows`]).
pub fn prepare() -> Result<Prepared, String> {
    let meta = crate::base::system_disk::meta_partition()?;
    crate::base::system_disk::esp_unmounted(&meta.disk)?;
    let disk =
        FileDisk::open(&meta.disk).map_err(|e| format!("opening {}: {e}", meta.disk.display()))?;
    match slate_bootloader::detect(&disk).map_err(|e| error_chain(&e))? {
        LoaderKind::Grub => {
            return Err(
                "the system disk boots with GRUB; kexec starts systemd-boot UKIs only".into(),
            )
        }
        LoaderKind::SystemdBoot => {}
    }
    let boot = SystemdBoot::new(disk, FirmwareVars);
    let plan = boot.plan_kexec().map_err(|e| error_chain(&e))?;
    slate_host::kexec_load(&plan.kernel, &plan.initrd, &plan.cmdline)
        .map_err(|e| error_chain(&e))?;
    Ok(Prepared { boot, plan })
}

/// Count the attempt as systemd-boot would (the rename, flushed); when it cannot be counted,
/// unload the image, so that the firmware path that follows starts the entry and counts it.
pub fn count(prepared: &mut Prepared) -> Result<(), String> {
    prepared
        .boot
        .count_kexec_attempt(&prepared.plan)
        .map_err(|e| {
            let _ = slate_host::kexec_unload();
            format!("counting the boot attempt: {}", error_chain(&e))
        })
}

/// After the teardown: count the attempt (the rename, flushed), then jump. Returns only on
/// failure, with why. An attempt that could not be counted unloads the image, so that the
/// firmware path that follows starts the entry and counts it itself.
pub fn jump(mut prepared: Prepared) -> String {
    if let Err(why) = count(&mut prepared) {
        return why;
    }
    match slate_host::kexec_reboot() {
        Ok(never) => match never {},
        Err(e) => format!(
            "the jump failed after {} was counted: {}",
            prepared.plan.counted,
            error_chain(&e)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_machine_config::RebootMethod as Machine;
    use slate_profile::RebootMethod as Image;

    #[test]
    fn the_default_follows_the_machine_configuration_then_the_image() {
        let d = RebootMode::Default;
        assert_eq!(via(d, None, None), Via::Firmware);
        assert_eq!(via(d, None, Some(Image::Kexec)), Via::Kexec);
        assert_eq!(via(d, None, Some(Image::Firmware)), Via::Firmware);
        assert_eq!(via(d, Some(Machine::Kexec), None), Via::Kexec);
        // The machine configuration wins over the image, both ways.
        assert_eq!(
            via(d, Some(Machine::Firmware), Some(Image::Kexec)),
            Via::Firmware
        );
        assert_eq!(
            via(d, Some(Machine::Kexec), Some(Image::Firmware)),
            Via::Kexec
        );
    }

    #[test]
    fn kexec_and_powercycle_ignore_the_configuration() {
        let all = [None, Some(Machine::Kexec), Some(Machine::Firmware)];
        for machine in all {
            for image in [None, Some(Image::Kexec), Some(Image::Firmware)] {
                assert_eq!(via(RebootMode::Kexec, machine, image), Via::Kexec);
                assert_eq!(via(RebootMode::Powercycle, machine, image), Via::Firmware);
                assert_eq!(via(RebootMode::PowerOff, machine, image), Via::Firmware);
            }
        }
    }

    #[test]
    fn only_an_unlocked_kernel_is_asked_to_kexec() {
        assert_eq!(lockdown_allows(None), Ok(()));
        assert_eq!(lockdown_allows(Some("none")), Ok(()));
        for level in ["integrity", "confidentiality"] {
            let why = lockdown_allows(Some(level)).unwrap_err();
            assert!(why.contains(&format!("locked down ({level}")), "{why}");
        }
    }
}
