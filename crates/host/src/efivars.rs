//! The Boot Loader Interface's EFI variables, read through efivarfs.

use std::path::PathBuf;

use crate::{mount, MsFlags, Result};

pub use slate_bootspec::LOADER_GUID;
const EFIVARS: &str = "/sys/firmware/efi/efivars";

/// Mount efivarfs if the machine booted through UEFI and it is not mounted yet.
pub fn mount_efivarfs() -> Result<bool> {
    let dir = std::path::Path::new(EFIVARS);
    if !dir.exists() {
        return Ok(false);
    }
    if crate::is_mount_point(dir)? {
        return Ok(true);
    }
    mount(
        "efivarfs",
        dir,
        "efivarfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    Ok(true)
}

/// The file of a loader variable.
pub fn loader_var_path(name: &str) -> PathBuf {
    PathBuf::from(format!("{EFIVARS}/{name}-{LOADER_GUID}"))
}

/// A string loader variable such as `LoaderEntrySelected`, if set.
pub fn read_loader_string(name: &str) -> Option<String> {
    let bytes = std::fs::read(loader_var_path(name)).ok()?;
    slate_bootspec::decode_efivar_string(&bytes)
        .ok()
        .map(|(_, value)| value)
}
