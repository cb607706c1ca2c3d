//! The systemd-boot EFI variables slate reads or writes, and their efivarfs byte format.

use crate::error::EfiVarError;

/// Vendor GUID of all `Loader*` variables.
pub const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS, what systemd writes.
pub const LOADER_VAR_ATTRIBUTES: u32 = 0x07;

/// The variables that steer default selection, as strings (`None` = variable absent).
///
/// systemd-boot lower-cases all of them before matching, and deletes `LoaderEntryOneShot` once
/// it has read it (whether or not it matched an entry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EfiVars {
    /// `LoaderEntryOneShot`: ID or glob for the next boot only.
    pub entry_oneshot: Option<String>,
    /// `LoaderEntryDefault`: persistent ID or glob; `@saved` means "use `LoaderEntryLastBooted`".
    pub entry_default: Option<String>,
    /// `LoaderEntryLastBooted`: consulted only when a default is `@saved`.
    pub entry_last_booted: Option<String>,
}

/// efivarfs file name of a loader variable: `<Name>-<GUID>`.
pub fn efivarfs_name(variable: &str) -> String {
    format!("{variable}-{LOADER_GUID}")
}

/// efivarfs file content for a string variable: attributes (u32 LE), then UTF-16LE text and
/// a terminating NUL unit.
pub fn encode_efivar_string(value: &str) -> Vec<u8> {
    let mut out = LOADER_VAR_ATTRIBUTES.to_le_bytes().to_vec();
    for unit in value.encode_utf16().chain([0]) {
        out.extend_from_slice(&unit.to_le_bytes());
    }
    out
}

/// Reads efivarfs file content of a string variable: returns the attributes and the text. The
/// terminating NUL is optional (firmware and tools differ); a NUL before the end is refused.
pub fn decode_efivar_string(bytes: &[u8]) -> Result<(u32, String), EfiVarError> {
    let Some((attr, data)) = bytes.split_first_chunk::<4>() else {
        return Err(EfiVarError::TooShort { len: bytes.len() });
    };
    if data.len() % 2 != 0 {
        return Err(EfiVarError::OddLength { len: data.len() });
    }
    let mut units: Vec<u16> = data
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect();
    if units.last() == Some(&0) {
        units.pop();
    }
    if let Some(unit) = units.iter().position(|u| *u == 0) {
        return Err(EfiVarError::EmbeddedNul { unit });
    }
    let mut text = String::with_capacity(units.len());
    let mut unit = 0;
    for c in char::decode_utf16(units.iter().copied()) {
        let c = c.map_err(|_| EfiVarError::InvalidUtf16 { unit })?;
        text.push(c);
        unit += c.len_utf16();
    }
    Ok((u32::from_le_bytes(*attr), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_md_vector() {
        let bytes = [
            0x07, 0, 0, 0, 0x66, 0, 0x6f, 0, 0x6f, 0, 0x2e, 0, 0x65, 0, 0x66, 0, 0x69, 0, 0, 0,
        ];
        assert_eq!(encode_efivar_string("foo.efi"), bytes);
        assert_eq!(decode_efivar_string(&bytes), Ok((7, "foo.efi".to_owned())));
        assert_eq!(
            decode_efivar_string(&bytes[..18]),
            Ok((7, "foo.efi".to_owned()))
        );
        assert_eq!(
            efivarfs_name("LoaderEntryOneShot"),
            "LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
        );
    }

    #[test]
    fn refusals() {
        assert_eq!(
            decode_efivar_string(&[7, 0]),
            Err(EfiVarError::TooShort { len: 2 })
        );
        assert_eq!(
            decode_efivar_string(&[7, 0, 0, 0, 0x61]),
            Err(EfiVarError::OddLength { len: 1 })
        );
        assert_eq!(
            decode_efivar_string(&[7, 0, 0, 0, 0x61, 0, 0, 0, 0x62, 0]),
            Err(EfiVarError::EmbeddedNul { unit: 1 })
        );
        assert_eq!(
            decode_efivar_string(&[7, 0, 0, 0, 0x00, 0xD8]),
            Err(EfiVarError::InvalidUtf16 { unit: 0 })
        );
        assert_eq!(decode_efivar_string(&[7, 0, 0, 0]), Ok((7, String::new())));
    }
}
