//! The deterministic newc writer.

use crate::error::CpioError;
use crate::format::{pad4, push_header, Header, S_IFCHR, S_IFDIR, S_IFLNK, S_IFREG, TRAILER_NAME};

/// What an entry is, with the payload or device numbers that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
    CharDevice { major: u32, minor: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    path: String,
    perm: u32,
    node: Node,
}

/// Builds a newc (`070701`) archive whose bytes depend only on what was added, in what order,
/// and the chosen mtime.
///
/// Everything that would normally leak from the build host is fixed: uid/gid are 0, inode
/// numbers count up from 1 in insertion order (the trailer gets 0, as GNU cpio does), nlink is
/// 2 for directories and 1 otherwise, and every entry gets the same mtime (pass
/// `SOURCE_DATE_EPOCH`; the default is 0). Distinct inode numbers with nlink 1 keep the
/// kernel from treating two entries as hard links of each other.
///
/// Parent directories are not created implicitly; add them first, because the kernel unpacks
/// entries strictly in order and fails to create a file whose directory does not exist yet.
///
/// ```
/// let mut w = slate_cpio::CpioWriter::with_mtime(1_700_000_000);
/// w.dir("dev", 0o755)?
///     .char_device("dev/console", 0o600, 5, 1)?
///     .file("/init", 0o755, b"#!/bin/sh\n".to_vec())?;
/// let archive = w.finish();
/// assert!(archive.starts_with(b"070701"));
/// # Ok::<(), slate_cpio::CpioError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpioWriter {
    entries: Vec<Pending>,
    mtime: u32,
}

impl CpioWriter {
    /// An empty archive with mtime 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty archive whose entries all carry `mtime` (seconds since the epoch, typically
    /// `SOURCE_DATE_EPOCH`). The newc field is 32 bits wide, hence `u32`.
    pub fn with_mtime(mtime: u32) -> Self {
        Self {
            entries: Vec::new(),
            mtime,
        }
    }

    /// The mtime every entry will carry.
    pub fn mtime(&self) -> u32 {
        self.mtime
    }

    /// Number of entries added so far (the trailer is not counted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing has been added yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Add a directory with permission bits `mode` (e.g. `0o755`).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self, CpioError> {
        self.push(path, mode, Node::Dir)
    }

    /// Add a regular file with permission bits `mode` and the given contents.
    pub fn file(
        &mut self,
        path: &str,
        mode: u32,
        data: impl Into<Vec<u8>>,
    ) -> Result<&mut Self, CpioError> {
        let data = data.into();
        check_size(path, data.len())?;
        self.push(path, mode, Node::File(data))
    }

    /// Add a symbolic link pointing at `target` (stored verbatim, relative or absolute).
    /// Links get mode `0o777`, as on Linux, where link permissions are meaningless.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self, CpioError> {
        if target.is_empty() || target.contains('\0') {
            return Err(CpioError::InvalidSymlinkTarget {
                path: path.to_owned(),
                target: target.to_owned(),
            });
        }
        check_size(path, target.len())?;
        self.push(path, 0o777, Node::Symlink(target.as_bytes().to_vec()))
    }

    /// Add a character device node, e.g. `char_device("dev/console", 0o600, 5, 1)`, which the
    /// kernel needs before it can open a console for PID 1 when devtmpfs is not mounted yet.
    pub fn char_device(
        &mut self,
        path: &str,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<&mut Self, CpioError> {
        self.push(path, mode, Node::CharDevice { major, minor })
    }

    /// Serialise the archive: entries in insertion order, then `TRAILER!!!`. The result's
    /// length is a multiple of four, so it can be concatenated as is.
    pub fn finish(&self) -> Vec<u8> {
        let payload: usize = self
            .entries
            .iter()
            .map(|e| 128 + e.path.len() + payload_of(&e.node).len())
            .sum();
        let mut out = Vec::with_capacity(payload + 128);
        for (index, entry) in self.entries.iter().enumerate() {
            let (kind, nlink, rdev) = match entry.node {
                Node::Dir => (S_IFDIR, 2, (0, 0)),
                Node::File(_) => (S_IFREG, 1, (0, 0)),
                Node::Symlink(_) => (S_IFLNK, 1, (0, 0)),
                Node::CharDevice { major, minor } => (S_IFCHR, 1, (major, minor)),
            };
            let data = payload_of(&entry.node);
            let header = Header {
                // Sizes and counts were bounded when the entry was added, so these
                // conversions cannot truncate; saturate rather than panic regardless.
                ino: u32::try_from(index + 1).unwrap_or(u32::MAX),
                mode: kind | entry.perm,
                uid: 0,
                gid: 0,
                nlink,
                mtime: self.mtime,
                filesize: u32::try_from(data.len()).unwrap_or(u32::MAX),
                dev_major: 0,
                dev_minor: 0,
                rdev_major: rdev.0,
                rdev_minor: rdev.1,
                check: 0,
            };
            push_header(&mut out, &header, entry.path.as_bytes());
            out.extend_from_slice(data);
            pad4(&mut out);
        }
        let trailer = Header {
            nlink: 1,
            ..Header::default()
        };
        push_header(&mut out, &trailer, TRAILER_NAME);
        out
    }

    fn push(&mut self, path: &str, perm: u32, node: Node) -> Result<&mut Self, CpioError> {
        if perm & !0o7777 != 0 {
            return Err(CpioError::InvalidMode {
                path: path.to_owned(),
                mode: perm,
            });
        }
        let path = normalize_path(path)?;
        self.entries.push(Pending { path, perm, node });
        Ok(self)
    }
}

