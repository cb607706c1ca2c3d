//! bench-apply's bare references: the apply design "hash every byte and check it, then write"
//! with nothing else (no bundle, FAT or flip), measured beside slate and `cp + fsync` in the
//! same rotation. Each hashes the payload from memory (as a mapping of a blob already in the
//! page cache is), checks the digest, and only then writes the bytes with `O_DIRECT` in 8 MiB
//! pieces into a fresh sparse file on the same filesystem, then `fdatasync`.
//!
//! - one core: one SHA-256 over the whole blob, the bundle format slate had before chunk
//!   digests (and what an older bundle still gets);
//! - all cores: the blob's chunk digests (bundle `chunks.rs`), hashed on every core at once.
//!
//! The hash part is the floor of any apply that keeps "a tampered bundle is refused before a
//! single byte is written"; the write part is one plain way to write, and slate's staged
//! page-cache writes with early writeback may beat it. They show how much of slate's time is
//! the design and how much is slate.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::Path;

use anyhow::{ensure, Context, Result};
use slate_bundle::Digest;

use crate::bench::{stopwatch, Sample, Side};

/// Linux's `O_DIRECT` on x86-64 and arm64 alike.
const O_DIRECT: i32 = 0o40000;
/// Alignment `O_DIRECT` needs of buffer, offset and length: the page size covers every
/// logical block size in use.
const ALIGN: usize = 4096;
const PIECE: usize = 8 << 20;
/// Where the payload lands in the target file: a partition's usual first byte.
const OFFSET: u64 = 1 << 20;

/// The payload in memory at an `O_DIRECT`-ready address, with its digests.
/// Flushes the whole system: untimed, before each timed part.
pub(crate) fn sync_all() -> Result<()> {
    crate::util::run(&mut std::process::Command::new("sync"))
}

pub struct Payload {
    backing: Vec<u8>,
    start: usize,
    len: usize,
    whole: Digest,
    chunks: Vec<Digest>,
}

impl Payload {
    /// Reads `plain` (untimed) and computes the digests the references check against.
    pub fn read(plain: &Path) -> Result<Payload> {
        let bytes = fs::read(plain).with_context(|| format!("reading {}", plain.display()))?;
        let len = bytes.len();
        ensure!(len % ALIGN == 0, "the payload is a whole number of pages");
        let mut backing = vec![0u8; len + ALIGN];
        let start = backing.as_ptr().align_offset(ALIGN);
        backing[start..start + len].copy_from_slice(&bytes);
        let mut payload = Payload {
            backing,
            start,
            len,
            whole: Digest::of(&bytes),
            chunks: Vec::new(),
        };
        payload.chunks = payload.chunked().map(Digest::of).collect();
        Ok(payload)
    }

    fn bytes(&self) -> &[u8] {
        &self.backing[self.start..self.start + self.len]
    }

    /// One chunk per core.
    fn chunked(&self) -> std::slice::Chunks<'_, u8> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        self.bytes()
            .chunks(self.len.div_ceil(cores).next_multiple_of(ALIGN))
    }

    /// The two references, as further sides of bench-apply's comparison.
    pub fn sides<'a>(&'a self, dir: &'a Path) -> Vec<Side<'a>> {
        vec![
            Side::new("bare, one core", move |run| {
                self.measure(&dir.join(format!("bare-one-{run}.raw")), || {
                    ensure!(Digest::of(self.bytes()) == self.whole, "the digest");
                    Ok(())
                })
            }),
            Side::new("bare, all cores", move |run| {
                self.measure(&dir.join(format!("bare-all-{run}.raw")), || {
                    let digests = std::thread::scope(|s| {
                        let hashing: Vec<_> = self
                            .chunked()
                            .map(|chunk| s.spawn(move || Digest::of(chunk)))
                            .collect();
                        hashing
                            .into_iter()
                            .map(|h| h.join().expect("a hashing thread panicked"))
                            .collect::<Vec<_>>()
                    });
                    ensure!(digests == self.chunks, "the chunk digests");
                    Ok(())
                })
            }),
        ]
    }

    /// One run: a fresh sparse target (untimed, after a system-wide sync), then `verify` and
    /// the direct write, timed together; the hash and the write are kept as figures.
    fn measure(&self, target: &Path, verify: impl FnOnce() -> Result<()>) -> Result<Sample> {
        let _ = fs::remove_file(target);
        let file =
            File::create(target).with_context(|| format!("creating {}", target.display()))?;
        file.set_len(OFFSET + self.len as u64)?;
        drop(file);
        sync_all()?;
        let ((), hash) = stopwatch(verify)?;
        let ((), write) = stopwatch(|| self.write_direct(target))?;
        fs::remove_file(target).with_context(|| format!("removing {}", target.display()))?;
        Ok(Sample::new(hash + write)
            .with("hash", "s", hash)
            .with("write", "s", write))
    }

    fn write_direct(&self, target: &Path) -> Result<()> {
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(O_DIRECT)
            .open(target)
            .with_context(|| format!("opening {} with O_DIRECT", target.display()))?;
        for (i, piece) in self.bytes().chunks(PIECE).enumerate() {
            file.write_all_at(piece, OFFSET + (i * PIECE) as u64)
                .with_context(|| format!("writing {}", target.display()))?;
        }
        file.sync_data()
            .with_context(|| format!("flushing {}", target.display()))
    }
}
