//! The build cache (`slate imager build --cache DIR`, issue 43): the outputs of a build's
//! costly stages — the root squashfs's compressed blocks and fragments, the compressed
//! initramfs archive, an installer bundle's compressed chunks (`frame_cache.rs`) — kept in files under a directory, each keyed by a digest of everything
//! that determines it (input bytes, compression settings, the compressor's version). A rebuild
//! after one file of the root changed recompresses only what that file's bytes reach.
//!
//! A cache changes how long a build takes, never what it writes: a stage's output depends only
//! on what its key covers. An entry is its payload's SHA-256 followed by the payload, written
//! under a temporary name and renamed; an entry whose digest does not match (a torn write, a
//! flipped bit, an edit) is counted, removed and rebuilt, never used. Nothing is evicted: the
//! directory is the caller's to remove.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::ImagerError;

/// The stages whose outputs are kept, each in its own directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A zstd frame of one squashfs data block or fragment block.
    SquashfsBlock,
    /// The initramfs's main archive, zstd-compressed.
    Initramfs,
    /// The compressed chunks' frames of one blob of an installer bundle (`frame_cache.rs`).
    ChunkFrames,
}

impl Stage {
    fn dir(self) -> &'static str {
        match self {
            Stage::SquashfsBlock => "squashfs-block",
            Stage::Initramfs => "initramfs-zstd",
            Stage::ChunkFrames => "chunk-frames",
        }
    }
}

/// The most bytes of one entry: a block is at most 1 MiB, an initramfs far under this.
const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// What a cache did during the builds that used it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries whose digest did not match their bytes: removed and rebuilt.
    pub corrupt: u64,
    pub stored: u64,
    /// Entries that could not be written (the build went on without them).
    pub write_errors: u64,
}

#[derive(Debug, Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    stored: AtomicU64,
    write_errors: AtomicU64,
    temp: AtomicU64,
}

/// A cache directory; clones share their counts.
#[derive(Debug, Clone)]
pub struct StageCache {
    dir: PathBuf,
    counts: Arc<Counts>,
}

impl StageCache {
    /// The cache at `dir` (`<dir>/v1/<stage>/<key>`), created if missing.
    pub fn open(dir: &Path) -> Result<Self, ImagerError> {
        let root = dir.join("v1");
        for stage in [Stage::SquashfsBlock, Stage::Initramfs, Stage::ChunkFrames] {
            let at = root.join(stage.dir());
            fs::create_dir_all(&at).map_err(|source| ImagerError::Output { path: at, source })?;
        }
        Ok(Self {
            dir: root,
            counts: Arc::default(),
        })
    }

    fn path(&self, stage: Stage, key: &[u8; 32]) -> PathBuf {
        self.dir.join(stage.dir()).join(hex::encode(key))
    }