fn payload_of(node: &Node) -> &[u8] {
    match node {
        Node::File(data) | Node::Symlink(data) => data,
        Node::Dir | Node::CharDevice { .. } => &[],
    }
}

fn check_size(path: &str, len: usize) -> Result<(), CpioError> {
    if u32::try_from(len).is_err() {
        return Err(CpioError::TooLarge {
            path: path.to_owned(),
            len,
        });
    }
    Ok(())
}

/// Archive names are relative (the kernel unpacks relative to `/` anyway, and GNU cpio refuses
/// absolute names without `--absolute-filenames`), so a leading `/` is dropped. Everything
/// that would make the name ambiguous or dangerous to unpack elsewhere is refused rather than
/// silently rewritten, so the archive always says exactly what the caller meant.
fn normalize_path(path: &str) -> Result<String, CpioError> {
    let invalid = |reason| CpioError::InvalidPath {
        path: path.to_owned(),
        reason,
    };
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(invalid("empty path (the root directory needs no entry)"));
    }
    if trimmed.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if trimmed.as_bytes() == TRAILER_NAME {
        return Err(invalid("TRAILER!!! would end the archive early"));
    }
    for component in trimmed.split('/') {
        match component {
            "" => return Err(invalid("empty path component (\"//\")")),
            "." | ".." => return Err(invalid("\".\" and \"..\" components are not allowed")),
            _ => {}
        }
    }
    // namesize (length + NUL) is a 32-bit field.
    if u32::try_from(trimmed.len() + 1).is_err() {
        return Err(invalid("name longer than 4 GiB"));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_and_trailing_slashes_are_dropped() {
        assert_eq!(normalize_path("/etc/os-release").unwrap(), "etc/os-release");
        assert_eq!(normalize_path("usr/lib/").unwrap(), "usr/lib");
    }

    #[test]
    fn dangerous_paths_are_refused() {
        for bad in ["", "/", "a//b", "../etc", "a/./b", "TRAILER!!!", "a\0b"] {
            assert!(
                matches!(normalize_path(bad), Err(CpioError::InvalidPath { .. })),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn mode_with_type_bits_is_refused() {
        let mut w = CpioWriter::new();
        let err = w.file("init", 0o100755, Vec::new()).unwrap_err();
        assert!(matches!(err, CpioError::InvalidMode { mode: 0o100755, .. }));
        assert!(w.is_empty());
    }

    #[test]
    fn empty_symlink_target_is_refused() {
        let mut w = CpioWriter::new();
        assert!(matches!(
            w.symlink("init", ""),
            Err(CpioError::InvalidSymlinkTarget { .. })
        ));
    }

    #[test]
    fn exact_header_bytes_for_one_directory() {
        let mut w = CpioWriter::new();
        w.dir("dev", 0o755).unwrap();
        let out = w.finish();
        let expected_header = concat!(
            "070701", "00000001", "000041ED", "00000000", "00000000", "00000002", "00000000",
            "00000000", "00000000", "00000000", "00000000", "00000000", "00000004", "00000000",
        );
        assert_eq!(&out[..110], expected_header.as_bytes());
        // 110 + "dev\0" = 114, padded to 116.
        assert_eq!(&out[110..116], b"dev\0\0\0");
        assert_eq!(&out[116..122], b"070701");
        // Trailer: 110 + 11 = 121, padded to 124.
        assert_eq!(out.len(), 116 + 124);
        assert_eq!(&out[116 + 110..116 + 121], b"TRAILER!!!\0");
    }
}
