//! The fault-injecting recorder behind the crash matrix.
//!
//! [`RecordingDisk`] behaves like a disk whose writes are volatile until flushed. It logs every
//! write and flush, and can materialize the disk as it would be found after a power cut following
//! any prefix of that log, with the unflushed writes of that prefix dropped, kept, or torn at
//! sector granularity. It can also refuse operations from a given point on, to test error paths.

use crate::{check_bounds, Disk, DiskError, MemDisk};

/// The unit in which a power cut can tear a write.
pub const SECTOR: usize = 512;

/// One logged operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

/// What happens to the writes issued since the last flush when power is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// None of them reached the medium.
    DropUnflushed,
    /// All of them reached the medium, in order.
    KeepUnflushed,
    /// All but the last reached the medium; of the last, only its first `sectors_kept` sectors.
    TornLastWrite { sectors_kept: usize },
    /// Each sector of each unflushed write independently reached the medium or not (the device
    /// reorders freely between flushes); the choice is a deterministic function of `seed`.
    RandomSectors { seed: u64 },
}

/// A point in the log at which power is cut, and what the cut does to unflushed writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashPoint {
    /// Number of logged operations that were issued before the cut (0 = none).
    pub ops_done: usize,
    pub mode: CutMode,
}

/// A disk that records what is written to it. See the module documentation.
#[derive(Debug, Clone)]
pub struct RecordingDisk {
    base: MemDisk,
    current: MemDisk,
    log: Vec<Op>,
    /// The durable content after each flush, keyed by the number of operations logged then
    /// (copy-on-write clones of `current`): a crash state starts from one of these instead of
    /// replaying the whole log onto the base.
    after_flush: Vec<(usize, MemDisk)>,
    refuse_from: Option<usize>,
}

impl RecordingDisk {
    /// Start recording on top of `base`, the durable content before the first logged operation.
    pub fn new(base: Vec<u8>) -> Self {
        Self::on(MemDisk::from_bytes(base))
    }

    /// [`RecordingDisk::new`] over an in-memory disk, without copying its bytes.
    pub fn on(base: MemDisk) -> Self {
        Self {
            current: base.clone(),
            base,
            log: Vec::new(),
            after_flush: Vec::new(),
            refuse_from: None,
        }
    }

    /// Make operation number `op` (0-based, counted over writes and flushes) and every later one
    /// fail with [`DiskError::Injected`] without effect.
    pub fn refuse_from(mut self, op: usize) -> Self {
        self.refuse_from = Some(op);
        self
    }

    pub fn log(&self) -> &[Op] {
        &self.log
    }

    /// The content every read sees: the base with every logged write applied.
    pub fn current(&self) -> &MemDisk {
        &self.current
    }

    fn admit(&self) -> Result<(), DiskError> {
        match self.refuse_from {
            Some(limit) if self.log.len() >= limit => {
                Err(DiskError::Injected { op: self.log.len() })
            }
            _ => Ok(()),
        }
    }

    /// Every crash point worth checking: after each logged operation (and before the first), the
    /// unflushed writes dropped and kept; the last unflushed write torn after each of its sectors
    /// (at most `max_tears` evenly spread tear points per write); and `random_seeds` random
    /// sector subsets.
    pub fn crash_points(&self, max_tears: usize, random_seeds: u64) -> Vec<CrashPoint> {
        let mut points = Vec::new();
        for ops_done in 0..=self.log.len() {
            points.push(CrashPoint {
                ops_done,
                mode: CutMode::DropUnflushed,
            });
            let unflushed = self.unflushed_writes(ops_done);
            if unflushed.is_empty() {
                continue;
            }
            points.push(CrashPoint {
                ops_done,
                mode: CutMode::KeepUnflushed,
            });
            if let Some(Op::Write { data, .. }) = unflushed.last() {
                let sectors = data.len().div_ceil(SECTOR);
                let tears = sectors.saturating_sub(1);
                let step = tears.div_ceil(max_tears.max(1)).max(1);
                for sectors_kept in (1..sectors).step_by(step) {
                    points.push(CrashPoint {
                        ops_done,
                        mode: CutMode::TornLastWrite { sectors_kept },
                    });
                }
            }
            for seed in 0..random_seeds {
                points.push(CrashPoint {
                    ops_done,
                    mode: CutMode::RandomSectors {
                        seed: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ops_done as u64,
                    },
                });
            }
        }
        points
    }

    /// The writes issued after the last flush among the first `ops_done` operations.
    fn unflushed_writes(&self, ops_done: usize) -> &[Op] {
        let done = &self.log[..ops_done.min(self.log.len())];
        let after_flush = done
            .iter()
            .rposition(|op| *op == Op::Flush)
            .map_or(0, |i| i + 1);
        &done[after_flush..]
    }

