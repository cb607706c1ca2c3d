//! A window onto a byte range of another disk (a partition).

use crate::{check_bounds, Disk, DiskError};

/// `[start, start + len)` of an underlying disk, addressed from 0.
///
/// Accesses outside the window are refused, so a writer handed a partition can never touch its
/// neighbours.
#[derive(Debug)]
pub struct PartitionView<D> {
    inner: D,
    start: u64,
    len: u64,
}

impl<D: Disk> PartitionView<D> {
    /// Fails if the window does not lie within `inner`.
    pub fn new(inner: D, start: u64, len: u64) -> Result<Self, DiskError> {
        let size = inner.len();
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(Self { inner, start, len }),
            _ => Err(DiskError::OutOfBounds {
                offset: start,
                len,
                size,
            }),
        }
    }

    /// Byte offset of the window on the underlying disk.
    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn into_inner(self) -> D {
        self.inner
    }
}

impl<D: Disk> Disk for PartitionView<D> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        check_bounds(offset, buf.len(), self.len)?;
        self.inner.read_at(self.start + offset, buf)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len)?;
        self.inner.write_at(self.start + offset, data)
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        self.inner.flush()
    }

    fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        check_bounds(offset, usize::try_from(len).unwrap_or(usize::MAX), self.len)?;
        self.inner.start_writeback(self.start + offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    #[test]
    fn view_translates_offsets_and_stays_inside_its_window() {
        let mut disk = MemDisk::zeroed(4096);
        {
            let mut view = PartitionView::new(&mut disk, 1024, 512).unwrap();
            view.write_at(0, b"abc").unwrap();
            assert!(view.write_at(510, b"abc").is_err());
            assert_eq!(view.len(), 512);
        }
        assert_eq!(&disk.to_bytes()[1024..1027], b"abc");
        assert!(PartitionView::new(&mut disk, 4000, 512).is_err());
    }
}
