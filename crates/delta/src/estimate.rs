//! The size of an upgrade up front: from the target bundle's chunk index and the indexes of
//! what a node holds, how many bytes and chunks it would fetch and how many it would reuse,
//! by digest alone (before any local byte is read; assembly re-hashes what it reuses, so the
//! real figure can only be larger when local bytes have rotted).

use std::collections::HashSet;

use crate::index::ChunkIndex;
use crate::Sha256;

/// One blob of the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobEstimate {
    /// `sha256:<hex>`.
    pub blob: String,
    pub size: u64,
    pub fetch_bytes: u64,
    pub fetch_chunks: usize,
    pub reuse_bytes: u64,
    pub reuse_chunks: usize,
}

/// Every blob of the target's index, and the index itself (which a node fetches too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    pub blobs: Vec<BlobEstimate>,
    pub index_bytes: u64,
}

impl Estimate {
    /// Bytes to fetch: the chunks and the index.
    pub fn fetch_bytes(&self) -> u64 {
        self.index_bytes + self.blobs.iter().map(|b| b.fetch_bytes).sum::<u64>()
    }

    pub fn fetch_chunks(&self) -> usize {
        self.blobs.iter().map(|b| b.fetch_chunks).sum()
    }

    /// What a whole download of the same blobs costs.
    pub fn full_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| b.size).sum()
    }

    pub fn reuse_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| b.reuse_bytes).sum()
    }
}

/// What fetching `target`'s blobs costs a node that holds the blobs `held` list. A chunk
/// listed twice is fetched once.
pub fn estimate(target: &ChunkIndex, held: &[&ChunkIndex]) -> Estimate {
    let have: HashSet<Sha256> = held
        .iter()
        .flat_map(|i| i.blobs.iter())
        .flat_map(|b| b.chunks.iter().map(|c| c.digest))
        .collect();
    let mut fetched: HashSet<Sha256> = HashSet::new();
    let blobs = target
        .blobs
        .iter()
        .map(|blob| {
            let mut e = BlobEstimate {
                blob: blob.oci_digest(),
                size: blob.size,
                fetch_bytes: 0,
                fetch_chunks: 0,
                reuse_bytes: 0,
                reuse_chunks: 0,
            };
            for chunk in &blob.chunks {
                if have.contains(&chunk.digest) {
                    e.reuse_bytes += u64::from(chunk.length);
                    e.reuse_chunks += 1;
                } else if fetched.insert(chunk.digest) {
                    e.fetch_bytes += u64::from(chunk.length);
                    e.fetch_chunks += 1;
                } else {
                    // Fetched for an earlier chunk of the target: reused from the cache.
                    e.reuse_bytes += u64::from(chunk.length);
                    e.reuse_chunks += 1;
                }
            }
            e
        })
        .collect();
    Estimate {
        blobs,
        index_bytes: target.to_bytes().len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk_blob;
    use crate::test_data::{noise, SMALL as P};

    #[test]
    fn an_unchanged_blob_costs_nothing_and_a_new_one_costs_itself() {
        let (kept, old, new) = (noise(100_000, 10), noise(100_000, 20), noise(50_000, 30));
        let held = ChunkIndex {
            params: P,
            blobs: vec![chunk_blob(&kept, P), chunk_blob(&old, P)],
        };
        let target = ChunkIndex {
            params: P,
            blobs: vec![chunk_blob(&kept, P), chunk_blob(&new, P)],
        };
        let e = estimate(&target, &[&held]);
        assert_eq!(
            (e.blobs[0].fetch_bytes, e.blobs[0].reuse_bytes),
            (0, 100_000)
        );
        assert_eq!(
            (e.blobs[1].fetch_bytes, e.blobs[1].reuse_bytes),
            (50_000, 0)
        );
        assert_eq!(e.blobs[1].fetch_chunks, target.blobs[1].chunks.len());
        assert_eq!(e.index_bytes, target.to_bytes().len() as u64);
        assert_eq!(e.fetch_bytes(), 50_000 + e.index_bytes);
        assert_eq!((e.full_bytes(), e.reuse_bytes()), (150_000, 100_000));
        // With nothing held, everything is fetched once, even a blob listed in two roles.
        let twice = ChunkIndex {
            params: P,
            blobs: vec![chunk_blob(&new, P), {
                let mut b = chunk_blob(&new, P);
                b.digest[0] ^= 1;
                b
            }],
        };
        let e = estimate(&twice, &[]);
        assert_eq!(
            (e.blobs[0].fetch_bytes, e.blobs[1].fetch_bytes),
            (50_000, 0)
        );
        assert_eq!(e.blobs[1].reuse_bytes, 50_000);
    }
}
