//! Errors from building and parsing newc archives.

/// Everything that can go wrong while building or parsing a newc archive.
///
/// Parse errors carry the byte offset (from the start of the buffer) of the header or byte at
/// fault, so a corrupt initramfs can be located with `xxd -s`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpioError {
    /// A path handed to the writer cannot be stored faithfully.
    #[error("invalid archive path {path:?}: {reason}")]
    InvalidPath {
        /// The path as the caller gave it.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// Permission bits outside `0o7777` (the file type is implied by the writer method).
    #[error("invalid mode {mode:#o} for {path:?}: only permission bits (0o7777) may be given")]
    InvalidMode {
        /// The path the mode was given for.
        path: String,
        /// The rejected mode.
        mode: u32,
    },

    /// A symlink target that is empty or contains a NUL byte.
    #[error("invalid symlink target {target:?} for {path:?}")]
    InvalidSymlinkTarget {
        /// The link path.
        path: String,
        /// The rejected target.
        target: String,
    },

    /// File contents larger than the 32-bit `filesize` field can describe.
    #[error("{path:?} is {len} bytes; newc entries are limited to 4 GiB - 1")]
    TooLarge {
        /// The path of the oversized entry.
        path: String,
        /// Its length in bytes.
        len: usize,
    },

    /// The buffer holds only zero bytes (or nothing at all).
    #[error("no cpio archive found (buffer is empty or all zero)")]
    NoArchive,

    /// The buffer ends in the middle of a header, name, payload or padding.
    #[error("truncated archive: {what} at offset {offset} needs {needed} bytes, {available} left")]
    Truncated {
        /// Which part was being read.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// How many bytes it needs.
        needed: usize,
        /// How many bytes remain in the buffer.
        available: usize,
    },

    /// A header does not start with `070701` or `070702`.
    #[error("bad magic {found:?} at offset {offset} (expected \"070701\" or \"070702\")")]
    BadMagic {
        /// Header offset.
        offset: usize,
        /// The six bytes found, lossily decoded.
        found: String,
    },

    /// A header field is not exactly eight hexadecimal digits.
    #[error("header field {field} at offset {offset} is not 8 hex digits")]
    BadHexField {
        /// Header offset.
        offset: usize,
        /// Field name as in the kernel's buffer-format documentation.
        field: &'static str,
    },

    /// The name is empty, lacks its terminating NUL, or has a NUL inside.
    #[error("bad entry name at offset {offset}: {reason}")]
    BadName {
        /// Header offset.
        offset: usize,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// Alignment padding contains non-zero bytes, or an archive starts at an offset that is
    /// not a multiple of four (the kernel's "broken padding").
    #[error("broken padding at offset {offset}")]
    BadPadding {
        /// Offset of the offending byte.
        offset: usize,
    },

    /// The `check` field disagrees with the payload (070702) or is non-zero (070701).
    #[error(
        "check field mismatch at offset {offset}: header says {expected:#x}, computed {actual:#x}"
    )]
    BadCheck {
        /// Header offset.
        offset: usize,
        /// Value stored in the header.
        expected: u32,
        /// Value computed from the payload (always 0 for 070701).
        actual: u32,
    },

    /// `mode` names no file type the kernel's initramfs unpacker knows.
    #[error("entry at offset {offset} has unknown file type in mode {mode:#o}")]
    UnknownFileType {
        /// Header offset.
        offset: usize,
        /// The full mode field.
        mode: u32,
    },

    /// An entry whose type carries no payload (directory, device, FIFO, socket, trailer) has a
    /// non-zero `filesize`, or a symlink has an empty target.
    #[error("entry at offset {offset} has an invalid payload size {size} for its type")]
    BadPayloadSize {
        /// Header offset.
        offset: usize,
        /// The `filesize` field.
        size: u32,
    },

    /// The buffer ends before a `TRAILER!!!` entry closes the current archive.
    #[error("archive starting at offset {offset} has no TRAILER!!! entry")]
    MissingTrailer {
        /// Offset of the archive's first header.
        offset: usize,
    },
}
