//! Whole-sector writes for `fatfs`.
//!
//! `fatfs` updates a 32-byte directory entry field by field (name, attributes, …, first cluster,
//! size) in separate small writes. A power cut between two of them — or a page-cache writeback
//! of the sector in between — leaves an entry with the new name and the old slot's cluster and
//! size: a `slate-2+3.efi` pointing at garbage. The crash matrix found exactly that state. A
//! block device writes whole sectors, so buffering `fatfs`'s writes per 512-byte sector until
//! its flush, and then writing each dirty sector whole, makes every entry (never straddling a
//! sector) change atomically, as it does under a kernel FAT driver.

use std::collections::BTreeMap;

use crate::{check_bounds, Disk, DiskError, SECTOR};

/// Buffers writes to `inner` per sector until [`Disk::flush`], which writes the dirty sectors in
/// ascending order (adjacent ones as one write) and then flushes `inner`. Unflushed writes are
/// lost when it is dropped: flush it.
#[derive(Debug)]
pub struct SectorBuffer<D> {
    inner: D,
    dirty: BTreeMap<u64, Vec<u8>>,
}

impl<D: Disk> SectorBuffer<D> {
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            dirty: BTreeMap::new(),
        }
    }

    fn sector(&mut self, index: u64) -> Result<&mut Vec<u8>, DiskError> {
        if !self.dirty.contains_key(&index) {
            let at = index * SECTOR as u64;
            let len = (self.inner.len() - at).min(SECTOR as u64) as usize;
            let bytes = self.inner.read_vec(at, len)?;
            self.dirty.insert(index, bytes);
        }
        Ok(self.dirty.get_mut(&index).expect("inserted above"))
    }
}

impl<D: Disk> Disk for SectorBuffer<D> {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.inner.read_at(offset, buf)?;
        let end = offset + buf.len() as u64;
        let first = offset / SECTOR as u64;
        for (&index, bytes) in self.dirty.range(first..end.div_ceil(SECTOR as u64)) {
            let start = index * SECTOR as u64;
            let (from, to) = (start.max(offset), (start + bytes.len() as u64).min(end));
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len())?;
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let within = (at % SECTOR as u64) as usize;
            let sector = self.sector(at / SECTOR as u64)?;
            let n = (sector.len() - within).min(data.len() - done);
            sector[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut run: Option<(u64, Vec<u8>)> = None;
        for (index, bytes) in dirty {
            let at = index * SECTOR as u64;
            match &mut run {
                Some((start, buf)) if *start + buf.len() as u64 == at => buf.extend(bytes),
                _ => {
                    if let Some((start, buf)) = run.replace((at, bytes)) {
                        self.inner.write_at(start, &buf)?;
                    }
                }
            }
        }
        if let Some((start, buf)) = run {
            self.inner.write_at(start, &buf)?;
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemDisk, Op, RecordingDisk};

    #[test]
    fn small_writes_become_whole_sectors_at_flush() {
        let mut rec = RecordingDisk::new(vec![7; 4 * SECTOR]);
        let mut buf = SectorBuffer::new(&mut rec);
        buf.write_at(10, &[1; 4]).unwrap();
        buf.write_at(14, &[2; 2]).unwrap();
        buf.write_at(SECTOR as u64 - 1, &[3; 2]).unwrap();
        buf.write_at(3 * SECTOR as u64, &[4]).unwrap();
        assert_eq!(buf.read_vec(8, 10).unwrap(), [7, 7, 1, 1, 1, 1, 2, 2, 7, 7]);
        assert_eq!(buf.read_vec(SECTOR as u64 - 2, 4).unwrap(), [7, 3, 3, 7]);
        buf.flush().unwrap();
        let log = rec.log();
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(matches!(&log[0], Op::Write { offset: 0, data } if data.len() == 2 * SECTOR));
        assert!(
            matches!(&log[1], Op::Write { offset, data } if *offset == 3 * SECTOR as u64 && data.len() == SECTOR)
        );
        let mut expected = MemDisk::from_bytes(vec![7; 4 * SECTOR]);
        expected.write_at(10, &[1, 1, 1, 1, 2, 2]).unwrap();
        expected.write_at(SECTOR as u64 - 1, &[3, 3]).unwrap();
        expected.write_at(3 * SECTOR as u64, &[4]).unwrap();
        assert_eq!(rec.current(), &expected);
    }
}
