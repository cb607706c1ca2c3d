//! Writing a layout's partition table: protective MBR, primary and backup GPT.
//!
//! The GPT itself is written by the maintained `gpt` crate (4.1) over [`DiskIo`]: it accepts a
//! caller-chosen disk GUID (`GptConfig::create_from_device(device, Some(guid))`) and a complete
//! partition map whose entries carry their own unique GUIDs (`GptDisk::update_partitions`), so
//! deterministic GUIDs need no hand-written GPT encoder. Its output is checked independently by
//! [`crate::verify_gpt`], which decodes the bytes from the format description rather than with
//! the same crate.

use std::collections::BTreeMap;
use std::fmt;

use gpt::disk::LogicalBlockSize;
use gpt::mbr::ProtectiveMBR;
use gpt::partition::Partition;
use gpt::partition_types::{OperatingSystem, Type};
use gpt::GptConfig;
use slate_disk::{Disk, DiskError, DiskIo};

use crate::spec::{DiskLayout, PlacedLayout};
use crate::LayoutError;

/// Write `layout`'s partition table to `disk` and flush; returns where everything landed.
///
/// Nothing is written unless the layout is valid and fits the disk. Besides the table, the gap
/// between the primary partition array and the first partition is zeroed: it is where stale
/// signatures of a previous life of the disk (an ISO 9660 volume descriptor at 32 KiB, a GRUB
/// core image) would otherwise survive and make probing tools see two things at once. Partition
/// contents are not touched.
pub fn write_gpt<D: Disk>(mut disk: D, layout: &DiskLayout) -> Result<PlacedLayout, LayoutError> {
    let placed = layout.place(disk.len())?;
    let lb = placed.sector_size;
    let block_size =
        LogicalBlockSize::try_from(lb).map_err(|e| LayoutError::InvalidLayout(e.to_string()))?;

    let gap_start = placed.first_usable_lba * lb;
    let gap_end = placed.partitions[0].first_lba * lb;
    if gap_end > gap_start {
        let zeros = vec![0u8; (gap_end - gap_start) as usize];
        disk.write_at(gap_start, &zeros)
            .map_err(|source| LayoutError::Disk {
                what: "zeroing the gap before the first partition",
                source,
            })?;
    }

    // The protective MBR covers the whole disk after LBA 0, capped at what 32 bits can say.
    let pmbr = ProtectiveMBR::with_lb_size((placed.total_lba - 1).min(u64::from(u32::MAX)) as u32);
    let mut sector = vec![0u8; lb as usize];
    sector[..512].copy_from_slice(&pmbr.to_bytes());
    disk.write_at(0, &sector)
        .map_err(|source| LayoutError::Disk {
            what: "writing the protective MBR",
            source,
        })?;

    let entries: BTreeMap<u32, Partition> = placed
        .partitions
        .iter()
        .map(|p| {
            let entry = Partition {
                part_type_guid: Type {
                    guid: p.type_guid,
                    os: OperatingSystem::None,
                },
                part_guid: p.guid,
                first_lba: p.first_lba,
                last_lba: p.last_lba,
                flags: p.attributes,
                name: p.label.clone(),
            };
            (p.number, entry)
        })
        .collect();
    let mut gpt = GptConfig::new()
        .writable(true)
        .logical_block_size(block_size)
        .create_from_device(DiskIo::new(Opaque(&mut disk)), Some(placed.disk_guid))
        .map_err(LayoutError::WriteGpt)?;
    gpt.update_partitions(entries)
        .map_err(LayoutError::WriteGpt)?;
    // Writes both arrays, the backup header, then the primary header, then flushes the disk.
    gpt.write().map_err(LayoutError::WriteGpt)?;
    Ok(placed)
}

/// A disk whose `Debug` says only that it is a disk: the `gpt` crate requires `Debug` devices,
/// slate's callers may pass any [`Disk`].
pub(crate) struct Opaque<D>(pub(crate) D);

impl<D: Disk> fmt::Debug for Opaque<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Disk({} bytes)", self.0.len())
    }
}

impl<D: Disk> Disk for Opaque<D> {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        self.0.write_at(offset, data)
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        self.0.flush()
    }
}
