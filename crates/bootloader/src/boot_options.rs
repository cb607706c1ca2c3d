//! slate's own firmware boot options (docs/update-transaction.md, "A kernel that cannot
//! start"): `LOADER_STARTS` `Boot####` options naming the ESP's `EFI/BOOT/BOOTX64.EFI` (the
//! file both loaders' layouts put there), first in `BootOrder`.
//!
//! Why: a UKI whose kernel cannot start (systemd's stub fails to decompress it) makes
//! systemd-boot return "Load Error" to the firmware, which then starts the next option in
//! `BootOrder`. With only the firmware's own removable-path option, that is the network, where
//! OVMF waits forever, and only a power cycle spent a boot try. With slate's options the
//! firmware starts the loader again; each start spends one try, and once the entry is out of
//! tries it sorts last and the fallback boots — within the same power-on. GRUB needs two starts
//! (its `next_entry` one shot is consumed by the first).
//!
//! The bytes are `slate_bootspec`'s (pure); this module reads the variables through
//! [`BootVars`], plans, and writes in a safe order: the options, then `BootOrder`, then the
//! removal of slate's surplus options, which `BootOrder` no longer names by then.

use std::collections::BTreeMap;

use slate_bootspec::{
    boot_var_name, build_boot_order, parse_boot_var_name, plan_boot_options, BootOptionsPlan,
    LoadOptionError, LoaderLocation, DEFAULT_INSTALL_TRIES,
};
use slate_disk::Disk;

use crate::efivars::{BootVars, EfiVarsError, BOOT_ORDER};

/// How many times the firmware starts the loader in one power-on: one start per boot try of an
/// upgrade with the default tries, and the start that boots the fallback.
pub const LOADER_STARTS: usize = DEFAULT_INSTALL_TRIES as usize + 1;

/// The logical block size of the device paths slate writes (the layout's sector size).
const LBA: u64 = 512;

/// Why slate's boot options could not be planned or written.
#[derive(Debug, thiserror::Error)]
pub enum BootOptionsError {
    #[error("finding the EFI system partition")]
    Esp(#[from] slate_esp::EspError),
    #[error("the firmware's boot variables: {0}")]
    Vars(#[from] EfiVarsError),
    #[error("refusing to change the firmware's boot options")]
    Invalid(#[from] LoadOptionError),
}

/// Where the loader lies: the ESP of `disk` (by its GPT entry) and the removable path.
pub fn loader_location(disk: &impl Disk) -> Result<LoaderLocation, BootOptionsError> {
    let esp = slate_esp::session::locate(slate_esp::ReadOnly(disk))?;
    Ok(LoaderLocation {
        partition_number: esp.number,
        start_lba: esp.start / LBA,
        size_lba: esp.len / LBA,
        partition_guid: esp.unique_guid.to_bytes_le(),
        path: slate_esp::FALLBACK_LOADER_PATH.to_owned(),
    })
}

/// What would change: every `Boot####` and `BootOrder` read, then the pure plan. Writes nothing.
pub fn plan(
    vars: &impl BootVars,
    loader: &LoaderLocation,
) -> Result<BootOptionsPlan, BootOptionsError> {
    let mut options = BTreeMap::new();
    for name in vars.names()? {
        let Some(number) = parse_boot_var_name(&name) else {
            continue;
        };
        if let Some(bytes) = vars.read(&name)? {
            options.insert(number, bytes);
        }
    }
    let order = vars.read(BOOT_ORDER)?;
    Ok(plan_boot_options(
        order.as_deref(),
        &options,
        loader,
        LOADER_STARTS,
    )?)
}

/// Carry out `plan`: options, then `BootOrder`, then the surplus options' removal.
pub fn apply(vars: &mut impl BootVars, plan: &BootOptionsPlan) -> Result<(), BootOptionsError> {
    for (name, bytes) in &plan.write {
        vars.write(name, bytes)?;
    }
    if let Some(order) = &plan.boot_order {
        vars.write(BOOT_ORDER, &build_boot_order(order))?;
    }
    for name in &plan.remove {
        vars.remove(name)?;
    }
    Ok(())
}

/// One line for the journal: `Boot0000..Boot0006 (4 starts of EFI/BOOT/BOOTX64.EFI) first in
/// BootOrder: wrote 4 options and BootOrder`.
pub fn describe(plan: &BootOptionsPlan) -> String {
    let names: Vec<String> = plan
        .slate_options
        .iter()
        .map(|n| boot_var_name(*n))
        .collect();
    let mut done = Vec::new();
    if !plan.write.is_empty() {
        done.push(format!("wrote {} option(s)", plan.write.len()));
    }
    if plan.boot_order.is_some() {
        done.push("BootOrder".to_owned());
    }
    if !plan.remove.is_empty() {
        done.push(format!("removed {}", plan.remove.join(" ")));
    }
    format!(
        "{} ({} starts of {}) first in BootOrder{}",
        names.join(" "),
        plan.slate_options.len(),
        slate_esp::FALLBACK_LOADER_PATH,
        if done.is_empty() {
            ": nothing to change".to_owned()
        } else {
            format!(": {}", done.join(", "))
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::efivars::MemBootVars;
    use slate_bootspec::parse_boot_order;

    fn esp() -> LoaderLocation {
        LoaderLocation {
            partition_number: 1,
            start_lba: 2048,
            size_lba: 196_608,
            partition_guid: [7; 16],
            path: slate_esp::FALLBACK_LOADER_PATH.to_owned(),
        }
    }

    #[test]
    fn first_boot_writes_the_options_then_nothing() {
        let mut vars = MemBootVars::default();
        vars.vars
            .insert("Boot0001".into(), vec![7, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        // Boot0001 above has an empty description and no end node: refused, nothing written.
        let err = plan(&vars, &esp()).unwrap_err();
        assert!(
            format!("{err}: {}", std::error::Error::source(&err).unwrap()).contains("Boot0001")
        );
        vars.vars.clear();
        vars.vars.insert(BOOT_ORDER.into(), build_boot_order(&[]));
        let first = plan(&vars, &esp()).unwrap();
        apply(&mut vars, &first).unwrap();
        assert_eq!(
            parse_boot_order(&vars.vars[BOOT_ORDER]).unwrap(),
            [0, 1, 2, 3]
        );
        assert!(describe(&first).contains("wrote 4 option(s), BootOrder"));
        let again = plan(&vars, &esp()).unwrap();
        assert!(again.is_empty());
        assert!(describe(&again).ends_with(": nothing to change"));
    }
}
