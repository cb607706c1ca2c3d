//! What the crate's unit tests chunk: small chunk sizes (a few dozen chunks in a few hundred
//! KB) and deterministic bytes that do not compress.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::assemble::{ChunkCache, ReadAt};
use crate::{ChunkParams, Sha256};

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

/// A held blob (a seed) in memory.
pub(crate) struct File(pub(crate) Vec<u8>);

impl ReadAt for File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let start = offset as usize;
        let bytes = self
            .0
            .get(start..start + buf.len())
            .ok_or_else(|| std::io::Error::other("short read"))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// The node's chunk cache in memory.
#[derive(Default)]
pub(crate) struct Cache(Mutex<HashMap<Sha256, Vec<u8>>>);

impl ChunkCache for Cache {
    fn get(&self, digest: &Sha256) -> std::io::Result<Option<Vec<u8>>> {
        Ok(self.0.lock().unwrap().get(digest).cloned())
    }
    fn put(&self, digest: &Sha256, bytes: &[u8]) -> std::io::Result<()> {
        self.0.lock().unwrap().insert(*digest, bytes.to_vec());
        Ok(())
    }
}
