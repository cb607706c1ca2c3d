//! A strict newc reader, for verifying what the writer produced and for fuzzing.
//!
//! It follows the kernel's grammar for uncompressed buffers (runs of zero bytes and archives,
//! each archive starting on a 4-byte boundary and ending with `TRAILER!!!`) but is stricter
//! than the kernel about everything inside an archive: non-zero padding, stray `check` values,
//! unknown file types and payloads on payload-less entries are all errors. Compressed members
//! are not understood. Every offset is bounds-checked, so no input can make it panic.

use crate::error::CpioError;
use crate::format::{
    parse_hex8, FIELD_NAMES, HEADER_LEN, MAGIC_CRC, MAGIC_NEWC, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO,
    S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK, TRAILER_NAME,
};

/// The type of an archive entry, from the `S_IFMT` bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A directory.
    Directory,
    /// A regular file; the payload is its contents.
    File,
    /// A symbolic link; the payload is its target.
    Symlink,
    /// A character device; see `rdev_major`/`rdev_minor`.
    CharDevice,
    /// A block device; see `rdev_major`/`rdev_minor`.
    BlockDevice,
    /// A named pipe.
    Fifo,
    /// A UNIX socket.
    Socket,
}

impl EntryKind {
    /// Map the `S_IFMT` bits of a mode to a kind.
    pub fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode & S_IFMT {
            S_IFDIR => Self::Directory,
            S_IFREG => Self::File,
            S_IFLNK => Self::Symlink,
            S_IFCHR => Self::CharDevice,
            S_IFBLK => Self::BlockDevice,
            S_IFIFO => Self::Fifo,
            S_IFSOCK => Self::Socket,
            _ => return None,
        })
    }
}

/// One parsed archive member, with every header field as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name without its terminating NUL. Bytes, because nothing in the format requires
    /// UTF-8; see [`Entry::name_str`].
    pub name: Vec<u8>,
    /// `c_ino`.
    pub ino: u32,
    /// `c_mode`: file type and permission bits.
    pub mode: u32,
    /// `c_uid`.
    pub uid: u32,
    /// `c_gid`.
    pub gid: u32,
    /// `c_nlink`.
    pub nlink: u32,
    /// `c_mtime`, seconds since the epoch.
    pub mtime: u32,
    /// `c_maj`: major number of the device the file came from.
    pub dev_major: u32,
    /// `c_min`.
    pub dev_minor: u32,
    /// `c_rmaj`: major number of a device node.
    pub rdev_major: u32,
    /// `c_rmin`: minor number of a device node.
    pub rdev_minor: u32,
    /// File contents or symlink target; empty for every other type.
    pub data: Vec<u8>,
}

impl Entry {
    /// The entry type, or `None` if the mode has no known type (the reader never returns
    /// such entries, but the fields are public).
    pub fn kind(&self) -> Option<EntryKind> {
        EntryKind::from_mode(self.mode)
    }

    /// The permission bits (`mode & 0o7777`).
    pub fn permissions(&self) -> u32 {
        self.mode & 0o7777
    }

    /// The name as UTF-8, if it is.
    pub fn name_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.name).ok()
    }
}

/// Parse a buffer of one or more concatenated uncompressed newc archives (as produced by
/// [`crate::CpioWriter::finish`] and [`crate::concat_initrds`]) into its entries, in order,
/// without the `TRAILER!!!` markers.
///
/// Zero bytes between and after archives are skipped; an archive must start at an offset
/// that is a multiple of four and must end with `TRAILER!!!`. A buffer with no archive at all
/// is an error.
pub fn parse_newc(buf: &[u8]) -> Result<Vec<Entry>, CpioError> {
    let mut entries = Vec::new();
    let mut pos = 0;
    let mut archives = 0usize;
    loop {
        while buf.get(pos) == Some(&0) {
            pos += 1;
        }
        if pos >= buf.len() {
            break;
        }
        // The kernel only looks for a header on a 4-byte boundary; anything else after a
        // trailer is what it reports as "broken padding".
        if pos % 4 != 0 {
            return Err(CpioError::BadPadding { offset: pos });
        }
        pos = parse_archive(buf, pos, &mut entries)?;
        archives += 1;
    }
    if archives == 0 {
        return Err(CpioError::NoArchive);
    }
    Ok(entries)
}

