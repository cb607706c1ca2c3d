//! The chunk index layer (issue 41, docs/formats.md §7.7): one more layer of the image
//! manifest, of media type [`CHUNK_INDEX_MEDIA_TYPE`], listing the content-defined chunks of the
//! bundle's large blobs so a node can fetch only the chunks it lacks. The signed image manifest
//! names it by digest, so its chunk digests are as trusted as the blobs' own.
//!
//! Additive: the bundle manifest does not name it (older slate refuses unknown fields there,
//! and ignores a layer no role names), so an older slate installs such a bundle whole.

use oci_spec::image::ImageManifest;
use slate_delta::{chunk_blob, BlobChunks, ChunkIndex, ChunkParams};

use crate::blob::{self, parse_digest};
use crate::read::malformed;
use crate::{Bundle, BundleError};

pub use slate_delta::CHUNK_INDEX_MEDIA_TYPE;

/// Blobs from this size on are listed in the index slate writes: below it, a whole download
/// costs about what the index and the requests would. systemd-boot (about 100 KiB, a few
/// chunks and some 200 bytes of index) is above it: unchanged between versions, it was a third
/// of a version-only delta's download before it was listed. An issue-41 slate that holds no
/// seed for it plans nothing to reuse and downloads it whole, as before.
pub const INDEXED_MIN: u64 = 64 << 10;

/// The index of `blobs` (those of at least [`INDEXED_MIN`] bytes), or `None` when none is that
/// large.
pub fn index_of(blobs: &[&[u8]], params: ChunkParams) -> Option<ChunkIndex> {
    // Each blob on a thread of its own: hashing every chunk and the whole blob is most of an
    // index's time, and a bundle's two large blobs (the UKI and the installer) are about the
    // same size, so two cores take half of it off the build.
    let chunked: Vec<BlobChunks> = std::thread::scope(|s| {
        let threads: Vec<_> = blobs
            .iter()
            .filter(|bytes| bytes.len() as u64 >= INDEXED_MIN)
            .map(|bytes| s.spawn(move || chunk_blob(bytes, params)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("chunking does not panic on valid sizes"))
            .collect()
    });
    let mut listed: Vec<BlobChunks> = Vec::new();
    for chunks in chunked {
        if !listed.iter().any(|b| b.digest == chunks.digest) {
            listed.push(chunks);
        }
    }
    (!listed.is_empty()).then_some(ChunkIndex {
        params,
        blobs: listed,
    })
}

impl Bundle {
    /// The bundle's chunk index, read (capped, hashed against the signed manifest's digest) and
    /// checked: well formed, and every blob it lists a blob of the bundle, same digest and
    /// size. `Ok(None)`: the bundle has none (it was built before issue 41, or without one).
    pub fn chunk_index(&self) -> Result<Option<ChunkIndex>, BundleError> {
        let Some(bytes) = self.optional_layer(
            CHUNK_INDEX_MEDIA_TYPE,
            "the chunk index",
            slate_delta::MAX_INDEX_BYTES,
        )?
        else {
            return Ok(None);
        };
        let index = ChunkIndex::parse(&bytes).map_err(|e| malformed("the chunk index", e))?;
        for listed in &index.blobs {
            let digest = listed.oci_digest();
            let named = self
                .manifest()
                .blobs
                .values()
                .any(|b| b.digest == digest && b.size == listed.size);
            if !named {
                return Err(malformed(
                    "the chunk index",
                    format!(
                        "it lists {digest} ({} bytes), which is not a blob of the bundle",
                        listed.size
                    ),
                ));
            }
        }
        Ok(Some(index))
    }

    /// The bytes of the image manifest's one layer of `media_type` (`what`, in errors), read
    /// with at most `limit` bytes and checked against the signed digest. `Ok(None)`: the
    /// manifest has no such layer; two or more are refused.
    pub(crate) fn optional_layer(
        &self,
        media_type: &str,
        what: &str,
        limit: u64,
    ) -> Result<Option<Vec<u8>>, BundleError> {
        let oci: ImageManifest = serde_json::from_slice(self.manifest_bytes())
            .map_err(|e| malformed("the image manifest", e))?;
        let layers: Vec<_> = oci
            .layers()
            .iter()
            .filter(|l| l.media_type().to_string() == media_type)
            .collect();
        let layer = match layers.as_slice() {
            [] => return Ok(None),
            [one] => *one,
            _ => {
                return Err(malformed(
                    "the image manifest",
                    format!("it has {} layers of {what} (at most one)", layers.len()),
                ))
            }
        };
        let digest = parse_digest(layer.digest().as_ref())?;
        blob::read_blob(
            self.dir(),
            what,
            &digest,
            layer.size(),
            limit,
            None,
            self.verified_set(),
        )
        .map(Some)
    }
}
