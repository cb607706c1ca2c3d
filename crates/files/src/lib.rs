//! Reading the files a user names (issue 44, item 1): configurations, keys and key
//! directories, profiles and their inputs, disk images, the FleetLock store. Every one is opened
//! as what it must be, and anything else is refused at once, by name:
//!
//! - the open never waits: `O_NONBLOCK | O_NOCTTY`, so a FIFO without a writer opens at once
//!   (and is then refused) and a terminal does not become the controlling one;
//! - the opened descriptor is `fstat`ed and must be a regular file ([`open_regular`]), or a
//!   regular file or a block device where a disk is expected ([`open_disk`]): a FIFO, a
//!   directory, a character device (`/dev/zero`), a socket are named in the refusal, and so is
//!   a dangling symbolic link;
//! - a file larger than its bound is refused before a byte is read, and the read itself stops
//!   one byte past the bound, so a file that grows while it is read is still bounded.
//!
//! Links are followed (a configuration under `/etc` may well be one); bundle blobs, which
//! must not be links, are opened by `slate_bundle`'s own rule on top of [`irregular_kind`].

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The name is there but is not what the caller reads: "the machine configuration
    /// /tmp/f is a FIFO (named pipe), not a regular file".
    #[error("{what} {} is {kind}, not {expected}", path.display())]
    NotAFile {
        what: String,
        path: PathBuf,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("{what} {} is larger than {limit} bytes", path.display())]
    TooLarge {
        what: String,
        path: PathBuf,
        limit: u64,
    },
    #[error("{what} {} is not UTF-8 text", path.display())]
    NotText { what: String, path: PathBuf },
    #[error("{what} {} holds more than {limit} entries", path.display())]
    TooManyEntries {
        what: String,
        path: PathBuf,
        limit: usize,
    },
    #[error("reading {what} {}", path.display())]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileError::NotAFile { path, .. }
            | FileError::TooLarge { path, .. }
            | FileError::NotText { path, .. }
            | FileError::TooManyEntries { path, .. }
            | FileError::Io { path, .. } => path,
        }
    }

    /// Whether the file (or a directory on its way) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// This error as an `io::Error` (its kind kept where it has one), for APIs that return one.
    pub fn into_io(self) -> io::Error {
        let kind = match &self {
            FileError::Io { source, .. } => source.kind(),
            FileError::TooLarge { .. } | FileError::TooManyEntries { .. } => {
                io::ErrorKind::FileTooLarge
            }
            FileError::NotText { .. } => io::ErrorKind::InvalidData,
            FileError::NotAFile { .. } => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, self)
    }
}

/// What kind of file `meta` describes when it is not a regular file ("a FIFO (named pipe)"),
/// for refusals; `None` for a regular file.
pub fn irregular_kind(meta: &Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    if kind.is_file() {
        None
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_char_device() {
        Some("a character device")
    } else {
        Some("not a regular file")
    }
}

/// Open `path` for reading if it is a regular file (links followed). `what` names it in
/// errors ("the machine configuration").
pub fn open_regular(path: &Path, what: &str) -> Result<File, FileError> {
    open_checked(path, what, false, true, "a regular file", irregular_kind)
}

/// [`open_regular`] without following a link: a link is refused as "a symbolic link", also
/// when the name became one after it was looked at (`O_NOFOLLOW`). For files inside a layout
/// slate reads (bundle blobs), where a link could point at `/etc/shadow`.
pub fn open_regular_no_link(path: &Path, what: &str) -> Result<File, FileError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if let Some(kind) = irregular_kind(&meta) {
            return Err(FileError::NotAFile {
                what: what.to_owned(),
                path: path.to_owned(),
                kind,
                expected: "a regular file",
            });
        }
    }
    open_checked(path, what, false, false, "a regular file", irregular_kind)
}

/// Open a disk: a regular file (an image) or a block device, read-only or read-write. A
/// directory, a FIFO or a character device such as `/dev/zero` is refused before a byte is
/// read: the GPT reader would otherwise wait on a FIFO forever, or take a directory's size for
/// a disk's.
pub fn open_disk(path: &Path, writable: bool) -> Result<File, FileError> {
    open_checked(
        path,
        "the disk",
        writable,
        true,
        "a disk image or a block device",
        |meta| {
            if meta.file_type().is_block_device() {
                None
            } else {
                irregular_kind(meta)
            }
        },
    )
}

