//! Compressed data blocks kept between builds, so that a rebuild after a small change of the
//! tree compresses only the blocks whose bytes changed (issue 43).
//!
//! A block's compressed frame is a function of its input bytes, the zstd level and the zstd
//! library that made it (one frame per block, as `parallel.rs` makes them). The key covers all
//! of those, so a frame taken from a cache is the frame the build would have made: the image
//! stays byte for byte what a build without a cache writes. Where the frames are kept, and how
//! a damaged one is told apart, is the caller's (the imager keeps them in files, each with the
//! digest of its bytes).

use sha2::{Digest as _, Sha256};

/// A store of compressed blocks by [`block_key`], shared by the compression workers.
pub trait BlockCache: Sync + std::fmt::Debug {
    /// The frame stored under `key`, or None. Must never return bytes other than the ones
    /// `put` was given for that key (a store that cannot tell must answer None).
    fn get(&self, key: &[u8; 32]) -> Option<Vec<u8>>;
    /// Keep `frame` under `key`. A store that fails to keep it loses nothing but time.
    fn put(&self, key: &[u8; 32], frame: &[u8]);
}

/// The key of the frame zstd at `level` makes of `input` (docs/formats.md §6.7): SHA-256 over
/// a tag, the zstd library's version (another version may make other frames of the same
/// input), the level and the input.
pub fn block_key(level: i32, input: &[u8]) -> [u8; 32] {
    key_for(zstd::zstd_safe::version_number(), level, input)
}

fn key_for(zstd_version: u32, level: i32, input: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"slate-rootfs zstd block v1\0");
    h.update(zstd_version.to_le_bytes());
    h.update(level.to_le_bytes());
    h.update((input.len() as u64).to_le_bytes());
    h.update(input);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Cursor;
    use std::sync::Mutex;

    use super::*;
    use crate::SquashfsOptions;

    #[derive(Debug, Default)]
    struct Memory(Mutex<HashMap<[u8; 32], Vec<u8>>>, Mutex<(u64, u64)>);

    impl BlockCache for Memory {
        fn get(&self, key: &[u8; 32]) -> Option<Vec<u8>> {
            let hit = self.0.lock().unwrap().get(key).cloned();
            let mut counts = self.1.lock().unwrap();
            if hit.is_some() {
                counts.0 += 1;
            }
            hit
        }
        fn put(&self, key: &[u8; 32], frame: &[u8]) {
            self.1.lock().unwrap().1 += 1;
            self.0.lock().unwrap().insert(*key, frame.to_vec());
        }
    }

    #[test]
    fn the_key_depends_on_level_and_every_byte() {
        let a = block_key(15, b"abc");
        assert_eq!(a, block_key(15, b"abc"));
        assert_ne!(a, block_key(14, b"abc"));
        assert_ne!(a, block_key(15, b"abd"));
        assert_ne!(a, block_key(15, b"ab"));
        // docs/formats.md §6.7, zstd 1.5.5.
        assert_eq!(
            key_for(10505, 15, b"abc"),
            *b"\x7b\xf8\xbc\x91\xe4\xd0\xdc\x8b\xc5\xf1\xc6\x22\x1b\x67\x8a\xae\
               \x47\xc0\xc8\xa9\xcc\x60\x27\xe7\x77\xaf\xcf\x22\xda\xa8\x5f\xb0"
        );
    }

    fn image(root: &std::path::Path, cache: Option<&Memory>) -> Vec<u8> {
        let opts = SquashfsOptions {
            block_size: 4096,
            ..SquashfsOptions::default()
        };
        let mut out = Cursor::new(Vec::new());
        let cache = cache.map(|c| c as &dyn BlockCache);
        crate::build(root, &mut out, &opts, cache, &mut |_, _| {}).unwrap();
        out.into_inner()
    }

    /// A cached build writes the image an uncached one writes; after one file changed, only
    /// the blocks its bytes reach are compressed again.
    #[test]
    fn cached_frames_give_the_same_image() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let text = |seed: usize, n: usize| -> Vec<u8> {
            (0..n)
                .map(|i| (((i / 7) * 31 + seed) % 251) as u8)
                .collect()
        };
        for i in 0..6 {
            std::fs::write(root.join(format!("big{i}")), text(i, 5 * 4096 + 100 * i)).unwrap();
            std::fs::write(root.join(format!("small{i}")), text(i + 9, 700)).unwrap();
        }
        let cache = Memory::default();
        let clean = image(root, None);
        assert_eq!(image(root, Some(&cache)), clean);
        let first = *cache.1.lock().unwrap();
        assert_eq!(first.0, 0, "an empty cache has no hits");
        assert_eq!(image(root, Some(&cache)), clean);
        let second = *cache.1.lock().unwrap();
        assert_eq!(second.1, first.1, "nothing compressed again: {second:?}");
        assert_eq!(second.0, first.1);

        std::fs::write(root.join("big3"), text(99, 5 * 4096 + 300)).unwrap();
        let changed = image(root, Some(&cache));
        assert_eq!(changed, image(root, None));
        let third = *cache.1.lock().unwrap();
        // big3's blocks (and the fragment holding its tail and the small files') only.
        let recompressed = third.1 - second.1;
        assert!(
            (1..=7).contains(&recompressed),
            "{third:?} after {second:?}"
        );
    }
}