    /// The payload stored under `key`, if it is there and intact.
    pub fn get(&self, stage: Stage, key: &[u8; 32]) -> Option<Vec<u8>> {
        let path = self.path(stage, key);
        let read = slate_files::read_file_bounded(&path, MAX_ENTRY_BYTES + 32, "a cache entry");
        let entry = match read {
            Ok(entry) => entry,
            Err(_) => {
                // Missing, or not a regular file within bounds: rebuilt either way.
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        match check_entry(entry) {
            Some(payload) => {
                self.counts.hits.fetch_add(1, Ordering::Relaxed);
                Some(payload)
            }
            None => {
                self.counts.corrupt.fetch_add(1, Ordering::Relaxed);
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Keep `payload` under `key`. A failure is counted, not returned: the build has its
    /// output already.
    pub fn put(&self, stage: Stage, key: &[u8; 32], payload: &[u8]) {
        let path = self.path(stage, key);
        let n = self.counts.temp.fetch_add(1, Ordering::Relaxed);
        let temp = path.with_file_name(format!(".tmp-{}-{n}", std::process::id()));
        let written = fs::File::create(&temp).and_then(|mut file| {
            file.write_all(&Sha256::digest(payload))?;
            file.write_all(payload)
        });
        let kept = written.and_then(|()| fs::rename(&temp, &path));
        if kept.is_ok() {
            self.counts.stored.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = fs::remove_file(&temp);
            self.counts.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The payload under `key`, or `make`'s, which is then kept.
    pub(crate) fn get_or_make<E>(
        &self,
        stage: Stage,
        key: &[u8; 32],
        make: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Vec<u8>, E> {
        if let Some(hit) = self.get(stage, key) {
            return Ok(hit);
        }
        let made = make()?;
        self.put(stage, key, &made);
        Ok(made)
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counts;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            corrupt: c.corrupt.load(Ordering::Relaxed),
            stored: c.stored.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
        }
    }
}

/// The payload of an entry whose leading digest matches it.
fn check_entry(mut entry: Vec<u8>) -> Option<Vec<u8>> {
    if entry.len() < 32 {
        return None;
    }
    let payload = entry.split_off(32);
    (Sha256::digest(&payload).as_slice() == entry.as_slice()).then_some(payload)
}

impl slate_rootfs::BlockCache for StageCache {
    fn get(&self, key: &[u8; 32]) -> Option<Vec<u8>> {
        StageCache::get(self, Stage::SquashfsBlock, key)
    }

    fn put(&self, key: &[u8; 32], frame: &[u8]) {
        StageCache::put(self, Stage::SquashfsBlock, key, frame)
    }
}

/// The key of the initramfs archive compressed by zstd at `level` (docs/formats.md §6.7).
pub(crate) fn initramfs_key(level: i32, archive: &[u8]) -> [u8; 32] {
    key_for(zstd::zstd_safe::version_number(), level, archive)
}

fn key_for(zstd_version: u32, level: i32, archive: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"slate-imager initramfs zstd v1\0");
    h.update(zstd_version.to_le_bytes());
    h.update(level.to_le_bytes());
    h.update((archive.len() as u64).to_le_bytes());
    h.update(archive);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_comes_back_and_a_damaged_one_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let cache = StageCache::open(dir.path()).unwrap();
        let key = initramfs_key(3, b"archive");
        assert_eq!(cache.get(Stage::Initramfs, &key), None);
        cache.put(Stage::Initramfs, &key, b"frame");
        assert_eq!(
            cache.get(Stage::Initramfs, &key).as_deref(),
            Some(&b"frame"[..])
        );

        // One flipped bit in the payload: refused, removed, made again.
        let path = cache.path(Stage::Initramfs, &key);
        let mut bytes = fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(Stage::Initramfs, &key), None);
        assert!(!path.exists());
        let made = cache
            .get_or_make(Stage::Initramfs, &key, || Ok::<_, ()>(b"frame".to_vec()))
            .unwrap();
        assert_eq!(made, b"frame");
        // Truncated below its digest: the same.
        fs::write(&path, b"short").unwrap();
        assert_eq!(cache.get(Stage::Initramfs, &key), None);
        let stats = cache.stats();
        assert_eq!(
            (stats.hits, stats.corrupt, stats.stored),
            (1, 2, 2),
            "{stats:?}"
        );
        // The other stage's entries are apart.
        assert_eq!(cache.get(Stage::SquashfsBlock, &key), None);
    }

    /// docs/formats.md §6.7: the key (zstd 1.5.5) and an entry's bytes.
    #[test]
    fn vectors() {
        assert_eq!(
            hex::encode(key_for(10505, 3, b"abc")),
            "6782abcbeab0f90d32cdc809ce23b1353d4d64fb76b2eb2c97e5540a415467e6"
        );
        let dir = tempfile::tempdir().unwrap();
        let cache = StageCache::open(dir.path()).unwrap();
        cache.put(Stage::Initramfs, &[0; 32], b"frame");
        let entry = fs::read(dir.path().join("v1/initramfs-zstd").join("00".repeat(32))).unwrap();
        assert_eq!(
            hex::encode(&entry[..32]),
            "9dff50df08c635815f4b19da10f756605a34a79a48d4ba48712782502975a70e"
        );
        assert_eq!(&entry[32..], b"frame");
    }
}
