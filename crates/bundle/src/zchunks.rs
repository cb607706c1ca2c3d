//! The compressed chunks of a bundle (issue 41, docs/formats.md §7.8): a table layer in the
//! signed image manifest (media type [`ZTABLE_MEDIA_TYPE`]) saying how each distinct chunk of
//! the chunk index travels, and the compressed blob it names, which is *not* a layer of that
//! manifest (an older slate would download it beside the blobs it installs) but the one layer
//! of a small unsigned manifest tagged `sha256-<image manifest hex>.zchunks` in a registry.
//!
//! In the bundle directory the imager writes, the compressed blob and that manifest sit under
//! `blobs/sha256` without an `index.json` entry: an older slate opening the directory without
//! a tag takes its only untagged-or-version image, and a second entry would make it ask for a
//! tag. `slate push` rebuilds the manifest from the table (it is a function of the table's
//! blob digest and size) and tags it at the destination.

use oci_spec::image::ImageManifest;
use slate_delta::zchunks::{ZBLOB_MEDIA_TYPE, ZTABLE_MEDIA_TYPE};
use slate_delta::{ZChunks, ZTable};

use crate::read::malformed;
use crate::{Bundle, BundleError, Digest};

/// The suffix of the tag naming a bundle's compressed chunks: `sha256-<hex>.zchunks`.
pub const ZCHUNKS_TAG_SUFFIX: &str = ".zchunks";
/// The config of the compressed chunks' manifest: OCI's empty descriptor (`{}`).
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
pub const EMPTY_CONFIG: &[u8] = b"{}";

/// The tag of the compressed chunks of the image manifest `manifest_digest`.
pub fn zchunks_tag_of(manifest_digest: &Digest) -> String {
    format!("sha256-{}{ZCHUNKS_TAG_SUFFIX}", manifest_digest.hex())
}

/// `sha256-<hex>.zchunks`.
pub fn is_zchunks_tag(tag: &str) -> bool {
    tag.starts_with("sha256-") && tag.ends_with(ZCHUNKS_TAG_SUFFIX)
}

/// A tag that names something attached to an image (its signature, its compressed chunks),
/// never an image to install.
pub fn is_attached_tag(tag: &str) -> bool {
    crate::is_signature_tag(tag) || is_zchunks_tag(tag)
}

/// The compressed blob a `.zchunks` manifest names, if it is one: its only layer, of media type
/// [`ZBLOB_MEDIA_TYPE`]. `(digest, size)`.
pub fn zchunks_layer(manifest: &ImageManifest) -> Option<(String, u64)> {
    match manifest.layers().as_slice() {
        [one] if one.media_type().to_string() == ZBLOB_MEDIA_TYPE => {
            Some((one.digest().to_string(), one.size()))
        }
        _ => None,
    }
}

impl Bundle {
    /// The bundle's compressed chunk table, read (capped, hashed against the signed manifest's
    /// digest), parsed and bound to its chunk index. `Ok(None)`: it has none (built before
    /// compressed chunks, or with no chunk that compresses).
    pub fn zchunk_table(&self) -> Result<Option<(ZTable, ZChunks)>, BundleError> {
        let what = "the compressed chunk table";
        let max = slate_delta::zchunks::MAX_ZTABLE_BYTES;
        let Some(bytes) = self.optional_layer(ZTABLE_MEDIA_TYPE, what, max)? else {
            return Ok(None);
        };
        let Some(index) = self.chunk_index()? else {
            return Err(malformed(
                what,
                "the bundle has no chunk index for it to follow",
            ));
        };
        let table = ZTable::parse(&bytes).map_err(|e| malformed(what, e))?;
        let chunks = table.check(&index).map_err(|e| malformed(what, e))?;
        Ok(Some((table, chunks)))
    }
}
