//! Chunks that travel compressed (docs/formats.md §7.8): each distinct chunk of a bundle's
//! chunk index zstd-compressed on its own, the frames of those that came out shorter
//! concatenated into one blob, and a table — signed with the image manifest like the index —
//! saying per chunk whether it travels compressed and, if so, its frame's length and SHA-256.
//! A chunk compression does not shorten (the squashfs' blocks, the compressed kernel) is not
//! stored twice: it is fetched as before, a range of the raw blob.
//!
//! ```text
//! magic "SLZCHNK1" · [32] sha256 of the SLCHUNK1 index · [32] sha256 of the blob · u64 size
//! · u32 count · per chunk: u8 0 (raw) | u8 1 (zstd) · u32 length · [32] sha256
//! ```
//!
//! A frame's offset in the blob is the sum of the lengths of the frames before it: they tile
//! the blob in order, so there is no offset to get wrong (no overlap, no gap, nothing outside
//! the blob) and 8 bytes a chunk fewer to fetch. Entries follow the index's distinct chunk
//! digests in order of first appearance, so the table names no raw digest of its own: it is
//! bound to the one index whose digest it carries.
//!
//! A node checks a fetched frame's length and digest before zstd sees a byte, then
//! decompresses it into at most the chunk's raw length (longer output is refused, a bomb
//! costs nothing), and the assembler checks the raw digest as for any chunk.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::index::{Chunk, ChunkIndex};
use crate::{assemble::Remote, sha256, Sha256};

pub const ZMAGIC: &[u8; 8] = b"SLZCHNK1";
/// The table's layer in the image manifest (signed with it; a few tens of KB).
pub const ZTABLE_MEDIA_TYPE: &str = "application/vnd.slate.chunk-zstd-table.v1";
/// The compressed chunks' blob: not a layer of the image manifest (older slate would fetch it
/// whole), a layer of its own manifest, tagged `sha256-<manifest hex>.zchunks`.
pub const ZBLOB_MEDIA_TYPE: &str = "application/vnd.slate.chunks.zstd.v1";
/// Larger tables are refused unread (as [`crate::MAX_INDEX_BYTES`]).
pub const MAX_ZTABLE_BYTES: u64 = 16 << 20;
/// No chunk is longer than FastCDC's largest max.
pub const MAX_ZCHUNK: u32 = 16 << 20;
/// The level the imager compresses at: bench-delta's measurement, docs/formats.md §7.8.
pub const LEVEL: i32 = 9;
const HEADER: usize = 8 + 32 + 32 + 8 + 4;
/// A zstd entry; a raw one is its first byte alone.
const ZSTD_ENTRY: usize = 1 + 4 + 32;

/// How a chunk travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZChunk {
    /// As a range of the raw blob: compression did not make it shorter.
    Raw,
    /// As one zstd frame (no checksum, no dictionary) in the compressed blob.
    Zstd {
        /// Not in the bytes: the sum of the lengths of the frames before it.
        offset: u64,
        length: u32,
        /// SHA-256 of the frame.
        digest: Sha256,
    },
}

impl ZChunk {
    /// Bytes on the wire for a chunk of `raw_length`.
    pub fn wire_bytes(&self, raw_length: u32) -> u64 {
        match self {
            ZChunk::Raw => u64::from(raw_length),
            ZChunk::Zstd { length, .. } => u64::from(*length),
        }
    }
}

/// The table of a bundle's compressed chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZTable {
    /// SHA-256 of the chunk index (its SLCHUNK1 bytes) the entries follow.
    pub index: Sha256,
    /// The compressed blob.
    pub blob: Sha256,
    pub blob_size: u64,
    pub chunks: Vec<ZChunk>,
}