/// Parse entries from `start` up to and including a trailer; return the offset after it.
fn parse_archive(buf: &[u8], start: usize, entries: &mut Vec<Entry>) -> Result<usize, CpioError> {
    let mut pos = start;
    loop {
        if pos >= buf.len() {
            return Err(CpioError::MissingTrailer { offset: start });
        }
        let (entry, next, is_trailer) = parse_entry(buf, pos)?;
        pos = next;
        if is_trailer {
            return Ok(pos);
        }
        entries.push(entry);
    }
}

fn take<'a>(
    buf: &'a [u8],
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], CpioError> {
    offset
        .checked_add(len)
        .and_then(|end| buf.get(offset..end))
        .ok_or(CpioError::Truncated {
            what,
            offset,
            needed: len,
            available: buf.len().saturating_sub(offset),
        })
}

/// Check that the bytes from `offset` up to the next multiple of four exist and are zero;
/// return the aligned offset.
fn skip_padding(buf: &[u8], offset: usize) -> Result<usize, CpioError> {
    let pad = (4 - offset % 4) % 4;
    let bytes = take(buf, offset, pad, "padding")?;
    if let Some(i) = bytes.iter().position(|&b| b != 0) {
        return Err(CpioError::BadPadding { offset: offset + i });
    }
    Ok(offset + pad)
}

fn parse_entry(buf: &[u8], pos: usize) -> Result<(Entry, usize, bool), CpioError> {
    let header = take(buf, pos, HEADER_LEN, "header")?;
    let magic = &header[..6];
    let is_crc = match magic {
        m if m == MAGIC_NEWC => false,
        m if m == MAGIC_CRC => true,
        other => {
            return Err(CpioError::BadMagic {
                offset: pos,
                found: String::from_utf8_lossy(other).into_owned(),
            })
        }
    };
    let mut fields = [0u32; 13];
    for (i, (slot, name)) in fields.iter_mut().zip(FIELD_NAMES).enumerate() {
        let raw = &header[6 + i * 8..6 + (i + 1) * 8];
        *slot = parse_hex8(raw).ok_or(CpioError::BadHexField {
            offset: pos,
            field: name,
        })?;
    }
    let [ino, mode, uid, gid, nlink, mtime, filesize, dev_major, dev_minor, rdev_major, rdev_minor, namesize, check] =
        fields;

    let name_off = pos + HEADER_LEN;
    let name_with_nul = take(buf, name_off, namesize as usize, "name")?;
    let name = match name_with_nul.split_last() {
        None => return Err(name_error(pos, "namesize is 0")),
        Some((&0, [])) => return Err(name_error(pos, "empty name")),
        Some((&0, name)) if name.contains(&0) => {
            return Err(name_error(pos, "NUL byte inside the name"))
        }
        Some((&0, name)) => name,
        Some(_) => return Err(name_error(pos, "name is not NUL-terminated")),
    };
    let data_off = skip_padding(buf, name_off + name_with_nul.len())?;
    let data = take(buf, data_off, filesize as usize, "file data")?;
    let next = skip_padding(buf, data_off + data.len())?;

    let computed = if is_crc {
        data.iter()
            .fold(0u32, |acc, &b| acc.wrapping_add(u32::from(b)))
    } else {
        0
    };
    if check != computed {
        return Err(CpioError::BadCheck {
            offset: pos,
            expected: check,
            actual: computed,
        });
    }

    let is_trailer = name == TRAILER_NAME;
    let payload_ok = if is_trailer {
        filesize == 0
    } else {
        match EntryKind::from_mode(mode) {
            None => return Err(CpioError::UnknownFileType { offset: pos, mode }),
            Some(EntryKind::File) => true,
            Some(EntryKind::Symlink) => filesize > 0,
            Some(_) => filesize == 0,
        }
    };
    if !payload_ok {
        return Err(CpioError::BadPayloadSize {
            offset: pos,
            size: filesize,
        });
    }

    let entry = Entry {
        name: name.to_vec(),
        ino,
        mode,
        uid,
        gid,
        nlink,
        mtime,
        dev_major,
        dev_minor,
        rdev_major,
        rdev_minor,
        data: data.to_vec(),
    };
    Ok((entry, next, is_trailer))
}

