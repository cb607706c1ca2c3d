//! The disk layout: which partitions a slate disk has, where they lie, and the GPT that says so,
//! read and written over the [`Disk`] trait.
//!
//! - [`DiskLayout`] is the layout as a pure value ([`DiskLayout::reference`] is the layout of
//!   DESIGN.md: EFI, META, STATE, EPHEMERAL); [`DiskLayout::place`] computes where it lands on a
//!   disk of a given size, refusing a disk that is too small before anything is written.
//! - [`write_gpt`] writes the protective MBR and both GPT copies (through the maintained `gpt`
//!   crate over [`slate_disk::DiskIo`]); [`verify_gpt`] reads them back independently.
//! - GUIDs are derived from the image id ([`partition_guid`], [`disk_guid`]), so the same image
//!   built twice is the same bytes.
//! - [`read_gpt`] reads a GPT disk with slate's own decoder (`read.rs`), falling back to the
//!   backup copy when the primary is damaged and refusing a table whose partitions overlap each
//!   other or the table itself; [`partitions`], [`find_partition`] and [`open_partition`] find
//!   partitions by label through it, for the code that runs on a node. The reader is
//!   hand-written because the `gpt` crate's reader panics on valid entry sizes other than 128
//!   and does not fall back to the backup when the primary partition array is damaged.

mod guid;
mod read;
mod spec;
mod verify;
mod write;

use slate_disk::{Disk, DiskError, PartitionView};

pub use guid::{derived_u32, disk_guid, partition_guid};
pub use read::{read_gpt_with_sector_size, GptSource, GptTable, DEFAULT_SECTOR_SIZE};
pub use spec::{
    DiskLayout, LayoutParams, PartitionSize, PartitionSpec, PlacedLayout, PlacedPartition,
    EFI_LABEL, EPHEMERAL_LABEL, ESP_TYPE, LINUX_DATA_TYPE, LINUX_ROOT_X86_64_TYPE, META_LABEL,
    META_SIZE, MIB, POOL_LABEL, STATE_LABEL, VAR_TYPE,
};
pub use uuid::Uuid;
pub use verify::verify_gpt;
pub use write::write_gpt;

/// Errors met while planning, writing, reading or checking a partition table.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("the disk has no valid GPT: {0}")]
    NoGpt(String),
    #[error("neither copy of the GPT is usable: primary: {primary}; backup: {backup}")]
    BadGpt { primary: String, backup: String },
    #[error(
        "the {which} GPT lists partitions slate cannot safely use: {}",
        problems.join("; ")
    )]
    InvalidTable {
        /// `"primary"` or `"backup"`: the copy whose entries these are.
        which: &'static str,
        /// One sentence per problem, naming the partitions by label and LBA range.
        problems: Vec<String>,
    },
    #[error("no partition labelled {label:?} (found: {found})")]
    NoSuchPartition { label: String, found: String },
    #[error("more than one partition is labelled {0:?}")]
    AmbiguousLabel(String),
    #[error("partition {label:?} lies outside the disk")]
    OutOfDisk { label: String },
    #[error("invalid disk layout: {0}")]
    InvalidLayout(String),
    #[error("the disk is {have} bytes but the layout needs at least {needed} bytes")]
    DiskTooSmall { have: u64, needed: u64 },
    #[error("{what}")]
    Disk {
        what: &'static str,
        #[source]
        source: DiskError,
    },
    #[error("writing the GPT")]
    WriteGpt(#[source] gpt::GptError),
    #[error("the partition table does not match the layout: {0}")]
    Mismatch(String),
}

/// Where a partition lies on its disk, in bytes, and what kind of partition it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub label: String,
    pub type_guid: Uuid,
    /// 1-based entry number in the table (what firmware device paths and tools call it).
    pub number: u32,
    /// The partition's own GUID (a firmware boot option finds the partition by it).
    pub unique_guid: Uuid,
    pub start: u64,
    pub len: u64,
}

/// The GPT of `disk` (512-byte sectors): the primary copy, or the backup when the primary is
/// damaged (the returned [`GptTable`] says which, and why). Refused: a disk where neither copy is
/// valid ([`LayoutError::NoGpt`] when neither even has a GPT signature, otherwise
/// [`LayoutError::BadGpt`] naming the problem of each), and a table whose used entries are
/// reversed, lie outside its usable area or overlap each other ([`LayoutError::InvalidTable`],
/// every problem listed). The accepted formats are those of docs/formats.md §5.
pub fn read_gpt<D: Disk>(disk: D) -> Result<GptTable, LayoutError> {
    read_gpt_with_sector_size(disk, DEFAULT_SECTOR_SIZE)
}

/// Every used partition of the disk's GPT (see [`read_gpt`]: the primary, or the backup when
/// the primary is damaged), in table order.
pub fn partitions<D: Disk>(disk: D) -> Result<Vec<PartitionInfo>, LayoutError> {
    Ok(read_gpt(disk)?.partitions)
}

/// The unique partition labelled `label`.
pub fn find_partition<D: Disk>(disk: D, label: &str) -> Result<PartitionInfo, LayoutError> {
    let all = partitions(disk)?;
    let mut matching = all.iter().filter(|p| p.label == label);
    match (matching.next(), matching.next()) {
        (Some(p), None) => Ok(p.clone()),
        (Some(_), Some(_)) => Err(LayoutError::AmbiguousLabel(label.to_string())),
        (None, _) => Err(LayoutError::NoSuchPartition {
            label: label.to_string(),
            found: all
                .iter()
                .map(|p| p.label.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// A bounded view onto the partition labelled `label`.
pub fn open_partition<D: Disk>(mut disk: D, label: &str) -> Result<PartitionView<D>, LayoutError> {
    let info = find_partition(&mut disk, label)?;
    PartitionView::new(disk, info.start, info.len).map_err(|_| LayoutError::OutOfDisk {
        label: label.to_string(),
    })
}