/// Why a table was refused; each names where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZTableError {
    #[error("the compressed chunk table is {0} bytes, more than {MAX_ZTABLE_BYTES}")]
    TooLarge(u64),
    #[error("the compressed chunk table does not start with \"SLZCHNK1\"")]
    BadMagic,
    #[error("the compressed chunk table ends inside {0}")]
    Truncated(String),
    #[error("the compressed chunk table lists {count} chunks, {left} bytes cannot hold them")]
    Count { count: u32, left: usize },
    #[error("chunk {chunk}: coding {coding} is neither 0 (raw) nor 1 (zstd)")]
    BadCoding { chunk: u32, coding: u8 },
    #[error("compressed chunk {chunk}: length {length} is not from 1 to {MAX_ZCHUNK}")]
    BadLength { chunk: u32, length: u32 },
    #[error("the frames cover {covered} bytes, the compressed blob is {size}")]
    SizeMismatch { covered: u64, size: u64 },
    #[error("the compressed chunk table has {0} bytes after its last chunk")]
    Trailing(usize),
    #[error("the compressed chunk table belongs to index sha256:{table}, not sha256:{index}")]
    OtherIndex { table: String, index: String },
    #[error("the compressed chunk table lists {table} chunks, the index {index} distinct ones")]
    CountMismatch { table: usize, index: usize },
    #[error("compressed chunk {chunk} (of sha256:{raw}): {why}")]
    Mismatch {
        chunk: usize,
        raw: String,
        why: &'static str,
    },
}

fn take<'a>(
    bytes: &'a [u8],
    at: &mut usize,
    n: usize,
    what: &dyn Fn() -> String,
) -> Result<&'a [u8], ZTableError> {
    if bytes.len() - *at < n {
        return Err(ZTableError::Truncated(what()));
    }
    *at += n;
    Ok(&bytes[*at - n..*at])
}

impl ZTable {
    /// The table's bytes (one spelling: [`ZTable::parse`] of them gives `self` back).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.chunks.len() * ZSTD_ENTRY);
        out.extend_from_slice(ZMAGIC);
        out.extend_from_slice(&self.index);
        out.extend_from_slice(&self.blob);
        out.extend_from_slice(&self.blob_size.to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        for c in &self.chunks {
            match c {
                ZChunk::Raw => out.push(0),
                ZChunk::Zstd { length, digest, .. } => {
                    out.push(1);
                    out.extend_from_slice(&length.to_le_bytes());
                    out.extend_from_slice(digest);
                }
            }
        }
        out
    }

    /// Parse a table on its own: the layout, lengths from 1 to [`MAX_ZCHUNK`] tiling exactly
    /// the blob's size, nothing after. The count is checked against the bytes left before
    /// anything is allocated. [`ZTable::check`] then binds it to its index.
    pub fn parse(bytes: &[u8]) -> Result<ZTable, ZTableError> {
        if bytes.len() as u64 > MAX_ZTABLE_BYTES {
            return Err(ZTableError::TooLarge(bytes.len() as u64));
        }
        let at = &mut 0;
        if take(bytes, at, 8, &|| "the magic".into())? != ZMAGIC {
            return Err(ZTableError::BadMagic);
        }
        let header = || "the header".to_owned();
        let index: Sha256 = take(bytes, at, 32, &header)?.try_into().expect("32");
        let blob: Sha256 = take(bytes, at, 32, &header)?.try_into().expect("32");
        let blob_size = u64::from_le_bytes(take(bytes, at, 8, &header)?.try_into().expect("8"));
        let count = u32::from_le_bytes(take(bytes, at, 4, &header)?.try_into().expect("4"));
        let left = bytes.len() - *at;
        // Every entry takes at least its coding byte.
        if count as usize > left {
            return Err(ZTableError::Count { count, left });
        }
        let mut chunks = Vec::with_capacity(count as usize);
        let mut offset = 0u64;
        for chunk in 0..count {
            let what = || format!("chunk {chunk}'s entry");
            match take(bytes, at, 1, &what)?[0] {
                0 => chunks.push(ZChunk::Raw),
                1 => {
                    let entry = take(bytes, at, ZSTD_ENTRY - 1, &what)?;
                    let length = u32::from_le_bytes(entry[..4].try_into().expect("4"));
                    if length == 0 || length > MAX_ZCHUNK {
                        return Err(ZTableError::BadLength { chunk, length });
                    }
                    chunks.push(ZChunk::Zstd {
                        offset,
                        length,
                        digest: entry[4..].try_into().expect("32"),
                    });
                    offset += u64::from(length);
                    if offset > blob_size {
                        return Err(ZTableError::SizeMismatch {
                            covered: offset,
                            size: blob_size,
                        });
                    }
                }
                coding => return Err(ZTableError::BadCoding { chunk, coding }),
            }
        }
        if offset != blob_size {
            return Err(ZTableError::SizeMismatch {
                covered: offset,
                size: blob_size,
            });
        }
        if *at != bytes.len() {
            return Err(ZTableError::Trailing(bytes.len() - *at));
        }
        Ok(ZTable {
            index,
            blob,
            blob_size,
            chunks,
        })
    }