fn name_error(offset: usize, reason: &'static str) -> CpioError {
    CpioError::BadName { offset, reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpioWriter;

    fn sample() -> Vec<u8> {
        let mut w = CpioWriter::with_mtime(42);
        w.dir("etc", 0o755)
            .unwrap()
            .file("etc/hostname", 0o644, b"node\n".to_vec())
            .unwrap();
        w.finish()
    }

    #[test]
    fn empty_and_all_zero_buffers_hold_no_archive() {
        assert_eq!(parse_newc(&[]), Err(CpioError::NoArchive));
        assert_eq!(parse_newc(&[0; 64]), Err(CpioError::NoArchive));
    }

    #[test]
    fn trailing_zeros_are_accepted_but_not_garbage() {
        let mut buf = sample();
        buf.extend_from_slice(&[0; 509]);
        assert_eq!(parse_newc(&buf).unwrap().len(), 2);
        buf.push(7);
        assert!(matches!(
            parse_newc(&buf),
            Err(CpioError::BadPadding { .. })
        ));
    }

    #[test]
    fn missing_trailer_is_reported() {
        let buf = sample();
        // Cut right before the trailer header.
        let cut = buf.len() - 124;
        assert_eq!(
            parse_newc(&buf[..cut]),
            Err(CpioError::MissingTrailer { offset: 0 })
        );
    }

    #[test]
    fn truncation_anywhere_is_an_error_not_a_panic() {
        let buf = sample();
        for cut in 1..buf.len() {
            assert!(parse_newc(&buf[..cut]).is_err(), "cut at {cut} parsed");
        }
    }

    #[test]
    fn non_zero_padding_is_rejected() {
        let mut buf = sample();
        // First entry: 110 + "etc\0" = 114, so bytes 114 and 115 are padding.
        buf[115] = b'x';
        assert_eq!(parse_newc(&buf), Err(CpioError::BadPadding { offset: 115 }));
    }

    #[test]
    fn bad_magic_and_hex_are_rejected() {
        let mut buf = sample();
        buf[5] = b'7';
        assert!(matches!(
            parse_newc(&buf),
            Err(CpioError::BadMagic { offset: 0, .. })
        ));
        let mut buf = sample();
        buf[6] = b'g';
        assert_eq!(
            parse_newc(&buf),
            Err(CpioError::BadHexField {
                offset: 0,
                field: "c_ino"
            })
        );
    }

    #[test]
    fn crc_variant_checks_the_byte_sum() {
        let mut buf = sample();
        // Second entry starts at 116; turn it into 070702 with the right sum of "node\n".
        let sum: u32 = b"node\n".iter().map(|&b| u32::from(b)).sum();
        buf[116 + 5] = b'2';
        buf[116 + 102..116 + 110].copy_from_slice(format!("{sum:08x}").as_bytes());
        assert_eq!(parse_newc(&buf).unwrap()[1].data, b"node\n");
        buf[116 + 109] ^= 1;
        assert!(matches!(
            parse_newc(&buf),
            Err(CpioError::BadCheck { offset: 116, .. })
        ));
    }
}
