//! The chunk index (docs/formats.md §7.7): for each large blob of a bundle, its digest, its
//! size and its chunks (offset, length, digest), in a fixed little-endian byte layout. It is a
//! layer of the bundle's image manifest, so the signature over that manifest covers it.
//!
//! ```text
//! magic "SLCHUNK1" · u32 min · u32 avg · u32 max · u32 blob count
//! per blob: [32] sha256 · u64 size · u32 chunk count
//!           per chunk: u64 offset · u32 length · [32] sha256
//! ```
//!
//! Parsing refuses anything but one spelling: chunks must tile the blob exactly (no gap, no
//! overlap, lengths summing to the size), no length above `max`, no trailing bytes, no blob
//! listed twice. Counts are checked against the bytes left before anything is allocated, so
//! memory stays within a small multiple of the input (capped at [`MAX_INDEX_BYTES`]).

use crate::Sha256;

/// FastCDC's three sizes. Every chunk but a blob's last is at least `min` and at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

/// What slate writes: 32 KiB on average, a quarter and four times that as the bounds (casync's
/// ratios). Measured on the demo bundle (UKI and installer, 33.8 MB; docs/formats.md §7.7),
/// fetched chunks + the index a node fetches too, version-only / +1 MiB in the root: 8 KiB
/// 208 / 1297 KB, 16 KiB 220 / 1281 KB, 32 KiB 290 / 1362 KB, 64 KiB 402 / 1483 KB. The index
/// grows with the bundle (44 bytes a chunk) and the changed chunks do not, so on a bundle of a
/// few hundred MB 16 KiB's index alone outweighs 32 KiB's index and chunks together.
pub const DEFAULT_PARAMS: ChunkParams = ChunkParams {
    min: 8 << 10,
    avg: 32 << 10,
    max: 128 << 10,
};

impl ChunkParams {
    /// Whether FastCDC takes these sizes (it asserts on others): min 64 B – 1 MiB, avg 256 B –
    /// 4 MiB, max 1 KiB – 16 MiB, min ≤ avg ≤ max, all even (v2020 scans byte pairs from half
    /// of each: an odd size cuts a byte off where the size says).
    pub fn valid(&self) -> bool {
        use fastcdc::v2020::{
            AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MAXIMUM_MIN, MINIMUM_MAX, MINIMUM_MIN,
        };
        let (min, avg, max) = (self.min as usize, self.avg as usize, self.max as usize);
        (MINIMUM_MIN..=MINIMUM_MAX).contains(&min)
            && (AVERAGE_MIN..=AVERAGE_MAX).contains(&avg)
            && (MAXIMUM_MIN..=MAXIMUM_MAX).contains(&max)
            && min <= avg
            && avg <= max
            && [min, avg, max].iter().all(|n| n % 2 == 0)
    }
}

/// The layer's media type in the image manifest.
pub const CHUNK_INDEX_MEDIA_TYPE: &str = "application/vnd.slate.chunk-index.v1";
pub const MAGIC: &[u8; 8] = b"SLCHUNK1";
/// Larger indexes are refused unread: 16 MiB lists ~380 000 chunks, 12 GiB of blobs at 32 KiB.
pub const MAX_INDEX_BYTES: u64 = 16 << 20;
/// A bundle carries a handful of blobs.
pub const MAX_BLOBS: u32 = 16;
const HEADER: usize = 8 + 4 * 4;
const BLOB_HEADER: usize = 32 + 8 + 4;
const CHUNK_BYTES: usize = 8 + 4 + 32;

/// One chunk of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    pub offset: u64,
    pub length: u32,
    pub digest: Sha256,
}

/// A blob and its chunks, which tile it in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobChunks {
    pub digest: Sha256,
    pub size: u64,
    pub chunks: Vec<Chunk>,
}

impl BlobChunks {
    /// `sha256:<hex>` of the whole blob, as OCI descriptors spell it.
    pub fn oci_digest(&self) -> String {
        format!("sha256:{}", hex::encode(self.digest))
    }
}

/// The chunk index of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkIndex {
    pub params: ChunkParams,
    pub blobs: Vec<BlobChunks>,
}