    /// The table bound to `index`: its digest must be the one the table names, one entry per
    /// distinct chunk, a frame shorter than its chunk. The result finds how a raw digest
    /// travels.
    pub fn check(&self, index: &ChunkIndex) -> Result<ZChunks, ZTableError> {
        let digest = sha256(&index.to_bytes());
        if digest != self.index {
            return Err(ZTableError::OtherIndex {
                table: hex::encode(self.index),
                index: hex::encode(digest),
            });
        }
        let distinct = distinct_chunks(index);
        if distinct.len() != self.chunks.len() {
            return Err(ZTableError::CountMismatch {
                table: self.chunks.len(),
                index: distinct.len(),
            });
        }
        let mut by_raw = HashMap::with_capacity(distinct.len());
        for (i, (raw, z)) in distinct.iter().zip(&self.chunks).enumerate() {
            if let ZChunk::Zstd { length, .. } = z {
                if *length >= raw.length {
                    return Err(ZTableError::Mismatch {
                        chunk: i,
                        raw: hex::encode(raw.digest),
                        why: "compressed, but not shorter",
                    });
                }
            }
            by_raw.insert(raw.digest, *z);
        }
        Ok(ZChunks {
            blob: format!("sha256:{}", hex::encode(self.blob)),
            by_raw,
        })
    }
}

/// A checked table: where each raw chunk digest of its index is stored compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZChunks {
    /// The compressed blob, `sha256:<hex>`.
    pub blob: String,
    pub by_raw: HashMap<Sha256, ZChunk>,
}

/// The index's chunks, each digest once, in order of first appearance: the table's order.
pub fn distinct_chunks(index: &ChunkIndex) -> Vec<Chunk> {
    let mut seen = HashSet::new();
    index
        .blobs
        .iter()
        .flat_map(|b| b.chunks.iter())
        .filter(|c| seen.insert(c.digest))
        .copied()
        .collect()
}

/// Compress each distinct chunk of `index` (whose blobs are `blobs`, in its order) on its
/// own at `level`, without checksum or dictionary: a frame depends on its chunk and the level
/// alone, so the chunks are spread over the cores and the output is the same however they
/// ran. A chunk compression does not shorten stays raw (not in the blob). The table and the
/// compressed blob.
pub fn compress(
    index: &ChunkIndex,
    blobs: &[&[u8]],
    level: i32,
) -> std::io::Result<(ZTable, Vec<u8>)> {
    compress_reusing(index, blobs, level, &HashMap::new())
}

/// Frames kept from an earlier compression at the same level by the same zstd, by chunk
/// digest (`None`: the chunk stayed raw): a build cache's (`slate imager build --cache`).
pub type KnownFrames = HashMap<Sha256, Option<Vec<u8>>>;

