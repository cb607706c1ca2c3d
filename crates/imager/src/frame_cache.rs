//! The compressed chunks' frames (formats.md §7.8) in the build cache: each indexed blob's
//! frames kept under a key of everything a frame depends on — the blob's digest, the chunk
//! sizes, the zstd level and zstd's version — so a rebuild compresses only the chunks of the
//! blobs that changed (the installer binary, compressed again on every build, was most of a
//! cached rebuild's time). An entry lists the blob's chunks in order: each its SHA-256, then
//! its frame's length (u32 LE; `u32::MAX` for a chunk that stays raw) and the frame.
//!
//! What is taken from an entry changes how long the build takes, not what it writes: a
//! frame is used only for a chunk of that digest, and the cache refuses an entry whose bytes
//! do not match the digest it was stored with.

use std::collections::HashMap;
use std::path::Path;

use sha2::{Digest as _, Sha256};
use slate_bundle::Bundle;
use slate_delta::{ChunkParams, KnownFrames};

use crate::{Stage, StageCache};

/// A blob whose frames the cache does not hold: its SHA-256, and the key to keep them under.
pub(crate) struct Missing {
    blob: [u8; 32],
    key: [u8; 32],
}

/// The key of the frames of the blob whose SHA-256 is `blob`.
pub(crate) fn key(blob: &[u8; 32], params: ChunkParams, level: i32) -> [u8; 32] {
    key_for(zstd::zstd_safe::version_number(), blob, params, level)
}

fn key_for(zstd_version: u32, blob: &[u8; 32], params: ChunkParams, level: i32) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"slate-imager chunk frames v1\0");
    h.update(blob);
    for n in [params.min, params.avg, params.max] {
        h.update(n.to_le_bytes());
    }
    h.update(level.to_le_bytes());
    h.update(zstd_version.to_le_bytes());
    h.finalize().into()
}

/// The frames the cache holds for `blobs` (their SHA-256s), and the keys it does not hold.
pub(crate) fn load(
    cache: &StageCache,
    blobs: &[[u8; 32]],
    params: ChunkParams,
    level: i32,
) -> (KnownFrames, Vec<Missing>) {
    let mut known = KnownFrames::new();
    let mut missing = Vec::new();
    for blob in blobs {
        let key = key(blob, params, level);
        match cache
            .get(Stage::ChunkFrames, &key)
            .and_then(|p| slate_delta::zchunks::parse_kept_frames(&p))
        {
            Some(frames) => known.extend(frames),
            None => missing.push(Missing { blob: *blob, key }),
        }
    }
    (known, missing)
}

/// Keep the frames of the `missing` blobs, as the bundle just written at `dir` holds them. A
/// bundle without an index or table, or a blob it does not index, keeps nothing.
pub(crate) fn store(cache: &StageCache, dir: &Path, missing: &[Missing]) {
    let Some(frames) = written_frames(dir) else {
        return;
    };
    let (index, by_digest) = frames;
    for Missing { blob, key } in missing {
        let Some(listed) = index.blobs.iter().find(|b| &b.digest == blob) else {
            continue;
        };
        let frames: Option<Vec<_>> = listed
            .chunks
            .iter()
            .map(|c| Some((c.digest, by_digest.get(&c.digest)?.as_deref())))
            .collect();
        let Some(frames) = frames else {
            return;
        };
        let payload = slate_delta::zchunks::kept_frames_to_bytes(&frames);
        cache.put(Stage::ChunkFrames, key, &payload);
    }
}

type Written = (slate_delta::ChunkIndex, HashMap<[u8; 32], Option<Vec<u8>>>);

fn written_frames(dir: &Path) -> Option<Written> {
    let bundle = Bundle::open(dir, None).ok()?;
    let index = bundle.chunk_index().ok()??;
    let (table, chunks) = bundle.zchunk_table().ok()??;
    let hex = chunks.blob.strip_prefix("sha256:")?;
    let compressed = std::fs::read(dir.join("blobs/sha256").join(hex)).ok()?;
    let frames = slate_delta::zchunks::frames(&index, &table, &compressed)?
        .into_iter()
        .map(|(digest, frame)| (digest, frame.map(<[u8]>::to_vec)))
        .collect();
    Some((index, frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/formats.md §6.7's vector: the blob `abc`, 8/32/128 KiB chunks, level 9, zstd
    /// 1.5.5 (10505).
    #[test]
    fn the_documented_vector() {
        let blob: [u8; 32] = Sha256::digest(b"abc").into();
        assert_eq!(
            hex::encode(key_for(10505, &blob, slate_delta::DEFAULT_PARAMS, 9)),
            "cf67ca3d1cf43e8bb41da0c884f8c08f9b837b2683278d58252adb616a83f316"
        );
    }

    #[test]
    fn the_key_covers_blob_sizes_and_level() {
        let p = slate_delta::DEFAULT_PARAMS;
        let base = key(&[7; 32], p, 9);
        assert_ne!(base, key(&[8; 32], p, 9));
        assert_ne!(base, key(&[7; 32], p, 10));
        let q = ChunkParams {
            avg: p.avg * 2,
            ..p
        };
        assert_ne!(base, key(&[7; 32], q, 9));
        assert_eq!(base, key(&[7; 32], p, 9));
    }
}
