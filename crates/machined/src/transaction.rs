//! The node's side of the upgrade transaction: commit once the new version is up, revert when
//! it fails. The bootloader backend does the writes (through the Disk trait, never mounting the
//! ESP); machined decides when.

use slate_bootloader::{Bootloader, EfiVars, EfiVarsError};
use slate_disk::FileDisk;

use super::node::Node;

/// The firmware's variables as efivarfs shows them. Reading is all the systemd-boot backend
/// needs for slate's own flows (the loader.conf glob does the flipping); a write it would ask
/// for fails with a clear error rather than being dropped.
#[derive(Debug)]
pub struct FirmwareVars;

impl EfiVars for FirmwareVars {
    fn get(&self, name: &str) -> Option<String> {
        slate_host::read_loader_string(name)
    }

    fn set(&mut self, name: &str, _value: &str) -> Result<(), EfiVarsError> {
        Err(EfiVarsError {
            name: name.into(),
            reason: "machined does not write EFI variables".into(),
        })
    }

    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        if slate_host::read_loader_string(name).is_none() {
            return Ok(());
        }
        Err(EfiVarsError {
            name: name.into(),
            reason: "machined does not write EFI variables".into(),
        })
    }
}

/// The backend of the loader the system disk was installed with (systemd-boot or GRUB).
fn system_loader() -> Result<Box<dyn Bootloader>, String> {
    let meta = slate_host::find_partition_by_label("META", None).map_err(|e| e.to_string())?;
    let disk =
        FileDisk::open(&meta.disk).map_err(|e| format!("opening {}: {e}", meta.disk.display()))?;
    slate_bootloader::probe(disk, FirmwareVars).map_err(|e| chain(&e))
}

/// The entry that booted: `LoaderEntrySelected` (systemd-boot), else the slot GRUB's menu entry
/// names on the kernel command line (`slate.slot=A`).
pub fn booted_entry(node: &Node) -> Option<String> {
    node.booted_entry.clone().or_else(|| {
        let cmdline = slate_host::kernel_cmdline().unwrap_or_default();
        cmdline
            .split_whitespace()
            .find_map(|arg| arg.strip_prefix("slate.slot="))
            .map(str::to_owned)
    })
}

/// An error and its causes on one line, `: `-separated.
pub(super) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// At stage Running: commit the booted entry. Its boot counter is dropped (a counted entry left
/// alone would count down to "bad" over later boots) and, if an upgrade is pending (META
/// `Upgrade`), the marker is deleted. Nothing is written when there is nothing to do.
pub fn commit_booted(node: &Node) -> Result<(), String> {
    let mut loader = system_loader()?;
    let status = loader.status().map_err(|e| chain(&e))?;
    let counted: Vec<String> = status
        .entries
        .iter()
        .filter(|e| e.file_name.contains('+'))
        .map(|e| e.file_name.clone())
        .collect();
    let running = booted_entry(node)
        .ok_or("the firmware did not say which entry booted (LoaderEntrySelected)")?;
    let Some(selected) = status.selected_file() else {
        return Err("systemd-boot would boot nothing on this disk".into());
    };
    if status.upgrade_tag.is_none() && !selected.contains('+') {
        return Ok(());
    }
    let outcome = loader.commit(&running).map_err(|e| chain(&e))?;
    let after = loader.status().map_err(|e| chain(&e))?;
    let renamed: Vec<&String> = counted
        .iter()
        .filter(|c| !after.entries.iter().any(|e| &e.file_name == *c))
        .collect();
    node.journal.info(format_args!(
        "committed: {} blessed as {}{}",
        renamed
            .first()
            .map(|s| s.as_str())
            .unwrap_or(running.as_str()),
        outcome.blessed,
        match &outcome.previous {
            Some(previous) => format!("; upgrade marker (fallback {previous}) dropped"),
            None => String::new(),
        }
    ));
    Ok(())
}

/// On a fatal boot error: if an upgrade is pending, mark the booted entry bad and return to the
/// recorded previous entry. Returns what it reverted to.
pub fn revert_if_pending(node: &Node) -> Result<Option<String>, String> {
    let mut loader = system_loader()?;
    let failed = booted_entry(node)
        .ok_or("the firmware did not say which entry booted (LoaderEntrySelected)")?;
    loader.revert(&failed).map_err(|e| chain(&e))
}

/// Remember in META which version failed and why; the next boot reports it in its status.
pub fn record_failure(node: &Node, reason: &str) -> Result<(), String> {
    let meta = slate_host::find_partition_by_label("META", None).map_err(|e| e.to_string())?;
    let disk = FileDisk::open(&meta.device)
        .map_err(|e| format!("opening {}: {e}", meta.device.display()))?;
    let mut store = slate_meta::MetaStore::open(disk).map_err(|e| chain(&e))?;
    let failure = slate_api::Failure {
        version: node.version.clone(),
        reason: reason.to_string(),
    };
    let mut json = serde_json::to_string(&failure).map_err(|e| e.to_string())?;
    // META values travel through fixed-size records: keep the reason to a sane length.
    if json.len() > 4096 {
        json = serde_json::to_string(&slate_api::Failure {
            version: node.version.clone(),
            reason: reason.chars().take(3000).collect(),
        })
        .map_err(|e| e.to_string())?;
    }
    store
        .set(slate_meta::tags::LAST_BOOT_FAILURE, json.into_bytes())
        .map_err(|e| chain(&e))?;
    store.flush().map_err(|e| chain(&e))
}
