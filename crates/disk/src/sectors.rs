//! Whole-sector writes for `fatfs`.
//!
//! `fatfs` updates a 32-byte directory entry field by field (name, attributes, …, first cluster,
//! size) in separate small writes. A power cut between two of them — or a page-cache writeback
//! of the sector in between — leaves an entry with the new name and the old slot's cluster and
//! size: a `slate-2+3.efi` pointing at garbage. The crash matrix found exactly that state. A
//! block device writes whole sectors, so buffering `fatfs`'s writes per 512-byte sector until
//! its flush, and then writing each dirty sector whole, makes every entry (never straddling a
//! sector) change atomically, as it does under a kernel FAT driver.
//!
//! The dirty sectors are kept as runs of adjacent sectors, not one buffer each: `fatfs` writes a
//! file one cluster at a time, and a 256 MiB UKI as half a million separate sectors, each read
//! from the disk before it was overwritten, made the upgrade take seconds. A run grows in place
//! as the file does, a sector wholly overwritten is never read, a read that dirty runs cover
//! never reaches the disk (most of `fatfs`'s FAT lookups), and the flush writes each run with
//! one write, as before.
//!
//! Whole aligned sectors (a file's data, a new directory's zeroed cluster) need no such care:
//! they are gathered, while they follow on from each other, in one reused staging buffer and
//! written on when it fills, so a large file costs no copy the size of itself. They reach
//! `inner` before the flush, which is no different for the crash model: until a flush, writes
//! may reach the medium in any order, or not at all.

use crate::runs::Runs;
use crate::{check_bounds, Disk, DiskError, SECTOR};

const S: u64 = SECTOR as u64;

/// Bytes of whole sectors gathered before they are written on: enough to make each write
/// large, small enough to stay in the CPU's cache between the copy in and the kernel's copy out
/// (`bench-apply` on the 2-core CI machine: 1–2 MiB stages 455–470 ms, 8 MiB 530–550 ms).
const STAGE: usize = 2 << 20;

/// Whole sectors written at once this many or more go on as they are: gathering them would
/// cost a copy and save few calls (a piece of a borrowed source, see `BorrowedWrites`).
const DIRECT: usize = 64 << 10;

/// Buffers writes to `inner` per sector until [`Disk::flush`], which writes the dirty sectors in
/// ascending order (adjacent ones as one write) and then flushes `inner`. Writes of whole
/// aligned sectors may reach `inner` earlier (see the module documentation). Unflushed writes
/// are lost when it is dropped: flush it.
#[derive(Debug)]
pub struct SectorBuffer<D> {
    inner: D,
    /// Runs of dirty sectors by first sector index: disjoint and never adjacent (adjacent runs
    /// are merged), each a whole number of sectors except one ending at the end of the disk.
    dirty: Runs,
    /// Whole sectors at `staged_at`, not yet written on; never overlapping a run.
    staged: Vec<u8>,
    staged_at: u64,
    /// Nothing was written since `inner` was last flushed: `fatfs` flushes whenever it drops
    /// a file or directory handle, and each would otherwise be an fsync of nothing.
    synced: bool,
}

impl<D: Disk> SectorBuffer<D> {
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            dirty: Runs::default(),
            staged: Vec::new(),
            staged_at: 0,
            synced: false,
        }
    }

    fn spill(&mut self) -> Result<(), DiskError> {
        if !self.staged.is_empty() {
            self.inner.write_at(self.staged_at, &self.staged)?;
            // The medium can start on them while the next stage fills. Should a later write
            // land there before the flush, it dirties the pages again and the flush writes it:
            // a hint changes no state the crash model allows or forbids.
            self.inner
                .start_writeback(self.staged_at, self.staged.len() as u64)?;
            self.staged.clear();
        }
        Ok(())
    }

    fn overlaps_staged(&self, offset: u64, end: u64) -> bool {
        !self.staged.is_empty()
            && offset < self.staged_at + self.staged.len() as u64
            && self.staged_at < end
    }

    /// Whether `[offset, end)` is whole sectors (or ends at the end of the disk) and no run
    /// touches it.
    fn stageable(&self, offset: u64, end: u64) -> bool {
        offset % S == 0
            && (end % S == 0 || end == self.inner.len())
            && offset < end
            && self
                .dirty
                .last_before(end.div_ceil(S))
                .is_none_or(|(first, run)| first * S + run.len() as u64 <= offset)
    }

    /// Gather `data` (whole sectors at `offset`, see [`Self::stageable`]) or write it on.
    fn stage(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        let follows = offset == self.staged_at + self.staged.len() as u64;
        if !follows || self.staged.len() + data.len() > STAGE || data.len() >= DIRECT {
            self.spill()?;
        }
        if data.len() >= DIRECT {
            self.inner.write_at(offset, data)?;
            return self.inner.start_writeback(offset, data.len() as u64);
        }
        if self.staged.is_empty() {
            self.staged.reserve(STAGE);
            self.staged_at = offset;
        }
        self.staged.extend_from_slice(data);
        Ok(())
    }

    /// The run holding the byte at `at`, as (its first byte, its bytes).
    fn run_at(&mut self, at: u64) -> Option<(u64, &mut Vec<u8>)> {
        let (first, run) = self.dirty.last_before_mut(at / S + 1)?;
        (at < first * S + run.len() as u64).then_some((first * S, run))
    }

    /// Make `[at, end)` (no dirty run in it, `at` inside the first sector) dirty with `data`,
    /// completing its first and last sectors from `inner`, and join it to the runs it touches.
    fn insert_run(&mut self, at: u64, data: &[u8]) -> Result<(), DiskError> {
        let start = at - at % S;
        let end = at + data.len() as u64;
        let stop = end.div_ceil(S).saturating_mul(S).min(self.inner.len());
        let mut head = vec![0; (at - start) as usize];
        if !head.is_empty() {
            self.inner.read_at(start, &mut head)?;
        }
        let mut tail = vec![0; (stop - end) as usize];
        if !tail.is_empty() {
            self.inner.read_at(end, &mut tail)?;
        }
        let before = self
            .dirty
            .last_before(start / S)
            .filter(|(first, run)| first * S + run.len() as u64 == start)
            .map(|(first, _)| first);
        let after = if stop % S == 0 {
            self.dirty.remove(stop / S)
        } else {
            None
        };
        let run = self.dirty.entry(before.unwrap_or(start / S));
        run.reserve(head.len() + data.len() + tail.len() + after.as_ref().map_or(0, Vec::len));
        run.extend_from_slice(&head);
        run.extend_from_slice(data);
        run.extend_from_slice(&tail);
        if let Some(next) = after {
            run.extend_from_slice(&next);
        }
        Ok(())
    }
}

