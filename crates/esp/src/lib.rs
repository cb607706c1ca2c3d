//! The EFI system partition, in one place: the path of every file slate puts on it (both boot
//! loaders' layouts), the FAT32 file system written with the userspace `fatfs` crate over a
//! [`slate_disk::Disk`] partition view (geometry, reproducible formatting, the
//! temp-name-then-rename writer, an exact free-cluster count), the ESP of a whole disk found
//! and opened ([`session`]: read-only, read-write, a file rewritten in place), and the Boot
//! Loader Specification names of the UKIs (docs/formats.md §2).
//!
//! The installer (a fresh image) and the boot loader backends (upgrade, commit, revert, status,
//! a snapshot root's entries) all write the ESP through this crate, so there is one writer to
//! replay in the crash matrices.

mod dot_entries;
pub mod fat;
mod fatscan;
mod names;
pub mod paths;
pub mod session;

pub use dot_entries::{trim_deleted_tail, DotError};
pub use fatscan::{fat_space, FatSpace, ReadOnly};
pub use names::{loader_conf, uki_file_name, validate_uki_file_name, MAX_FILE_NAME};
pub use paths::*;

/// Why the ESP could not be read or written, or a boot file name was refused.
#[derive(Debug, thiserror::Error)]
pub enum EspError {
    #[error("invalid boot file name {name:?}: {reason}")]
    InvalidFileName { name: String, reason: String },
    #[error(
        "invalid loader.conf default pattern {pattern:?}: use ASCII letters, digits, \
         '+ - _ .' and glob characters '* ? [ ] !' (or @saved)"
    )]
    InvalidLoaderDefault { pattern: String },
    #[error("EFI partition: {action}")]
    Fs {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("EFI partition: {action} {path}")]
    File {
        path: String,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("partition table")]
    Layout(#[from] slate_layout::LayoutError),
    /// No ESP, or no way to tell which one it is ([`session::locate`]).
    #[error("{0}")]
    Locate(&'static str),
    #[error("disk")]
    Disk(#[from] slate_disk::DiskError),
    /// [`session::rewrite_in_place`] refused a file whose length differs from the new bytes'.
    #[error("{path} is {len} bytes, not {expected}: not rewritten")]
    WrongLength {
        path: String,
        len: u64,
        expected: u64,
    },
}