/// [`compress`], taking a chunk's frame from `known` instead of compressing it again. A frame
/// depends on its chunk, the level and zstd alone, so the output is the same as without
/// `known` when the caller keys what it kept by those.
pub fn compress_reusing(
    index: &ChunkIndex,
    blobs: &[&[u8]],
    level: i32,
    known: &KnownFrames,
) -> std::io::Result<(ZTable, Vec<u8>)> {
    let mut raw_of: HashMap<Sha256, &[u8]> = HashMap::new();
    for (blob, bytes) in index.blobs.iter().zip(blobs) {
        if bytes.len() as u64 != blob.size {
            return Err(std::io::Error::other(format!(
                "blob {} is {} bytes, its index says {}",
                blob.oci_digest(),
                bytes.len(),
                blob.size
            )));
        }
        for c in &blob.chunks {
            let start = c.offset as usize;
            raw_of.insert(c.digest, &bytes[start..start + c.length as usize]);
        }
    }
    let distinct = distinct_chunks(index);
    let next = AtomicUsize::new(0);
    let frames: Mutex<Vec<Option<std::io::Result<Vec<u8>>>>> =
        Mutex::new(distinct.iter().map(|_| None).collect());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads.min(distinct.len()).max(1) {
            s.spawn(|| {
                let mut z = match compressor(level) {
                    Ok(z) => z,
                    Err(e) => {
                        frames.lock().expect("no panics hold it")[0] = Some(Err(e));
                        return;
                    }
                };
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(chunk) = distinct.get(i) else {
                        return;
                    };
                    let raw = raw_of[&chunk.digest];
                    let frame = match known.get(&chunk.digest) {
                        Some(Some(frame)) => Ok(frame.clone()),
                        // Not shorter than the chunk: stays raw below, as it did.
                        Some(None) => Ok(raw.to_vec()),
                        None => z.compress(raw),
                    };
                    let failed = frame.is_err();
                    frames.lock().expect("no panics hold it")[i] = Some(frame);
                    if failed {
                        return;
                    }
                }
            });
        }
    });
    let mut out = Vec::new();
    let mut chunks = Vec::with_capacity(distinct.len());
    for (chunk, frame) in distinct
        .iter()
        .zip(frames.into_inner().expect("no panics hold it"))
    {
        let frame =
            frame.unwrap_or_else(|| Err(std::io::Error::other("a chunk not compressed")))?;
        if frame.len() < chunk.length as usize {
            chunks.push(ZChunk::Zstd {
                offset: out.len() as u64,
                length: frame.len() as u32,
                digest: sha256(&frame),
            });
            out.extend_from_slice(&frame);
        } else {
            chunks.push(ZChunk::Raw);
        }
    }
    Ok((
        ZTable {
            index: sha256(&index.to_bytes()),
            blob: sha256(&out),
            blob_size: out.len() as u64,
            chunks,
        },
        out,
    ))
}

/// A chunk's digest and its frame (`None`: it stays raw).
pub type ChunkFrame<'a> = (Sha256, Option<&'a [u8]>);

/// Each distinct chunk of `index` with its frame in `compressed` (`None`: raw), as `table`
/// says: what a build cache keeps for [`compress_reusing`]. `None` when the table does not
/// describe `compressed` (another blob, or cut short).
pub fn frames<'a>(
    index: &ChunkIndex,
    table: &ZTable,
    compressed: &'a [u8],
) -> Option<Vec<ChunkFrame<'a>>> {
    let distinct = distinct_chunks(index);
    if distinct.len() != table.chunks.len() || compressed.len() as u64 != table.blob_size {
        return None;
    }
    distinct
        .iter()
        .zip(&table.chunks)
        .map(|(chunk, z)| match *z {
            ZChunk::Raw => Some((chunk.digest, None)),
            ZChunk::Zstd { offset, length, .. } => {
                let start = usize::try_from(offset).ok()?;
                let frame = compressed.get(start..start.checked_add(length as usize)?)?;
                Some((chunk.digest, Some(frame)))
            }
        })
        .collect()
}

/// The frame length that marks a chunk kept raw in [`kept_frames_to_bytes`]' layout.
const KEPT_RAW: u32 = u32::MAX;

/// `frames` as a build cache keeps them (formats.md §6.7): for each chunk, its SHA-256, the
/// frame's length (u32 LE; `FFFFFFFF` for a chunk that stays raw) and the frame.
pub fn kept_frames_to_bytes(frames: &[ChunkFrame<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (digest, frame) in frames {
        out.extend_from_slice(digest);
        match frame {
            Some(frame) => {
                out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
                out.extend_from_slice(frame);
            }
            None => out.extend_from_slice(&KEPT_RAW.to_le_bytes()),
        }
    }
    out
}

/// The frames of a build cache's entry ([`kept_frames_to_bytes`]), or `None` when the bytes
/// are not that layout (cut short, a length past the end).
pub fn parse_kept_frames(bytes: &[u8]) -> Option<KnownFrames> {
    let mut out = KnownFrames::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let digest: Sha256 = rest.get(..32)?.try_into().ok()?;
        let len = u32::from_le_bytes(rest.get(32..36)?.try_into().ok()?);
        rest = &rest[36..];
        if len == KEPT_RAW {
            out.insert(digest, None);
        } else {
            let frame = rest.get(..len as usize)?;
            out.insert(digest, Some(frame.to_vec()));
            rest = &rest[len as usize..];
        }
    }
    Some(out)
}

