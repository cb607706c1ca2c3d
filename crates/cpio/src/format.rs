//! The newc header layout shared by the writer and the reader.

/// Magic of the plain "new ASCII" format; the only one the writer emits.
pub(crate) const MAGIC_NEWC: &[u8; 6] = b"070701";
/// Magic of the variant whose `check` field is the byte sum of the payload.
pub(crate) const MAGIC_CRC: &[u8; 6] = b"070702";
/// 6 bytes of magic plus 13 fields of 8 hex digits.
pub(crate) const HEADER_LEN: usize = 110;
pub(crate) const TRAILER_NAME: &[u8] = b"TRAILER!!!";

pub(crate) const S_IFMT: u32 = 0o170_000;
pub(crate) const S_IFSOCK: u32 = 0o140_000;
pub(crate) const S_IFLNK: u32 = 0o120_000;
pub(crate) const S_IFREG: u32 = 0o100_000;
pub(crate) const S_IFBLK: u32 = 0o060_000;
pub(crate) const S_IFDIR: u32 = 0o040_000;
pub(crate) const S_IFCHR: u32 = 0o020_000;
pub(crate) const S_IFIFO: u32 = 0o010_000;

/// Field names in header order, used in error messages (namesize is handled separately).
pub(crate) const FIELD_NAMES: [&str; 13] = [
    "c_ino",
    "c_mode",
    "c_uid",
    "c_gid",
    "c_nlink",
    "c_mtime",
    "c_filesize",
    "c_maj",
    "c_min",
    "c_rmaj",
    "c_rmin",
    "c_namesize",
    "c_chksum",
];

/// The numeric header fields other than `namesize`, which is derived from the name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Header {
    pub ino: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub mtime: u32,
    pub filesize: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub check: u32,
}

/// Append a `070701` header, the name with its NUL, and the zero padding that brings
/// header + name to a multiple of four. `out` must start at an archive boundary, since the
/// padding is computed from `out.len()`.
pub(crate) fn push_header(out: &mut Vec<u8>, h: &Header, name: &[u8]) {
    // Callers bound names to < 4 GiB, so this never saturates in practice.
    let namesize = u32::try_from(name.len() + 1).unwrap_or(u32::MAX);
    out.extend_from_slice(MAGIC_NEWC);
    for value in [
        h.ino,
        h.mode,
        h.uid,
        h.gid,
        h.nlink,
        h.mtime,
        h.filesize,
        h.dev_major,
        h.dev_minor,
        h.rdev_major,
        h.rdev_minor,
        namesize,
        h.check,
    ] {
        push_hex8(out, value);
    }
    out.extend_from_slice(name);
    out.push(0);
    pad4(out);
}

/// Upper-case like the kernel's own `gen_init_cpio`; the reader accepts either case.
fn push_hex8(out: &mut Vec<u8>, value: u32) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    for shift in (0..8).rev() {
        out.push(DIGITS[((value >> (shift * 4)) & 0xF) as usize]);
    }
}

/// Zero-pad to the next multiple of four.
pub(crate) fn pad4(out: &mut Vec<u8>) {
    let rem = out.len() % 4;
    if rem != 0 {
        out.resize(out.len() + (4 - rem), 0);
    }
}

/// Decode exactly eight hex digits; `None` on anything else (including a `+` or spaces,
/// which `u32::from_str_radix` would partly accept).
pub(crate) fn parse_hex8(field: &[u8]) -> Option<u32> {
    if field.len() != 8 {
        return None;
    }
    field.iter().try_fold(0u32, |acc, &b| {
        let digit = char::from(b).to_digit(16)?;
        Some((acc << 4) | digit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        for v in [0, 1, 0xABCD_EF01, u32::MAX] {
            let mut out = Vec::new();
            push_hex8(&mut out, v);
            assert_eq!(parse_hex8(&out), Some(v));
        }
        assert_eq!(parse_hex8(b"0000abcd"), Some(0xABCD));
        assert_eq!(parse_hex8(b"+0000001"), None);
        assert_eq!(parse_hex8(b"0000 001"), None);
        assert_eq!(parse_hex8(b"0000001"), None);
    }
}
