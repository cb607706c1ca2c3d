//! Delta updates (issue 41): a bundle's large blobs cut into content-defined chunks, the chunk
//! index that lists them (docs/formats.md §7.7), and assembling a blob from chunks a node
//! already holds plus those it must fetch.
//!
//! Pure: no file, network or clock. Where bytes come from (the running UKI on the ESP, a chunk
//! cache, a registry) is the caller's, behind the traits of [`assemble`]; the index travels
//! inside the bundle as one more layer that the signed image manifest names by digest
//! (`slate-bundle` reads it), so every chunk digest used here is a signed one.

pub mod assemble;
mod chunker;
mod estimate;
mod index;
pub mod zchunks;

pub use assemble::{
    assemble, plan, AssembleError, Assembled, ChunkCache, Plan, ReadAt, Refused, Remote, Seed,
    Source,
};
#[cfg(test)]
mod test_data;

pub use chunker::{chunk_blob, section_edges};
pub use estimate::{estimate, BlobEstimate, Estimate};
pub use index::{
    BlobChunks, Chunk, ChunkIndex, ChunkParams, IndexError, CHUNK_INDEX_MEDIA_TYPE, DEFAULT_PARAMS,
    MAGIC, MAX_BLOBS, MAX_INDEX_BYTES,
};
pub use zchunks::{KnownFrames, ZChunks, ZRemote, ZTable, ZTableError};

/// A SHA-256 digest, raw.
pub type Sha256 = [u8; 32];

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> Sha256 {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}
