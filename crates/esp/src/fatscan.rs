//! Read-only access to a disk, and an exact count of free FAT32 clusters read from the FAT
//! itself (FSInfo's count may be stale after a power cut, so the room check does not trust it).

use std::io;

use slate_disk::{Disk, DiskError};

/// A disk through a shared reference: reads pass through, writes are refused. Lets `status`
/// use `fatfs` and `slate-layout` (which want a `Disk` by value) without `&mut`.
#[derive(Debug)]
pub struct ReadOnly<'a, D: ?Sized>(pub &'a D);

impl<D: Disk + ?Sized> Disk for ReadOnly<'_, D> {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, _data: &[u8]) -> Result<(), DiskError> {
        Err(DiskError::Io {
            offset,
            source: io::Error::new(io::ErrorKind::PermissionDenied, "read-only access"),
        })
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        Ok(())
    }
}

/// Free space of a FAT32 volume, counted from the first FAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatSpace {
    pub cluster_size: u64,
    pub free_clusters: u64,
}

impl FatSpace {
    pub fn clusters_for(&self, len: u64) -> u64 {
        len.div_ceil(self.cluster_size)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("FAT32 boot sector: {what}"),
    )
}

fn io_err(e: DiskError) -> io::Error {
    io::Error::other(e)
}

/// Count the free clusters of the FAT32 volume on `esp` (BPB fields at their FAT32 offsets).
pub fn fat_space(esp: &impl Disk) -> io::Result<FatSpace> {
    let bs = esp.read_vec(0, 512).map_err(io_err)?;
    let u16_at = |o: usize| u64::from(u16::from_le_bytes([bs[o], bs[o + 1]]));
    let u32_at = |o: usize| u64::from(u32::from_le_bytes([bs[o], bs[o + 1], bs[o + 2], bs[o + 3]]));
    let bytes_per_sector = u16_at(11);
    let sectors_per_cluster = u64::from(bs[13]);
    let reserved = u16_at(14);
    let fats = u64::from(bs[16]);
    let total = match u16_at(19) {
        0 => u32_at(32),
        n => n,
    };
    let fat_sectors = u32_at(36);
    if bytes_per_sector < 512 || sectors_per_cluster == 0 || fats == 0 || fat_sectors == 0 {
        return Err(bad("implausible geometry"));
    }
    let data_start = reserved + fats * fat_sectors;
    let clusters = total
        .checked_sub(data_start)
        .ok_or_else(|| bad("no data area"))?
        / sectors_per_cluster;
    let entries = (clusters + 2).min(fat_sectors * bytes_per_sector / 4);
    let fat = esp
        .read_vec(reserved * bytes_per_sector, (entries * 4) as usize)
        .map_err(io_err)?;
    Ok(FatSpace {
        cluster_size: bytes_per_sector * sectors_per_cluster,
        free_clusters: free_entries(&fat),
    })
}

/// The free entries of a FAT32 table (after the two reserved ones). Not generic, so it is
/// compiled (and optimized) here rather than in every caller of [`fat_space`].
fn free_entries(fat: &[u8]) -> u64 {
    fat.chunks_exact(4)
        .skip(2)
        .filter(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]]) & 0x0FFF_FFFF == 0)
        .count() as u64
}
