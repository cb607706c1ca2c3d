//! Error types. Every message names what was wrong and where.

use thiserror::Error;

/// Why a string is not a valid BLS entry file name (or a requested rename is impossible).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("empty entry file name")]
    Empty,
    #[error("entry file name is {len} characters long; at most 255 are allowed")]
    TooLong { len: usize },
    #[error(
        "character {ch:?} at byte {offset} is not allowed in an entry file name \
         (only ASCII letters, digits and + - _ .)"
    )]
    BadChar { ch: char, offset: usize },
    #[error("entry file names starting with '.' are skipped by systemd-boot")]
    Hidden,
    #[error("entry file names starting with 'auto-' are skipped by systemd-boot")]
    AutoPrefix,
    #[error("entry file name must end in .conf (type #1) or .efi (type #2)")]
    NoSuffix,
    #[error("entry file name has nothing before its boot counter and suffix")]
    EmptyStem,
    #[error("'+' at byte {offset} of an entry stem would be read as a boot counter")]
    PlusInStem { offset: usize },
    #[error("{tries} boot tries is more than systemd-boot accepts (at most 2147483647)")]
    TriesOutOfRange { tries: u32 },
}

/// Why a `loader.conf` text is refused. systemd-boot itself logs such lines and ignores them;
/// slate refuses the whole file so that its prediction never rests on an ignored line.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LoaderConfError {
    #[error("loader.conf line {line}: NUL byte (systemd-boot stops reading there)")]
    Nul { line: usize },
    #[error("loader.conf line {line}: key `{key}` has no value")]
    MissingValue { line: usize, key: String },
    #[error(
        "loader.conf line {line}: timeout {value:?} is neither a number of seconds (0-4294967295) \
         nor menu-force, menu-hidden or menu-disabled"
    )]
    InvalidTimeout { line: usize, value: String },
    #[error(
        "loader.conf line {line}: default {value:?} is a special identifier other than @saved"
    )]
    UnsupportedDefault { line: usize, value: String },
}

/// Why the bytes of an efivarfs file do not hold a systemd-boot string variable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EfiVarError {
    #[error("EFI variable file is {len} bytes; it needs at least the 4-byte attribute header")]
    TooShort { len: usize },
    #[error("EFI variable string data is {len} bytes, not a whole number of UTF-16 units")]
    OddLength { len: usize },
    #[error("EFI variable string is not valid UTF-16 at unit {unit}")]
    InvalidUtf16 { unit: usize },
    #[error("EFI variable string has a NUL before its end, at unit {unit}")]
    EmbeddedNul { unit: usize },
}

/// Why a Type #1 entry (`loader/entries/*.conf`) is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Type1Error {
    #[error("boot entry line {line}: NUL byte (systemd-boot stops reading there)")]
    Nul { line: usize },
    #[error("boot entry line {line}: key `{key}` has no value")]
    MissingValue { line: usize, key: String },
    #[error("boot entry is {len} bytes; at most 65536 are read")]
    TooLong { len: usize },
    #[error("boot entry has neither `linux` nor `efi`: systemd-boot would skip it")]
    NoProgram,
}
