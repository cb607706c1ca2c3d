//! The `Disk` trait: the single path by which slate reads and writes bytes on a disk.
//!
//! Every on-disk writer (GPT, FAT, META, bootloader files) is generic over [`Disk`], so that the
//! code a node runs is the code the crash matrix replays over [`RecordingDisk`].
//!
//! Implementations:
//! - [`FileDisk`]: a regular file (disk image) or a block device node;
//! - [`MemDisk`]: an in-memory disk, for tests and for materialized crash states;
//! - [`PartitionView`]: a bounded window onto another disk;
//! - [`RecordingDisk`]: logs every write and flush and can materialize the disk as it would be
//!   after a power cut at any point of the log.

mod file;
mod io_adapter;
mod recorder;
mod sectors;
mod view;

pub use file::FileDisk;
pub use io_adapter::DiskIo;
pub use recorder::{CrashPoint, CutMode, Op, RecordingDisk, SECTOR};
pub use sectors::SectorBuffer;
pub use view::PartitionView;

/// Errors of disk access. Offsets are reported so that a failure can be located.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "access of {len} bytes at offset {offset} runs past the end of the disk ({size} bytes)"
    )]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error("I/O error at offset {offset}")]
    Io {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("flush failed")]
    Flush(#[source] std::io::Error),
    #[error("injected fault: the disk refuses operation #{op}")]
    Injected { op: usize },
}

/// A byte-addressed disk of fixed length.
///
/// Writes may be buffered by the implementation (or the device) until [`Disk::flush`]; a caller
/// that needs ordering between two writes must flush between them.
pub trait Disk {
    /// Length of the disk in bytes.
    fn len(&self) -> u64;

    /// Whether the disk has zero length.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fill `buf` entirely from `offset`; short reads are errors.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError>;

    /// Write all of `data` at `offset`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError>;

    /// Make every preceding write durable.
    fn flush(&mut self) -> Result<(), DiskError>;

    /// Read `len` bytes at `offset` into a fresh buffer.
    fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>, DiskError> {
        let mut buf = vec![0; len];
        self.read_at(offset, &mut buf)?;
        Ok(buf)
    }
}

/// Checks that `[offset, offset + len)` lies within a disk of `size` bytes.
pub fn check_bounds(offset: u64, len: usize, size: u64) -> Result<(), DiskError> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DiskError::OutOfBounds { offset, len, size }),
    }
}

impl<D: Disk + ?Sized> Disk for &mut D {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        (**self).write_at(offset, data)
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        (**self).flush()
    }
}

impl<D: Disk + ?Sized> Disk for Box<D> {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        (**self).write_at(offset, data)
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        (**self).flush()
    }
}

/// An in-memory disk. Writes are durable at once, so `flush` does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemDisk {
    bytes: Vec<u8>,
}

impl MemDisk {
    /// A zero-filled disk of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        Self {
            bytes: vec![0; len],
        }
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

impl Disk for MemDisk {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        check_bounds(offset, buf.len(), self.len())?;
        let start = offset as usize;
        buf.copy_from_slice(&self.bytes[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len())?;
        let start = offset as usize;
        self.bytes[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_disk_refuses_out_of_bounds_access() {
        let mut disk = MemDisk::zeroed(1024);
        assert!(matches!(
            disk.write_at(1020, &[0; 8]),
            Err(DiskError::OutOfBounds {
                offset: 1020,
                len: 8,
                size: 1024
            })
        ));
        assert!(disk.read_at(u64::MAX, &mut [0; 1]).is_err());
        assert_eq!(
            disk.as_bytes(),
            &[0; 1024][..],
            "a refused write changes nothing"
        );
        disk.write_at(1016, &[7; 8]).unwrap();
        assert_eq!(disk.read_vec(1016, 8).unwrap(), vec![7; 8]);
    }
}
