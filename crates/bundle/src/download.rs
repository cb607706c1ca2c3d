//! What a node would download to install a bundle, said before anything is fetched (issue 41,
//! `slate upgrade --check`): the whole bundle, or — when the bundle carries a chunk index and
//! the node lists the chunks it holds — the chunks it lacks plus the blobs no index lists. By
//! digest alone: the pull re-hashes every chunk it reuses, so the real figure can only be
//! larger (by what has rotted on the node).

use serde::Serialize;
use slate_delta::ChunkIndex;

use crate::{Bundle, BundleError};

/// Bytes and chunks of one bundle's download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Download {
    /// What the pull fetches: the chunks the node lacks, every blob no index lists (or whose
    /// delta would not be smaller), the documents.
    pub fetch_bytes: u64,
    /// Of those, the chunks fetched by range requests.
    pub fetch_chunks: usize,
    /// Bytes assembled from what the node holds.
    pub reuse_bytes: u64,
    /// Every blob of the bundle: a whole download.
    pub total_bytes: u64,
    /// Why the node downloads the whole bundle, when it does.
    pub whole: Option<String>,
    /// The chunks are counted as they travel compressed (the bundle has a compressed chunk
    /// table, formats.md §7.8; a registry without its `.zchunks` tag serves them raw).
    pub compressed: bool,
    /// The bundle's slate binary is not one the node holds, so the pull will derive the new
    /// root's copy of it from the binary once fetched (formats.md §7.7, "Derived seeds"): the
    /// UKI's share of `fetch_bytes` counts that copy and is an upper bound.
    pub derives_root_copy: bool,
}

impl Download {
    /// One line: `download: …`.
    pub fn text(&self) -> String {
        match &self.whole {
            Some(why) => format!(
                "download: {} bytes, the whole bundle ({why})",
                self.total_bytes
            ),
            None => {
                format!(
                "download: {}{} of {} bytes ({:.1} %): {} chunks by range requests{}; {} bytes \
                 reused from the node{}",
                if self.derives_root_copy { "at most " } else { "" },
                self.fetch_bytes,
                self.total_bytes,
                percent(self.fetch_bytes, self.total_bytes),
                self.fetch_chunks,
                if self.compressed { ", compressed" } else { "" },
                self.reuse_bytes,
                if self.derives_root_copy {
                    "; its slate binary is new to the node, which derives the new root's copy \
                     of it once fetched, so the UKI may fetch less"
                } else {
                    ""
                }
            )
            }
        }
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

impl Bundle {
    /// What a node holding the chunks `held` lists would download to install this bundle;
    /// `held` is `Err(why)` when the node did not say.
    pub fn download(&self, held: Result<&ChunkIndex, &str>) -> Result<Download, BundleError> {
        let total_bytes: u64 = self.image_blobs().iter().map(|(_, size)| size).sum();
        let whole = |why: &str| Download {
            fetch_bytes: total_bytes,
            fetch_chunks: 0,
            reuse_bytes: 0,
            total_bytes,
            whole: Some(why.to_owned()),
            compressed: false,
            derives_root_copy: false,
        };
        let Some(target) = self.chunk_index()? else {
            return Ok(whole("it carries no chunk index"));
        };
        let held = match held {
            Ok(held) => held,
            Err(why) => return Ok(whole(why)),
        };
        let zchunks = self.zchunk_table()?.map(|(_, z)| z);
        let estimate = slate_delta::estimate(&target, &[held]);
        let (mut fetch_bytes, mut fetch_chunks, mut reuse_bytes) = (0u64, 0usize, 0u64);
        for blob in &estimate.blobs {
            // As the pull decides (`slate_delta::Plan::worth_it`, on raw sizes): a delta that
            // would not be smaller is a whole download.
            if blob.fetch_bytes + 512 * blob.fetch_chunks as u64 + 512 < blob.size {
                // Compressed, a fetched chunk costs its frame (a raw one, its length).
                let listed = target.blob(&blob.blob).cloned();
                fetch_bytes += match (&zchunks, listed) {
                    (Some(z), Some(listed)) => {
                        let one = ChunkIndex {
                            params: target.params,
                            blobs: vec![listed],
                        };
                        slate_delta::zchunks::compressed_fetch(&one, &[held], z).0
                    }
                    _ => blob.fetch_bytes,
                };
                fetch_chunks += blob.fetch_chunks;
                reuse_bytes += blob.reuse_bytes;
            } else {
                fetch_bytes += blob.size;
            }
        }
        // The blobs no index lists and the index itself are downloaded whole.
        fetch_bytes += total_bytes.saturating_sub(estimate.full_bytes());
        if reuse_bytes == 0 {
            return Ok(whole("the node holds none of its chunks"));
        }
        // As the pull decides (`slate_transport::DeriveSeeds`): a binary the node holds whole
        // derives nothing; a new one does, when the node's root can be read — not known here.
        let binary = self.manifest().blobs.get(crate::INSTALLER_ROLE);
        let derives_root_copy = binary.is_some_and(|b| held.blob(&b.digest).is_none());
        Ok(Download {
            fetch_bytes,
            fetch_chunks,
            reuse_bytes,
            total_bytes,
            whole: None,
            compressed: zchunks.is_some(),
            derives_root_copy,
        })
    }
}
