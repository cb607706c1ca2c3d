//! The Boot Loader Interface's EFI variables, read through efivarfs.

use std::path::PathBuf;

use crate::{mount, MsFlags, Result};

/// Vendor GUID of the Boot Loader Interface variables (systemd-boot's).
pub const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";
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

/// Decode an efivarfs file of a string variable: a u32 of attributes, then UTF-16LE up to NUL.
pub fn decode_string_var(bytes: &[u8]) -> Option<String> {
    let data = bytes.get(4..)?;
    let units: Vec<u16> = data
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16(&units).ok()
}

/// A string loader variable such as `LoaderEntrySelected`, if set.
pub fn read_loader_string(name: &str) -> Option<String> {
    decode_string_var(&std::fs::read(loader_var_path(name)).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_formats_vector() {
        let bytes = [
            0x07, 0, 0, 0, 0x66, 0, 0x6f, 0, 0x6f, 0, 0x2e, 0, 0x65, 0, 0x66, 0, 0x69, 0, 0, 0,
        ];
        assert_eq!(decode_string_var(&bytes).as_deref(), Some("foo.efi"));
        assert_eq!(decode_string_var(&[7, 0]), None);
    }
}
