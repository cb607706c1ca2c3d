//! Writes of a caller's buffer taken by reference.
//!
//! `fatfs` writes a file one cluster at a time, each write a sub-slice of the buffer its caller
//! handed to `write_all`. [`SectorBuffer`](crate::SectorBuffer) gathers such writes into large
//! ones by copying them into its stage: for a 256 MiB UKI that copy was a fifth of an upgrade's
//! CPU time (`perf` of `bench-apply`, docs/testing.md), a copy `cp` does not make.
//!
//! [`BorrowedWrites`] is told that buffer (the *source*) up front. A write whose bytes are a
//! sub-slice of the source — the same memory, compared by address, so they are the source's
//! bytes and not a copy of them — is kept as a reference (where on the disk, which source
//! range) and joined to the pending piece it continues. The piece goes on to the disk below as
//! one write, straight from the source, when it reaches [`PIECE`] bytes, when a write does not
//! continue it, and at the flush. Everything else passes through at once, after the pending
//! piece if it overlaps.
//!
//! For the crash model nothing changes: the pending bytes reach the disk below before its
//! flush, and until a flush, writes may reach the medium in any order, or not at all.

use crate::{check_bounds, Disk, DiskError};

/// Bytes of a pending piece written on at once: large writes, and writeback that starts while
/// `fatfs` allocates the next clusters.
pub const PIECE: usize = 2 << 20;

/// Writes to `inner`, taking those of `source`'s bytes by reference (module documentation).
/// Pending bytes are lost when it is dropped unflushed, as the disk below's would be.
#[derive(Debug)]
pub struct BorrowedWrites<'src, D> {
    inner: D,
    source: &'src [u8],
    pending: Option<Pending>,
}

/// Source bytes `[from, from + len)` owed to the disk at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    at: u64,
    from: usize,
    len: usize,
}

impl Pending {
    fn end(&self) -> u64 {
        self.at + self.len as u64
    }

    fn overlaps(&self, offset: u64, end: u64) -> bool {
        offset < self.end() && self.at < end
    }
}

