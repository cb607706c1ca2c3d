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

/// `EFI_GLOBAL_VARIABLE`: the vendor GUID of `SecureBoot`, `SetupMode`, `PK`, …
pub const EFI_GLOBAL_GUID: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// A one-byte global variable such as `SecureBoot` or `SetupMode`, if the firmware has it.
/// efivarfs files are the variable's 4-byte attributes, then its data.
pub fn read_global_u8(name: &str) -> Option<u8> {
    let bytes = std::fs::read(format!("{EFIVARS}/{name}-{EFI_GLOBAL_GUID}")).ok()?;
    match bytes.as_slice() {
        [_, _, _, _, value] => Some(*value),
        _ => None,
    }
}
