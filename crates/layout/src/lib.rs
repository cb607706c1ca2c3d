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
//! - [`partitions`], [`find_partition`] and [`open_partition`] find partitions by label on any
//!   GPT disk (the `gpt` crate's reader), for the code that runs on a node.

mod guid;
mod spec;
mod verify;
mod write;

use slate_disk::{Disk, DiskError, DiskIo, PartitionView};

pub use guid::{derived_u32, disk_guid, partition_guid};
pub use spec::{
    DiskLayout, LayoutParams, PartitionSize, PartitionSpec, PlacedLayout, PlacedPartition,
    EFI_LABEL, EPHEMERAL_LABEL, ESP_TYPE, LINUX_DATA_TYPE, META_LABEL, META_SIZE, MIB, STATE_LABEL,
    VAR_TYPE,
};
pub use uuid::Uuid;
pub use verify::verify_gpt;
pub use write::write_gpt;

use write::Opaque;

/// Errors met while planning, writing, reading or checking a partition table.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("the disk has no valid GPT: {0}")]
    NoGpt(String),
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

/// Where a partition lies on its disk, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub label: String,
    pub start: u64,
    pub len: u64,
}

/// Every used partition of the disk's GPT (primary header, or the backup when the primary is
/// damaged), in table order.
pub fn partitions<D: Disk>(disk: D) -> Result<Vec<PartitionInfo>, LayoutError> {
    let gpt = gpt::GptConfig::new()
        .writable(false)
        .open_from_device(DiskIo::new(Opaque(disk)))
        .map_err(|e| LayoutError::NoGpt(e.to_string()))?;
    let block = *gpt.logical_block_size();
    gpt.partitions()
        .values()
        .filter(|p| p.is_used())
        .map(|p| {
            let start = p.bytes_start(block);
            let len = p.bytes_len(block);
            match (start, len) {
                (Ok(start), Ok(len)) => Ok(PartitionInfo {
                    label: p.name.clone(),
                    start,
                    len,
                }),
                _ => Err(LayoutError::OutOfDisk {
                    label: p.name.clone(),
                }),
            }
        })
        .collect()
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
