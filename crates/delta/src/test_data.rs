//! What the crate's unit tests chunk: small chunk sizes (a few dozen chunks in a few hundred
//! KB) and deterministic bytes that do not compress.

use crate::ChunkParams;

pub(crate) const SMALL: ChunkParams = ChunkParams {
    min: 1 << 10,
    avg: 4 << 10,
    max: 16 << 10,
};

/// `len` bytes of xorshift noise from `seed`.
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