    /// The disk as found after power is cut at `point`.
    pub fn materialize(&self, point: CrashPoint) -> MemDisk {
        let ops_done = point.ops_done.min(self.log.len());
        let unflushed = self.unflushed_writes(ops_done);
        let durable_ops = ops_done - unflushed.len();
        let mut disk = match durable_ops {
            0 => self.base.clone(),
            n => {
                let at = self
                    .after_flush
                    .binary_search_by_key(&n, |(ops, _)| *ops)
                    .expect("a durable prefix ends with a flush, and every flush is snapshotted");
                self.after_flush[at].1.clone()
            }
        };
        let mut rng = XorShift(match point.mode {
            CutMode::RandomSectors { seed } => seed | 1,
            _ => 1,
        });
        for (index, op) in unflushed.iter().enumerate() {
            let Op::Write { offset, data } = op else {
                continue;
            };
            let is_last = index + 1 == unflushed.len();
            match point.mode {
                CutMode::DropUnflushed => {}
                CutMode::KeepUnflushed => apply(&mut disk, *offset, data),
                CutMode::TornLastWrite { sectors_kept } => {
                    let keep = if is_last {
                        (sectors_kept * SECTOR).min(data.len())
                    } else {
                        data.len()
                    };
                    apply(&mut disk, *offset, &data[..keep]);
                }
                CutMode::RandomSectors { .. } => {
                    for (i, chunk) in data.chunks(SECTOR).enumerate() {
                        if rng.next() & 1 == 1 {
                            apply(&mut disk, offset + (i * SECTOR) as u64, chunk);
                        }
                    }
                }
            }
        }
        disk
    }
}

/// A logged write, replayed: it was in bounds when it was logged.
fn apply(disk: &mut MemDisk, offset: u64, data: &[u8]) {
    disk.write_at(offset, data)
        .expect("a logged write lies within the disk");
}

/// A tiny deterministic generator; crash states must be reproducible from their seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

impl Disk for RecordingDisk {
    fn len(&self) -> u64 {
        self.current.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.current.read_at(offset, buf)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len())?;
        self.admit()?;
        apply(&mut self.current, offset, data);
        self.log.push(Op::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        self.admit()?;
        self.log.push(Op::Flush);
        self.after_flush
            .push((self.log.len(), self.current.clone()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_writes_one_flush() -> RecordingDisk {
        let mut disk = RecordingDisk::new(vec![0; 4 * SECTOR]);
        disk.write_at(0, &[1; 2 * SECTOR]).unwrap();
        disk.flush().unwrap();
        disk.write_at(2 * SECTOR as u64, &[2; 2 * SECTOR]).unwrap();
        disk
    }

    #[test]
    fn unflushed_writes_are_dropped_kept_or_torn() {
        let disk = two_writes_one_flush();
        assert_eq!(disk.log().len(), 3);
        let at = |ops_done, mode| disk.materialize(CrashPoint { ops_done, mode }).into_bytes();

        assert_eq!(at(0, CutMode::KeepUnflushed), vec![0; 4 * SECTOR]);
        assert_eq!(at(1, CutMode::DropUnflushed), vec![0; 4 * SECTOR]);
        assert_eq!(at(1, CutMode::KeepUnflushed)[..2 * SECTOR], [1; 2 * SECTOR]);
        assert_eq!(at(2, CutMode::DropUnflushed)[..2 * SECTOR], [1; 2 * SECTOR]);

        let dropped = at(3, CutMode::DropUnflushed);
        assert_eq!(dropped[2 * SECTOR..], [0; 2 * SECTOR]);
        let torn = at(3, CutMode::TornLastWrite { sectors_kept: 1 });
        assert_eq!(torn[2 * SECTOR..3 * SECTOR], [2; SECTOR]);
        assert_eq!(torn[3 * SECTOR..], [0; SECTOR]);
        let kept = at(3, CutMode::KeepUnflushed);
        assert_eq!(kept, disk.current().to_bytes());
    }

    #[test]
    fn random_sector_cuts_are_reproducible_and_vary() {
        let disk = two_writes_one_flush();
        let point = |seed| CrashPoint {
            ops_done: 3,
            mode: CutMode::RandomSectors { seed },
        };
        assert_eq!(disk.materialize(point(5)), disk.materialize(point(5)));
        let distinct: std::collections::HashSet<Vec<u8>> = (0..32)
            .map(|s| disk.materialize(point(s)).into_bytes())
            .collect();
        assert!(distinct.len() > 1, "different seeds give different states");
    }

    #[test]
    fn crash_points_cover_every_operation() {
        let disk = two_writes_one_flush();
        let points = disk.crash_points(8, 2);
        for ops_done in 0..=3 {
            assert!(points.iter().any(|p| p.ops_done == ops_done));
        }
        assert!(points
            .iter()
            .any(|p| p.mode == CutMode::TornLastWrite { sectors_kept: 1 } && p.ops_done == 3));
    }

    #[test]
    fn refused_operations_have_no_effect() {
        let mut disk = RecordingDisk::new(vec![0; SECTOR]).refuse_from(1);
        disk.write_at(0, &[1; 4]).unwrap();
        assert!(matches!(disk.flush(), Err(DiskError::Injected { op: 1 })));
        assert!(disk.write_at(4, &[2; 4]).is_err());
        assert_eq!(disk.log().len(), 1);
        assert_eq!(disk.current().read_vec(4, 4).unwrap(), [0; 4]);
    }
}