/// Read the regular file `path` whole, if it holds at most `max_bytes`.
pub fn read_file_bounded(path: &Path, max_bytes: u64, what: &str) -> Result<Vec<u8>, FileError> {
    let file = open_regular(path, what)?;
    let io = |source| FileError::Io {
        what: what.to_owned(),
        path: path.to_owned(),
        source,
    };
    let too_large = || FileError::TooLarge {
        what: what.to_owned(),
        path: path.to_owned(),
        limit: max_bytes,
    };
    let size = file.metadata().map_err(io)?.len();
    if size > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // One byte past the bound tells a file that grew after the look from one that did not.
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read_file_bounded`] for a text file: UTF-8 or refused.
pub fn read_string_bounded(path: &Path, max_bytes: u64, what: &str) -> Result<String, FileError> {
    let bytes = read_file_bounded(path, max_bytes, what)?;
    String::from_utf8(bytes).map_err(|_| FileError::NotText {
        what: what.to_owned(),
        path: path.to_owned(),
    })
}

/// That `dir` is a directory (links followed), or what it is instead, by name.
pub fn check_dir(dir: &Path, what: &str) -> Result<(), FileError> {
    let meta = std::fs::metadata(dir).map_err(|e| not_found_or_io(dir, what, "a directory", e))?;
    if meta.is_dir() {
        return Ok(());
    }
    Err(FileError::NotAFile {
        what: what.to_owned(),
        path: dir.to_owned(),
        kind: irregular_kind(&meta).unwrap_or("a regular file"),
        expected: "a directory",
    })
}

/// The most entries [`files_in`] looks at in one directory.
pub const MAX_DIR_ENTRIES: usize = 4096;

/// The files of the directory `dir` whose names `wanted` accepts, sorted: a key directory's
/// `*.pub`. Each of them must be a regular file (links followed): a FIFO `x.pub` is refused
/// by name here, before any is read, as is a dangling link. Entries `wanted` passes over are
/// not looked at; more than [`MAX_DIR_ENTRIES`] entries in all is refused.
pub fn files_in(
    dir: &Path,
    what: &str,
    wanted: impl Fn(&Path) -> bool,
) -> Result<Vec<PathBuf>, FileError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| FileError::Io {
            what: what.to_owned(),
            path,
            source,
        }
    };
    check_dir(dir, what)?;
    let mut paths = Vec::new();
    for (seen, entry) in std::fs::read_dir(dir).map_err(io(dir))?.enumerate() {
        if seen >= MAX_DIR_ENTRIES {
            return Err(FileError::TooManyEntries {
                what: what.to_owned(),
                path: dir.to_owned(),
                limit: MAX_DIR_ENTRIES,
            });
        }
        let path = entry.map_err(io(dir))?.path();
        if wanted(&path) {
            paths.push(path);
        }
    }
    paths.sort();
    for path in &paths {
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => return Err(not_found_or_io(path, what, "a regular file", e)),
        };
        if let Some(kind) = irregular_kind(&meta) {
            return Err(FileError::NotAFile {
                what: what.to_owned(),
                path: path.to_owned(),
                kind,
                expected: "a regular file",
            });
        }
    }
    Ok(paths)
}

/// A missing file, told apart from a link to one that is missing.
fn not_found_or_io(
    path: &Path,
    what: &str,
    expected: &'static str,
    source: io::Error,
) -> FileError {
    if source.kind() == io::ErrorKind::NotFound
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
    {
        return FileError::NotAFile {
            what: what.to_owned(),
            path: path.to_owned(),
            kind: "a dangling symbolic link",
            expected,
        };
    }
    FileError::Io {
        what: what.to_owned(),
        path: path.to_owned(),
        source,
    }
}

fn open_checked(
    path: &Path,
    what: &str,
    writable: bool,
    follow: bool,
    expected: &'static str,
    refuse: impl Fn(&Metadata) -> Option<&'static str>,
) -> Result<File, FileError> {
    let not_a_file = |kind| FileError::NotAFile {
        what: what.to_owned(),
        path: path.to_owned(),
        kind,
        expected,
    };
    let io = |source| FileError::Io {
        what: what.to_owned(),
        path: path.to_owned(),
        source,
    };
    let mut flags = OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    if !follow {
        flags |= OFlag::O_NOFOLLOW;
    }
    let file = match OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(flags.bits())
        .open(path)
    {
        Ok(file) => file,
        // The name became a link between the look and the open.
        Err(e) if !follow && e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) => {
            return Err(not_a_file("a symbolic link"));
        }
        Err(e) => {
            // A directory opened for writing (EISDIR), a socket (ENXIO), a FIFO opened for
            // writing without a reader (ENXIO): say what the name is, not the errno.
            if e.kind() != io::ErrorKind::NotFound {
                if let Some(kind) = std::fs::metadata(path).ok().as_ref().and_then(&refuse) {
                    return Err(not_a_file(kind));
                }
            }
            return Err(not_found_or_io(path, what, expected, e));
        }
    };
    let meta = file.metadata().map_err(io)?;
    if let Some(kind) = refuse(&meta) {
        return Err(not_a_file(kind));
    }
    // A regular file or a block device: reads and writes block as usual from here on.
    let flags = fcntl(&file, FcntlArg::F_GETFL).map_err(|e| io(e.into()))?;
    let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
    fcntl(&file, FcntlArg::F_SETFL(flags)).map_err(|e| io(e.into()))?;
    Ok(file)
}

#[cfg(test)]
mod tests;