fn compressor(level: i32) -> std::io::Result<zstd::bulk::Compressor<'static>> {
    use zstd::zstd_safe::CParameter;
    let mut z = zstd::bulk::Compressor::new(level)?;
    z.set_parameter(CParameter::ChecksumFlag(false))?;
    z.set_parameter(CParameter::ContentSizeFlag(true))?;
    z.set_parameter(CParameter::DictIdFlag(false))?;
    Ok(z)
}

/// Bytes and chunks a node holding `held` fetches for `target` when chunks travel as `z`
/// stores them (as [`crate::estimate`] decides what is fetched).
pub fn compressed_fetch(target: &ChunkIndex, held: &[&ChunkIndex], z: &ZChunks) -> (u64, usize) {
    let have: HashSet<Sha256> = held
        .iter()
        .flat_map(|i| i.blobs.iter())
        .flat_map(|b| b.chunks.iter().map(|c| c.digest))
        .collect();
    let mut fetched = HashSet::new();
    let (mut bytes, mut count) = (0, 0);
    for c in target.blobs.iter().flat_map(|b| b.chunks.iter()) {
        if !have.contains(&c.digest) && fetched.insert(c.digest) {
            bytes += z
                .by_raw
                .get(&c.digest)
                .map_or(u64::from(c.length), |z| z.wire_bytes(c.length));
            count += 1;
        }
    }
    (bytes, count)
}

/// A [`Remote`] that fetches a chunk's frame from the compressed blob through `inner` and gives
/// back its raw bytes; a chunk the table keeps raw, or every chunk without a table (a bundle
/// built before compressed chunks, or one whose compressed blob is not there), is the raw
/// range of the target blob as before.
pub struct ZRemote<'a> {
    pub table: Option<&'a ZChunks>,
    pub inner: &'a dyn Remote,
}

impl std::fmt::Debug for ZRemote<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZRemote")
            .field("blob", &self.table.map(|t| &t.blob))
            .finish()
    }
}

impl Remote for ZRemote<'_> {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        let Some(table) = self.table else {
            return self.inner.fetch(blob, chunk);
        };
        let z = table.by_raw.get(&chunk.digest).ok_or_else(|| {
            std::io::Error::other(format!(
                "the compressed chunk table does not list sha256:{}",
                hex::encode(chunk.digest)
            ))
        })?;
        let ZChunk::Zstd {
            offset,
            length,
            digest,
        } = *z
        else {
            return self.inner.fetch(blob, chunk);
        };
        let frame = Chunk {
            offset,
            length,
            digest,
        };
        let bytes = self.inner.fetch(&table.blob, &frame)?;
        let end = offset + u64::from(length);
        if bytes.len() != length as usize || sha256(&bytes) != digest {
            // Checked before zstd sees a byte: a decompressor is parser enough to attack.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "bytes {offset}..{end} of the compressed blob {} do not match their signed \
                     digest sha256:{}: refused before decompression",
                    table.blob,
                    hex::encode(digest)
                ),
            ));
        }
        inflate(&bytes, chunk.length as usize).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "bytes {offset}..{end} of the compressed blob {}: {e}",
                    table.blob
                ),
            )
        })
    }
}

/// `bytes` decompressed into exactly `length` bytes: more is refused once the cap is reached
/// (nothing beyond `length` is ever allocated), fewer too.
pub fn inflate(bytes: &[u8], length: usize) -> Result<Vec<u8>, String> {
    let out = zstd::bulk::decompress(bytes, length)
        .map_err(|e| format!("does not decompress into at most {length} bytes ({e})"))?;
    if out.len() != length {
        return Err(format!(
            "decompresses into {} bytes, its chunk is {length}",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "zchunks_tests.rs"]
mod tests;
