//! The disk layout: reading (and, for the installer, writing) the GPT over the [`Disk`] trait.
//!
//! GPT parsing is done by the maintained `gpt` crate through [`slate_disk::DiskIo`]; this crate
//! adds slate's vocabulary (partitions found by label, bounded views onto them).

use slate_disk::{Disk, DiskIo, PartitionView};

/// Errors met while locating partitions.
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
pub fn partitions<D: Disk + std::fmt::Debug>(disk: D) -> Result<Vec<PartitionInfo>, LayoutError> {
    let gpt = gpt::GptConfig::new()
        .writable(false)
        .open_from_device(DiskIo::new(disk))
        .map_err(|e| LayoutError::NoGpt(e.to_string()))?;
    let block = *gpt.logical_block_size();
    gpt.partitions()
        .values()
        .filter(|p| p.is_used())
        .map(|p| match (p.bytes_start(block), p.bytes_len(block)) {
            (Ok(start), Ok(len)) => Ok(PartitionInfo {
                label: p.name.clone(),
                start,
                len,
            }),
            _ => Err(LayoutError::OutOfDisk {
                label: p.name.clone(),
            }),
        })
        .collect()
}

/// The unique partition labelled `label`.
pub fn find_partition<D: Disk + std::fmt::Debug>(
    disk: D,
    label: &str,
) -> Result<PartitionInfo, LayoutError> {
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
pub fn open_partition<D: Disk + std::fmt::Debug>(
    mut disk: D,
    label: &str,
) -> Result<PartitionView<D>, LayoutError> {
    let info = find_partition(&mut disk, label)?;
    PartitionView::new(disk, info.start, info.len).map_err(|_| LayoutError::OutOfDisk {
        label: label.to_string(),
    })
}