/// Why an index was refused; each names where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("the chunk index is {0} bytes, more than {MAX_INDEX_BYTES}")]
    TooLarge(u64),
    #[error("the chunk index does not start with {:?}", std::str::from_utf8(MAGIC).unwrap_or(""))]
    BadMagic,
    #[error("the chunk index ends inside {0}")]
    Truncated(String),
    #[error("the chunk index's chunk sizes {0:?} are not ones FastCDC takes")]
    BadParams(ChunkParams),
    #[error("the chunk index lists {0} blobs (1 to {MAX_BLOBS})")]
    BlobCount(u32),
    #[error("the chunk index lists blob {0} twice")]
    DuplicateBlob(String),
    #[error("blob {blob}: {count} chunks cannot fit in the {left} bytes that remain")]
    ChunkCount {
        blob: String,
        count: u32,
        left: usize,
    },
    #[error("blob {blob}, chunk {chunk}: it starts at {offset}, the previous chunk ended at {expected} ({})", if offset < expected { "overlap" } else { "gap" })]
    NotContiguous {
        blob: String,
        chunk: u32,
        offset: u64,
        expected: u64,
    },
    #[error("blob {blob}, chunk {chunk}: length {length} is not from 1 to the maximum {max}")]
    BadLength {
        blob: String,
        chunk: u32,
        length: u32,
        max: u32,
    },
    #[error("blob {blob}: its chunks cover {covered} bytes, the blob is {size}")]
    SizeMismatch {
        blob: String,
        covered: u64,
        size: u64,
    },
    #[error("the chunk index has {0} bytes after its last blob")]
    Trailing(usize),
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], IndexError> {
        if self.bytes.len() - self.at < n {
            return Err(IndexError::Truncated(what()));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, IndexError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, IndexError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
    fn digest(&mut self, what: &dyn Fn() -> String) -> Result<Sha256, IndexError> {
        Ok(self.take(32, what)?.try_into().expect("32 bytes"))
    }
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
}

impl ChunkIndex {
    /// The index's bytes (one spelling: [`ChunkIndex::parse`] of them gives `self` back).
    pub fn to_bytes(&self) -> Vec<u8> {
        let chunks: usize = self.blobs.iter().map(|b| b.chunks.len()).sum();
        let mut out =
            Vec::with_capacity(HEADER + self.blobs.len() * BLOB_HEADER + chunks * CHUNK_BYTES);
        out.extend_from_slice(MAGIC);
        for n in [
            self.params.min,
            self.params.avg,
            self.params.max,
            self.blobs.len() as u32,
        ] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for blob in &self.blobs {
            out.extend_from_slice(&blob.digest);
            out.extend_from_slice(&blob.size.to_le_bytes());
            out.extend_from_slice(&(blob.chunks.len() as u32).to_le_bytes());
            for chunk in &blob.chunks {
                out.extend_from_slice(&chunk.offset.to_le_bytes());
                out.extend_from_slice(&chunk.length.to_le_bytes());
                out.extend_from_slice(&chunk.digest);
            }
        }
        out
    }

    /// Parse and check an index (see the module's rules).
    pub fn parse(bytes: &[u8]) -> Result<ChunkIndex, IndexError> {
        if bytes.len() as u64 > MAX_INDEX_BYTES {
            return Err(IndexError::TooLarge(bytes.len() as u64));
        }
        let mut r = Reader { bytes, at: 0 };
        if r.take(8, &|| "the magic".into())? != MAGIC {
            return Err(IndexError::BadMagic);
        }
        let header = || "the header".to_owned();
        let params = ChunkParams {
            min: r.u32(&header)?,
            avg: r.u32(&header)?,
            max: r.u32(&header)?,
        };
        if !params.valid() {
            return Err(IndexError::BadParams(params));
        }
        let count = r.u32(&header)?;
        if count == 0 || count > MAX_BLOBS {
            return Err(IndexError::BlobCount(count));
        }
        let mut blobs: Vec<BlobChunks> = Vec::with_capacity(count as usize);
        for b in 0..count {
            let at = || format!("blob {b}'s header");
            let digest = r.digest(&at)?;
            let size = r.u64(&at)?;
            let n = r.u32(&at)?;
            let name = format!("sha256:{}", hex::encode(digest));
            if blobs.iter().any(|other| other.digest == digest) {
                return Err(IndexError::DuplicateBlob(name));
            }
            if n as usize > r.left() / CHUNK_BYTES {
                return Err(IndexError::ChunkCount {
                    blob: name,
                    count: n,
                    left: r.left(),
                });
            }
            let mut chunks = Vec::with_capacity(n as usize);
            let mut end = 0u64;
            for c in 0..n {
                let at = || format!("blob {b}, chunk {c}");
                let chunk = Chunk {
                    offset: r.u64(&at)?,
                    length: r.u32(&at)?,
                    digest: r.digest(&at)?,
                };
                if chunk.offset != end {
                    return Err(IndexError::NotContiguous {
                        blob: name,
                        chunk: c,
                        offset: chunk.offset,
                        expected: end,
                    });
                }
                if chunk.length == 0 || chunk.length > params.max {
                    return Err(IndexError::BadLength {
                        blob: name,
                        chunk: c,
                        length: chunk.length,
                        max: params.max,
                    });
                }
                end += u64::from(chunk.length);
                if end > size {
                    return Err(IndexError::SizeMismatch {
                        blob: name,
                        covered: end,
                        size,
                    });
                }
                chunks.push(chunk);
            }
            if end != size {
                return Err(IndexError::SizeMismatch {
                    blob: name,
                    covered: end,
                    size,
                });
            }
            blobs.push(BlobChunks {
                digest,
                size,
                chunks,
            });
        }
        if r.left() != 0 {
            return Err(IndexError::Trailing(r.left()));
        }
        Ok(ChunkIndex { params, blobs })
    }

    /// The chunks of the blob whose digest is `oci_digest` (`sha256:<hex>`).
    pub fn blob(&self, oci_digest: &str) -> Option<&BlobChunks> {
        self.blobs.iter().find(|b| b.oci_digest() == oci_digest)
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
