//! `slate bundle diff`: what changed between two installer bundles, read offline.
//!
//! A bundle (docs/formats.md §7.1) holds a UKI and the version's slate binary; the UKI (§3)
//! holds the kernel, the command line and the initramfs (§6.2), which holds `/init`, the kernel
//! modules and the root squashfs; in a UKI the initramfs is one zstd stream. [`inspect`] reads one bundle into a [`Summary`] through
//! `slate_bundle`'s verified readers (size caps and digests checked before anything is used),
//! one bundle at a time so that only one UKI is held; [`diff`] compares two summaries and is
//! pure; [`render_text`] is the command's text. What is compared, and what is not, is in
//! docs/formats.md §7.5.
//!
//! A node's running version is summarised the same way from its booted UKI
//! ([`running_summary`], `GET /v1/image`), and its [`Summary`] travels as JSON, so that
//! `slate upgrade --check` diffs it against a bundle with the same [`diff`] and [`render_text`].
//!
//! Nothing here writes. A bundle is never trusted: every part is parsed by a strict reader
//! (`slate_uki`, `slate_cpio`, `backhand`), and a bad part is an error naming the bundle (A or
//! B, and its directory) and the part.

mod diff;
mod initramfs;
mod inspect;
mod kernel;
mod rootfs;
mod text;
mod wire;

use std::fmt;
use std::path::PathBuf;

use slate_bundle::{Bundle, BundleError};

pub use diff::{
    aspects, diff, diff_names, diff_rootfs, Aspect, BundleDiff, Change, NameDiff, RootfsChange,
    RootfsDiff, RootfsEntry, Summary,
};
pub use initramfs::{
    decompress_initrd, leading_archives, split_initramfs, Blob, FileInfo, Initramfs,
    InitramfsError, INITRAMFS_ALLOWANCE, INIT_PATH, MAX_INITRAMFS_BYTES, MAX_INITRAMFS_EXPANSION,
    MODULES_DIR, ZSTD_MAGIC,
};
pub use inspect::{
    inspect, inspect_uki, open, root_storage, running_summary, Identity, PartError, UkiParts,
    MAX_UKI_BYTES,
};
pub use kernel::{plausible_release, release_of_bzimage, section_text};
pub use rootfs::{
    display_path, list_squashfs, Listing, Node, NodeKind, RootfsError, EXPANSION_ALLOWANCE,
    MAX_EXPANSION,
};
pub use text::render_text;

/// Which bundle of the two: `slate bundle diff A B`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::A => "A",
            Side::B => "B",
        })
    }
}

/// The part of a bundle that was bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Uki,
    Initramfs,
    Rootfs,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Uki => "the UKI (uki blob)",
            Part::Initramfs => "the initramfs (.initrd section of the UKI)",
            Part::Rootfs => "the root filesystem (rootfs.sqsh in the initramfs)",
        })
    }
}

impl Part {
    /// The part as a booted UKI has it (no blob).
    fn in_booted_uki(self) -> &'static str {
        match self {
            Part::Uki => "the UKI",
            Part::Initramfs => "its initramfs (.initrd section)",
            Part::Rootfs => "its root filesystem (rootfs.sqsh in the initramfs)",
        }
    }
}

/// What was wrong with a [`Part`].
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("it is {size} bytes, more than the {limit} bytes diff reads")]
    Oversize { size: u64, limit: u64 },
    #[error(transparent)]
    Pe(slate_uki::UkiError),
    #[error("it has no {0} section")]
    MissingSection(&'static str),
    #[error(transparent)]
    Initramfs(InitramfsError),
    #[error(transparent)]
    Rootfs(RootfsError),
    #[error(transparent)]
    Storage(slate_rootfs::StorageError),
}

/// Why two bundles could not be compared: which bundle, where, and which part.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// Opening the layout or reading a blob: the bundle reader's error names the document or
    /// blob (`the uki blob does not match its digest ...`).
    #[error("bundle {side} ({})", dir.display())]
    Bundle {
        side: Side,
        dir: PathBuf,
        #[source]
        source: BundleError,
    },
    /// A verified blob whose content is bad.
    #[error("bundle {side} ({}): {part}", dir.display())]
    Content {
        side: Side,
        dir: PathBuf,
        part: Part,
        #[source]
        source: Problem,
    },
    /// The running version's booted UKI ([`running_summary`], on a node) whose content is bad.
    #[error("the running version's boot entry: {}", part.in_booted_uki())]
    Running {
        part: Part,
        #[source]
        source: Problem,
    },
}

impl DiffError {
    /// The side the error is about; the running version is side A of `slate upgrade --check`.
    pub fn side(&self) -> Side {
        match self {
            DiffError::Bundle { side, .. } | DiffError::Content { side, .. } => *side,
            DiffError::Running { .. } => Side::A,
        }
    }
}

/// Compare two opened bundles: A is read, then B, then they are compared.
pub fn diff_bundles(a: &Bundle, b: &Bundle) -> Result<BundleDiff, DiffError> {
    let a = inspect(Side::A, a)?;
    let b = inspect(Side::B, b)?;
    Ok(diff(&a, &b))
}
