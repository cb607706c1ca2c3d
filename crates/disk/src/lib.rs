//! The `Disk` trait: the single path by which slate reads and writes bytes on a disk.
//!
//! Every on-disk writer (GPT, FAT, META, bootloader files) is generic over [`Disk`], so that the
//! code a node runs is the code the crash matrix replays over [`RecordingDisk`].
//!
//! Implementations:
//! - [`FileDisk`]: a regular file (disk image) or a block device node;
//! - [`MemDisk`]: an in-memory disk, for tests and for materialized crash states;
//! - [`PartitionView`]: a bounded window onto another disk;
//! - [`SectorBuffer`]: whole-sector writes for `fatfs`, gathered into large ones;
//! - [`BorrowedWrites`]: writes of a caller's buffer taken by reference, not copied;
//! - [`RecordingDisk`]: logs every write and flush and can materialize the disk as it would be
//!   after a power cut at any point of the log.

mod borrowed;
mod file;
mod io_adapter;
mod recorder;
mod runs;
mod sectors;
mod view;

pub use borrowed::BorrowedWrites;
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

    /// A hint that `[offset, offset + len)` was written and will not be rewritten before the
    /// next flush: the implementation may start sending it to the medium now, so that the
    /// flush waits for less. It promises nothing — no durability, no order — so a disk that
    /// ignores it (the default) behaves the same to every caller and to the crash matrix.
    fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        let _ = (offset, len);
        Ok(())
    }

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
    fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        (**self).start_writeback(offset, len)
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
    fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        (**self).start_writeback(offset, len)
    }
}

/// An in-memory disk. Writes are durable at once, so `flush` does nothing.
///
/// Its bytes are held in fixed-size chunks shared copy-on-write: a clone costs one reference
/// count per chunk, and a write copies only the chunks it touches. The crash matrix clones a
/// 64 MiB disk for every crash state it checks; copying the bytes each time was most of its run
/// time.
#[derive(Clone)]
pub struct MemDisk {
    chunks: Vec<std::sync::Arc<[u8]>>,
    len: usize,
}

/// Bytes per shared chunk of a [`MemDisk`].
const MEM_CHUNK: usize = 16 * 1024;

impl MemDisk {
    /// A zero-filled disk of `len` bytes (every chunk shares one zero block until written).
    pub fn zeroed(len: usize) -> Self {
        let zero: std::sync::Arc<[u8]> = vec![0; MEM_CHUNK].into();
        let mut chunks = vec![zero; len / MEM_CHUNK];
        if len % MEM_CHUNK != 0 {
            chunks.push(vec![0; len % MEM_CHUNK].into());
        }
        Self { chunks, len }
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self {
            len: bytes.len(),
            chunks: bytes.chunks(MEM_CHUNK).map(Into::into).collect(),
        }
    }

    /// Every byte of the disk, in one buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            bytes.extend_from_slice(chunk);
        }
        bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.to_bytes()
    }

    /// The chunks touched by `len` bytes at `offset`, each with the range within it.
    fn spans(offset: usize, len: usize) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            (at < end).then(|| {
                let index = at / MEM_CHUNK;
                let start = at % MEM_CHUNK;
                let stop = (end - index * MEM_CHUNK).min(MEM_CHUNK);
                at = index * MEM_CHUNK + stop;
                (index, start..stop)
            })
        })
    }
}

impl PartialEq for MemDisk {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|(a, b)| std::sync::Arc::ptr_eq(a, b) || a == b)
    }
}

impl Eq for MemDisk {}

impl std::fmt::Debug for MemDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDisk").field("len", &self.len).finish()
    }
}

impl Disk for MemDisk {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        check_bounds(offset, buf.len(), self.len())?;
        let mut done = 0;
        for (index, range) in Self::spans(offset as usize, buf.len()) {
            let n = range.len();
            buf[done..done + n].copy_from_slice(&self.chunks[index][range]);
            done += n;
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len())?;
        let mut done = 0;
        for (index, range) in Self::spans(offset as usize, data.len()) {
            let n = range.len();
            let chunk = &mut self.chunks[index];
            match std::sync::Arc::get_mut(chunk) {
                Some(bytes) => bytes[range].copy_from_slice(&data[done..done + n]),
                None => {
                    let mut bytes = chunk.to_vec();
                    bytes[range].copy_from_slice(&data[done..done + n]);
                    *chunk = bytes.into();
                }
            }
            done += n;
        }
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
            disk.to_bytes(),
            vec![0; 1024],
            "a refused write changes nothing"
        );
        disk.write_at(1016, &[7; 8]).unwrap();
        assert_eq!(disk.read_vec(1016, 8).unwrap(), vec![7; 8]);
    }

    #[test]
    fn mem_disk_chunks_are_copied_on_write_only() {
        let len = 3 * MEM_CHUNK + 100;
        let mut original = MemDisk::zeroed(len);
        let across = MEM_CHUNK as u64 - 3;
        original.write_at(across, &[1, 2, 3, 4, 5, 6]).unwrap();
        let copy = original.clone();
        original.write_at(across + 1, &[9]).unwrap();
        original.write_at(len as u64 - 2, &[8, 8]).unwrap();
        assert_eq!(copy.read_vec(across, 6).unwrap(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(original.read_vec(across, 6).unwrap(), [1, 9, 3, 4, 5, 6]);
        assert_eq!(copy.read_vec(len as u64 - 2, 2).unwrap(), [0, 0]);
        assert_ne!(copy, original);
        let flat = original.to_bytes();
        assert_eq!(flat.len(), len);
        assert_eq!(flat[len - 2..], [8, 8]);
        assert_eq!(MemDisk::from_bytes(flat), original);
        let mut whole = vec![0; len];
        original.read_at(0, &mut whole).unwrap();
        assert_eq!(whole, original.to_bytes());
    }
}