impl<D: Disk> Disk for SectorBuffer<D> {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        check_bounds(offset, buf.len(), self.len())?;
        let end = offset + buf.len() as u64;
        let first = self
            .dirty
            .last_before(offset / S + 1)
            .map_or(offset / S, |(first, _)| first);
        let runs = self.dirty.starting_in(first, end.div_ceil(S));
        let covered =
            runs.clone().next().is_some_and(|(first, run)| {
                first * S <= offset && end <= first * S + run.len() as u64
            }) || (self.staged_at <= offset && end <= self.staged_at + self.staged.len() as u64);
        if !covered {
            self.inner.read_at(offset, buf)?;
        }
        if self.overlaps_staged(offset, end) {
            let start = self.staged_at;
            let (from, to) = (
                start.max(offset),
                (start + self.staged.len() as u64).min(end),
            );
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&self.staged[(from - start) as usize..(to - start) as usize]);
        }
        for (index, bytes) in runs {
            let start = index * S;
            let (from, to) = (start.max(offset), (start + bytes.len() as u64).min(end));
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len())?;
        self.synced = false;
        let end = offset + data.len() as u64;
        // Whole sectors and a partial last one: the whole ones may be staged or written on,
        // the partial one joins a run.
        let whole_end = end - end % S;
        if offset % S == 0 && offset < whole_end && whole_end < end && end != self.len() {
            let split = (whole_end - offset) as usize;
            self.write_at(offset, &data[..split])?;
            return self.write_at(whole_end, &data[split..]);
        }
        if self.overlaps_staged(offset, end) {
            self.spill()?;
        }
        if self.stageable(offset, end) {
            return self.stage(offset, data);
        }
        let mut at = offset;
        while at < end {
            let done = (at - offset) as usize;
            if let Some((start, run)) = self.run_at(at) {
                let n = (start + run.len() as u64).min(end) - at;
                let within = (at - start) as usize;
                run[within..within + n as usize].copy_from_slice(&data[done..done + n as usize]);
                at += n;
                continue;
            }
            // Up to the next dirty run, which starts on a sector boundary past `at`'s sector.
            let next = self
                .dirty
                .first_from(at / S + 1)
                .map_or(u64::MAX, |first| first * S);
            let stop = end.min(next);
            self.insert_run(at, &data[done..(stop - offset) as usize])?;
            at = stop;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        if self.synced {
            return Ok(());
        }
        self.spill()?;
        for (index, run) in self.dirty.take() {
            self.inner.write_at(index * S, &run)?;
        }
        self.inner.flush()?;
        self.synced = true;
        Ok(())
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

    /// Writes at random offsets and lengths (some whole aligned sectors, some following each
    /// other, some across runs, some at the disk's ragged end), read back before the flush and
    /// checked after it against a disk written directly.
    #[test]
    fn runs_and_staging_match_a_plain_disk() {
        let len = 40 * SECTOR + 100;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |bound: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % bound
        };
        for round in 0..300 {
            let base: Vec<u8> = (0..len).map(|i| (i * 7 + round) as u8).collect();
            let mut rec = RecordingDisk::new(base.clone());
            let mut expected = MemDisk::from_bytes(base);
            let mut buf = SectorBuffer::new(&mut rec);
            let mut follow = 0;
            for write in 0..(1 + next(16)) {
                let (offset, n) = match next(4) {
                    0 => {
                        let at = next(len as u64) / S * S;
                        (at, (1 + next(6) * S).min(len as u64 - at))
                    }
                    1 if follow < len as u64 => (follow, (2 * S).min(len as u64 - follow)),
                    _ => {
                        let at = next(len as u64);
                        let cap = if write % 3 == 0 { 3000 } else { 40 };
                        (at, 1 + next((len as u64 - at).min(cap)))
                    }
                };
                follow = offset + n;
                let data: Vec<u8> = (0..n).map(|i| (i as u8) ^ (write as u8) ^ 0xA5).collect();
                buf.write_at(offset, &data).unwrap();
                expected.write_at(offset, &data).unwrap();
                let (at, n) = (next(len as u64), next(700) as usize);
                let n = n.min(len - at as usize);
                assert_eq!(
                    buf.read_vec(at, n).unwrap(),
                    expected.read_vec(at, n).unwrap()
                );
            }
            assert_eq!(buf.read_vec(0, len).unwrap(), expected.to_bytes());
            let runs: Vec<(u64, usize)> = buf.dirty.iter().map(|(i, r)| (i, r.len())).collect();
            for pair in runs.windows(2) {
                assert!(
                    pair[0].0 * S + (pair[0].1 as u64) < pair[1].0 * S,
                    "{runs:?}"
                );
            }
            buf.flush().unwrap();
            buf.flush().unwrap();
            assert_eq!(rec.current(), &expected, "round {round}");
            let flushes = rec.log().iter().filter(|op| **op == Op::Flush).count();
            assert_eq!(flushes, 1, "a flush with nothing written is not passed on");
            for op in rec.log() {
                if let Op::Write { offset, data } = op {
                    assert_eq!(offset % S, 0);
                    assert!(data.len() % SECTOR == 0 || *offset + data.len() as u64 == len as u64);
                }
            }
        }
    }

    #[test]
    fn whole_sectors_that_follow_each_other_are_written_as_one() {
        let mut rec = RecordingDisk::new(vec![0; 64 * SECTOR]);
        let mut buf = SectorBuffer::new(&mut rec);
        for i in 0..8u64 {
            buf.write_at(8 * S + i * 2 * S, &[i as u8 + 1; 2 * SECTOR])
                .unwrap();
        }
        buf.write_at(3, b"entry").unwrap();
        assert_eq!(buf.read_vec(10 * S - 1, 2).unwrap(), [1, 2]);
        buf.flush().unwrap();
        let log = rec.log();
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(
            matches!(&log[0], Op::Write { offset, data } if *offset == 8 * S && data.len() == 16 * SECTOR)
        );
        assert!(matches!(&log[1], Op::Write { offset: 0, data } if data.len() == SECTOR));
    }

    /// Records what reaches it, hints included, in order.
    #[derive(Default)]
    struct HintLog {
        disk: Vec<u8>,
        events: Vec<(&'static str, u64, u64)>,
    }

    impl Disk for HintLog {
        fn len(&self) -> u64 {
            self.disk.len() as u64
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
            buf.copy_from_slice(&self.disk[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
            self.disk[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            self.events.push(("write", offset, data.len() as u64));
            Ok(())
        }
        fn flush(&mut self) -> Result<(), DiskError> {
            self.events.push(("flush", 0, 0));
            Ok(())
        }
        fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
            self.events.push(("writeback", offset, len));
            Ok(())
        }
    }

    /// Each stage of a large file is handed on for writeback right after it is written; runs
    /// (written at the flush) are not, and the flush comes last.
    #[test]
    fn each_written_stage_is_handed_on_for_writeback() {
        let mut inner = HintLog {
            disk: vec![0; 3 * STAGE + 4 * SECTOR],
            ..HintLog::default()
        };
        let mut buf = SectorBuffer::new(&mut inner);
        let cluster = vec![9; 8 * SECTOR];
        let mut at = 2 * S;
        while at + cluster.len() as u64 <= 2 * S + (2 * STAGE + STAGE / 2) as u64 {
            buf.write_at(at, &cluster).unwrap();
            at += cluster.len() as u64;
        }
        buf.write_at(5, b"entry").unwrap();
        buf.flush().unwrap();
        let stage = STAGE as u64;
        assert_eq!(
            inner.events,
            [
                ("write", 2 * S, stage),
                ("writeback", 2 * S, stage),
                ("write", 2 * S + stage, stage),
                ("writeback", 2 * S + stage, stage),
                ("write", 2 * S + 2 * stage, stage / 2),
                ("writeback", 2 * S + 2 * stage, stage / 2),
                ("write", 0, S),
                ("flush", 0, 0),
            ]
        );
        assert_eq!(inner.disk[2 * SECTOR..2 * SECTOR + 5], [9; 5]);
        assert_eq!(&inner.disk[5..10], b"entry");
    }
}
