//! slate's firmware boot options, kept once a boot is committed (`slate_bootloader::
//! boot_options` says why: a loader that returns with an error is started again, so a kernel
//! that cannot start spends its tries within one power-on). Written through efivarfs by the
//! first committed boot — a node installed from an image or by `installer install` boots its
//! first time through the firmware's removable-path option — and again whenever they are
//! missing or stale (a firmware reset, a reinstall with a new ESP). A committed version is one
//! that came up, so it never points the firmware at a loader that cannot start it.

use slate_bootloader::boot_options::{apply, describe, loader_location, plan};
use slate_bootloader::{BootVars, EfiVarsError};
use slate_disk::FileDisk;
use slate_sequencer::error_chain;

use crate::base::node::Node;

/// The firmware's global variables through efivarfs.
#[derive(Debug)]
struct FirmwareBootVars;

fn vars_err(name: &str) -> impl FnOnce(slate_host::HostError) -> EfiVarsError + '_ {
    move |e| EfiVarsError {
        name: name.to_owned(),
        reason: error_chain(&e),
    }
}

impl BootVars for FirmwareBootVars {
    fn names(&self) -> Result<Vec<String>, EfiVarsError> {
        slate_host::global_var_names().map_err(vars_err("efivarfs"))
    }
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, EfiVarsError> {
        slate_host::read_global(name).map_err(vars_err(name))
    }
    fn write(&mut self, name: &str, file: &[u8]) -> Result<(), EfiVarsError> {
        slate_host::write_var_file(&slate_host::global_var_path(name), file).map_err(vars_err(name))
    }
    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        slate_host::remove_var_file(&slate_host::global_var_path(name)).map_err(vars_err(name))
    }
}

/// Put slate's boot options first, if they are not. Logs what was done (`boot options: …`)
/// or why not; never fails the boot: without them the node boots as before.
pub fn ensure(node: &Node) {
    if node.snapshot_root.is_some() {
        // A snapshot root's ESP is found by the engine, not by META; not covered yet.
        return;
    }
    match slate_host::mount_efivarfs() {
        Ok(true) => {}
        Ok(false) => return,
        Err(err) => {
            node.journal.error(format_args!(
                "boot options: efivarfs: {}",
                error_chain(&err)
            ));
            return;
        }
    }
    let result = (|| {
        let meta = crate::base::system_disk::meta_partition()?;
        let disk = FileDisk::open_read_only(&meta.disk)
            .map_err(|e| format!("opening {}: {e}", meta.disk.display()))?;
        let loader = loader_location(&disk).map_err(|e| error_chain(&e))?;
        let mut vars = FirmwareBootVars;
        let plan = plan(&vars, &loader).map_err(|e| error_chain(&e))?;
        if !plan.is_empty() {
            apply(&mut vars, &plan).map_err(|e| error_chain(&e))?;
        }
        Ok::<_, String>(describe(&plan))
    })();
    match result {
        Ok(line) => node.journal.info(format_args!("boot options: {line}")),
        Err(err) => node
            .journal
            .error(format_args!("boot options: not written: {err}")),
    }
}