impl<'src, D: Disk> BorrowedWrites<'src, D> {
    /// Over `inner`, with writes of `source`'s bytes taken by reference. An empty source makes
    /// it a plain pass-through.
    pub fn new(inner: D, source: &'src [u8]) -> Self {
        Self {
            inner,
            source,
            pending: None,
        }
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Where `data` starts within the source, if it is a sub-slice of it.
    fn source_offset(&self, data: &[u8]) -> Option<usize> {
        let base = self.source.as_ptr() as usize;
        let start = (data.as_ptr() as usize).checked_sub(base)?;
        (!data.is_empty() && start + data.len() <= self.source.len()).then_some(start)
    }

    fn write_pending(&mut self) -> Result<(), DiskError> {
        if let Some(p) = self.pending.take() {
            self.inner
                .write_at(p.at, &self.source[p.from..p.from + p.len])?;
        }
        Ok(())
    }
}

impl<D: Disk> Disk for BorrowedWrites<'_, D> {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.inner.read_at(offset, buf)?;
        let end = offset + buf.len() as u64;
        if let Some(p) = self.pending.filter(|p| p.overlaps(offset, end)) {
            let (from, to) = (p.at.max(offset), p.end().min(end));
            let src = p.from + (from - p.at) as usize;
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&self.source[src..src + (to - from) as usize]);
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len())?;
        let end = offset + data.len() as u64;
        let Some(from) = self.source_offset(data) else {
            if self.pending.is_some_and(|p| p.overlaps(offset, end)) {
                self.write_pending()?;
            }
            return self.inner.write_at(offset, data);
        };
        match &mut self.pending {
            Some(p) if p.end() == offset && p.from + p.len == from => p.len += data.len(),
            _ => {
                self.write_pending()?;
                self.pending = Some(Pending {
                    at: offset,
                    from,
                    len: data.len(),
                });
            }
        }
        if self.pending.is_some_and(|p| p.len >= PIECE) {
            self.write_pending()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        self.write_pending()?;
        self.inner.flush()
    }

    fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        self.inner.start_writeback(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemDisk, Op, RecordingDisk, SECTOR};

    /// A file written cluster by cluster from its source reaches the disk as pieces of
    /// [`PIECE`] bytes, and as a new piece wherever the clusters jump.
    #[test]
    fn clusters_of_the_source_are_written_as_pieces() {
        let source: Vec<u8> = (0..PIECE + 3 * 4096).map(|i| (i % 251) as u8).collect();
        let mut rec = RecordingDisk::new(vec![0; 2 * PIECE + 64 * 4096]);
        let mut disk = BorrowedWrites::new(&mut rec, &source);
        let jump = 16 * 4096;
        for (i, cluster) in source.chunks(4096).enumerate() {
            let at = i as u64 * 4096 + if i * 4096 >= PIECE { jump } else { 0 };
            disk.write_at(at, cluster).unwrap();
        }
        let entry_at = PIECE as u64 + 5;
        disk.write_at(entry_at, b"entry").unwrap();
        assert_eq!(
            disk.read_vec(PIECE as u64 + jump, 8).unwrap(),
            source[PIECE..PIECE + 8],
            "pending bytes read back before they are written"
        );
        disk.flush().unwrap();
        let writes: Vec<(u64, usize)> = rec
            .log()
            .iter()
            .filter_map(|op| match op {
                Op::Write { offset, data } => Some((*offset, data.len())),
                _ => None,
            })
            .collect();
        assert_eq!(
            writes,
            [(0, PIECE), (entry_at, 5), (PIECE as u64 + jump, 3 * 4096)]
        );
        let bytes = rec.current().to_bytes();
        assert!(bytes[..PIECE] == source[..PIECE]);
        assert_eq!(&bytes[PIECE + 5..PIECE + 10], b"entry");
        let moved = PIECE + jump as usize;
        assert!(bytes[moved..moved + 3 * 4096] == source[PIECE..]);
    }

    /// Random writes, some of the source (continuing the last or not), some copies of the
    /// source's bytes, some other bytes over pending ones: read back before the flush and
    /// checked after it against a disk written directly.
    #[test]
    fn borrowed_writes_match_a_plain_disk() {
        let len = 64 * SECTOR;
        let source: Vec<u8> = (0..48 * SECTOR).map(|i| (i * 13 % 256) as u8).collect();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |bound: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % bound as u64) as usize
        };
        for round in 0..300 {
            let mut expected = MemDisk::zeroed(len);
            let mut rec = RecordingDisk::new(vec![0; len]);
            let mut disk = BorrowedWrites::new(&mut rec, &source);
            let (mut at, mut from) = (0usize, 0usize);
            for _ in 0..(1 + next(20)) {
                let n = 1 + next(3 * SECTOR);
                if next(3) > 0 {
                    if next(2) == 0 {
                        (at, from) = (next(len), next(source.len()));
                    }
                    let n = n.min(len - at).min(source.len() - from);
                    if n == 0 {
                        (at, from) = (0, 0);
                        continue;
                    }
                    disk.write_at(at as u64, &source[from..from + n]).unwrap();
                    expected
                        .write_at(at as u64, &source[from..from + n])
                        .unwrap();
                    (at, from) = (at + n, from + n);
                } else {
                    let offset = next(len);
                    let other: Vec<u8> = (0..n.min(len - offset))
                        .map(|i| (i + round) as u8 ^ 0x5A)
                        .collect();
                    disk.write_at(offset as u64, &other).unwrap();
                    expected.write_at(offset as u64, &other).unwrap();
                }
                let (offset, n) = (next(len), next(2 * SECTOR));
                let n = n.min(len - offset);
                assert_eq!(
                    disk.read_vec(offset as u64, n).unwrap(),
                    expected.read_vec(offset as u64, n).unwrap(),
                    "round {round}"
                );
            }
            disk.flush().unwrap();
            assert_eq!(rec.current(), &expected, "round {round}");
        }
    }

    #[test]
    fn a_copy_of_the_source_s_bytes_is_not_taken_by_reference() {
        let source = vec![7u8; 4096];
        let copy = source.clone();
        let mut rec = RecordingDisk::new(vec![0; 8192]);
        let mut disk = BorrowedWrites::new(&mut rec, &source);
        disk.write_at(0, &copy).unwrap();
        assert_eq!(rec.log().len(), 1, "written through at once");
    }
}
