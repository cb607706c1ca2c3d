//! Pulling by delta (issue 41; formats.md §7.7): a blob the target's chunk index lists is
//! assembled from chunks this machine already holds — seeds (blobs listed by their own signed
//! index: the running UKI on a node's ESP, the running installer, images already in the cache)
//! and the chunks of an interrupted assembly — plus the chunks it lacks, fetched by range
//! requests on the target's blob. The assembled blob goes through the cache's `incoming/`
//! like a downloaded one: hashed as written, renamed into `blobs/sha256` only when its whole
//! digest matches the manifest's, so the cache's invariant (every file under `blobs/` is a
//! verified blob) holds whichever way a blob came.
//!
//! A delta that would not be smaller than the blob, or that fails (a chunk the remote serves
//! corrupt or refuses, a registry that does not answer ranges), falls back to the whole
//! download, which is refused in turn if the registry's blob is wrong.
//!
//! The target's index is trusted as much as the blobs of a whole pull: the manifest names it by
//! digest and the manifest is checked against the reference's digest; the bundle's signature
//! over that manifest is checked after the pull, before anything is installed, as for any pull.

use std::collections::HashSet;
use std::io::Read as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oci_spec::image::{Descriptor, ImageManifest};
use slate_delta::zchunks::{MAX_ZTABLE_BYTES, ZTABLE_MEDIA_TYPE};
use slate_delta::{
    BlobChunks, Chunk, ChunkIndex, ReadAt, Remote, Seed, ZChunks, ZRemote, ZTable,
    CHUNK_INDEX_MEDIA_TYPE, MAX_INDEX_BYTES,
};

use crate::chunks::{DirCache, FileSeed};
use crate::layout::{Incoming, Layout, CHUNKS_DIR, INCOMING};
use crate::{Event, TransportError};

/// What one delta did: bytes fetched, bytes reused, and whether the blob is in place (else the
/// caller downloads it whole).
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    pub fetched: u64,
    pub reused: u64,
    pub in_place: bool,
}

/// Chunk fetches running at once: enough to hide a registry's round trip, few enough not to
/// look like a flood to it.
const PARALLEL: usize = 8;

/// A blob this machine holds and its chunks as a signed index lists them: a delta's seed. Its
/// bytes are never trusted: each chunk is re-hashed against the index before it is used, and
/// used only where the target's own signed index lists that digest.
pub struct SeedBlob {
    pub chunks: BlobChunks,
    pub file: Box<dyn ReadAt + Send + Sync>,
}

impl std::fmt::Debug for SeedBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeedBlob")
            .field("blob", &self.chunks.oci_digest())
            .finish()
    }
}

/// A blob held in memory as a seed (a UKI read from the ESP through the boot loader's reader).
#[derive(Debug)]
pub struct MemSeed(pub Vec<u8>);

impl ReadAt for MemSeed {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let bytes = start
            .checked_add(buf.len())
            .and_then(|end| self.0.get(start..end))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// The seeds the layout cache at `cache_dir` holds: the blobs of every image in it that has a
/// chunk index, as that index lists them. Best effort — a seed is only ever a hint — so an
/// image that cannot be read gives none.
pub fn cache_seeds(cache_dir: &Path) -> Vec<SeedBlob> {
    let Ok(layout) = Layout::open(cache_dir) else {
        return Vec::new();
    };
    let Ok(index) = layout.read_index() else {
        return Vec::new();
    };
    let mut seen = HashSet::new();
    let mut seeds = Vec::new();
    for tag in index.manifests().iter().filter_map(crate::layout::tag_of) {
        if slate_bundle::is_attached_tag(tag) {
            continue;
        }
        let Ok(Some(chunks)) = crate::open_cached(cache_dir, tag).and_then(|b| b.chunk_index())
        else {
            continue;
        };
        for blob in chunks.blobs {
            let Ok(path) = layout.blob_path(&blob.oci_digest()) else {
                continue;
            };
            if !seen.insert(blob.digest) {
                continue;
            }
            if let Ok(file) = slate_files::open_regular_no_link(&path, "a cached blob") {
                seeds.push(SeedBlob {
                    chunks: blob,
                    file: Box::new(FileSeed(file)),
                });
            }
        }
    }
    seeds
}

/// Seeds a pull makes from a blob it has just put in place, for the blobs after it: a node
/// rebuilds the root filesystem's copy of the new slate binary from the binary it assembled
/// first (formats.md §7.7, "Derived seeds"), so the UKI does not fetch those bytes again.
/// Only a hint, like every seed: a chunk is used only where its bytes hash to a digest the
/// target's signed index lists.
pub trait DeriveSeeds: Sync {
    /// The seeds `blob` (a verified blob of the image, of media type `media_type`, at `path`)
    /// gives; none when it gives nothing worth the work.
    fn derive(&self, media_type: &str, path: &Path) -> Vec<SeedBlob>;
}

/// What a delta pull brings besides the source: seeds, and where missing chunks come from.
pub(crate) struct Delta<'a> {
    pub seeds: &'a [SeedBlob],
    pub remote: &'a dyn Remote,
    pub derive: Option<&'a dyn DeriveSeeds>,
}

/// The manifest's chunk index layer, if it has exactly one.
pub(crate) fn index_layer(manifest: &ImageManifest) -> Option<&Descriptor> {
    let mut layers = manifest
        .layers()
        .iter()
        .filter(|l| l.media_type().to_string() == CHUNK_INDEX_MEDIA_TYPE);
    match (layers.next(), layers.next()) {
        (Some(one), None) if one.size() <= MAX_INDEX_BYTES => Some(one),
        _ => None,
    }
}

/// The manifest's compressed chunk table layer (formats.md §7.8), if it has exactly one.
pub(crate) fn table_layer(manifest: &ImageManifest) -> Option<&Descriptor> {
    let mut layers = manifest
        .layers()
        .iter()
        .filter(|l| l.media_type().to_string() == ZTABLE_MEDIA_TYPE);
    match (layers.next(), layers.next()) {
        (Some(one), None) if one.size() <= MAX_ZTABLE_BYTES => Some(one),
        _ => None,
    }
}

/// The compressed chunk table blob `layer` names, read from `layout`, checked against the
/// layer's digest (the source of a push is any directory) and parsed. `None` when it is
/// missing or does not parse: the chunks then travel raw.
pub(crate) fn read_table(layout: &Layout, layer: &Descriptor) -> Option<ZTable> {
    let path = layout.blob_path(layer.digest().as_ref()).ok()?;
    let file = slate_files::open_regular_no_link(&path, "the compressed chunk table").ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_ZTABLE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    let digest = slate_bundle::Digest::of(&bytes);
    if digest.as_str() != layer.digest().as_ref() {
        return None;
    }
    ZTable::parse(&bytes).ok()
}

/// The chunk index blob `layer` names, read from `dest` (where it was fetched and verified)
/// and parsed. `None` when it does not parse: no delta then, and the bundle's verification
/// refuses it after the pull.
pub(crate) fn read_index(dest: &Layout, layer: &Descriptor) -> Option<ChunkIndex> {
    let path = dest.blob_path(layer.digest().as_ref()).ok()?;
    let file = slate_files::open_regular_no_link(&path, "the chunk index").ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    ChunkIndex::parse(&bytes).ok()
}

/// Assemble the blob `chunks` lists into `dest` from `delta`'s seeds, the chunks an earlier
/// assembly left, and range requests. Not `in_place`: the delta was not worth it or failed,
/// and nothing of it is in `blobs/` — the caller downloads the blob whole.
pub(crate) fn fetch_by_delta(
    delta: &Delta<'_>,
    derived: &[SeedBlob],
    zchunks: Option<&ZChunks>,
    dest: &Layout,
    chunks: &BlobChunks,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Delivered, TransportError> {
    let digest = chunks.oci_digest();
    let chunk_dir = dest.dir().join(INCOMING).join(CHUNKS_DIR);
    let cache = DirCache::new(&chunk_dir).map_err(TransportError::io(&chunk_dir))?;
    let all_seeds: Vec<&SeedBlob> = delta.seeds.iter().chain(derived).collect();
    let seeds = as_seeds(&all_seeds);
    let plan = match slate_delta::plan(chunks, &seeds, Some(&cache)) {
        Ok(plan) => plan,
        Err(e) => {
            let reason = chain(&e);
            progress(Event::DeltaFallback {
                digest: &digest,
                reason: &reason,
            });
            return Ok(Delivered::default());
        }
    };
    for refused in &plan.refused {
        let seed = all_seeds[refused.seed].chunks.oci_digest();
        progress(Event::SeedChunkRefused {
            digest: &digest,
            seed: &seed,
            offset: refused.chunk.offset,
            end: refused.chunk.offset + u64::from(refused.chunk.length),
        });
    }
    progress(Event::DeltaStart {
        digest: &digest,
        size: chunks.size,
        fetch_bytes: zchunks.map_or(plan.fetch_bytes, |z| wire_bytes(chunks, &plan, z)),
        compressed: zchunks.is_some(),
        fetch_chunks: plan.fetch_chunks,
        reuse_bytes: plan.reuse_bytes,
        reuse_chunks: plan.reuse_chunks,
    });
    if !plan.worth_it() {
        progress(Event::DeltaFallback {
            digest: &digest,
            reason: "the chunks to fetch would not come to less than the blob",
        });
        return Ok(Delivered::default());
    }
    let what = format!("blob {digest} assembled from chunks");
    let mut incoming = Incoming::begin(dest, &what, &digest, chunks.size)?;
    // The delta writes the blob from its first byte; a whole download's prefix is not used.
    incoming.restart()?;
    let fetched = AtomicU64::new(0);
    let counting = Counting {
        inner: delta.remote,
        fetched: &fetched,
    };
    let assembled = std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let seeds = as_seeds(&all_seeds);
            let mut out = Appender(&mut incoming);
            // Counted on the wire: a compressed chunk's frame, not what it inflates to.
            let remote = ZRemote {
                table: zchunks,
                inner: &counting,
            };
            slate_delta::assemble(chunks, &plan, &seeds, &cache, &remote, PARALLEL, &mut out)
        });
        // The fetches run on the assembler's threads; their bytes are reported from here,
        // where the caller's progress lives.
        let mut reported = 0;
        while !worker.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
            let now = fetched.load(Ordering::Relaxed);
            if now > reported {
                progress(Event::Bytes(now - reported));
                reported = now;
            }
        }
        let now = fetched.load(Ordering::Relaxed);
        if now > reported {
            progress(Event::Bytes(now - reported));
        }
        worker.join().expect("the assembler does not panic")
    });
    let mut delivered = Delivered {
        fetched: fetched.load(Ordering::Relaxed),
        ..Delivered::default()
    };
    if let Err(e) = assembled {
        incoming.discard();
        let reason = chain(&e);
        progress(Event::DeltaFallback {
            digest: &digest,
            reason: &reason,
        });
        return Ok(delivered);
    }
    incoming.finish()?;
    progress(Event::BlobDone { digest: &digest });
    delivered.reused = plan.reuse_bytes;
    delivered.in_place = true;
    Ok(delivered)
}

fn as_seeds<'a>(blobs: &[&'a SeedBlob]) -> Vec<Seed<'a>> {
    blobs
        .iter()
        .map(|s| Seed {
            chunks: &s.chunks,
            file: &*s.file,
        })
        .collect()
}

/// Bytes the plan's fetched chunks take on the wire when they travel as `z` says (each
/// distinct chunk once, as the assembler fetches them).
fn wire_bytes(chunks: &BlobChunks, plan: &slate_delta::Plan, z: &ZChunks) -> u64 {
    let mut seen = HashSet::new();
    chunks
        .chunks
        .iter()
        .zip(&plan.sources)
        .filter(|(c, s)| matches!(s, slate_delta::Source::Fetch) && seen.insert(c.digest))
        .map(|(c, _)| {
            z.by_raw
                .get(&c.digest)
                .map_or(u64::from(c.length), |w| w.wire_bytes(c.length))
        })
        .sum()
}

/// Once the image is complete, the chunks of its assemblies are not needed.
pub(crate) fn remove_chunks(dest: &Layout) {
    let _ = std::fs::remove_dir_all(dest.dir().join(INCOMING).join(CHUNKS_DIR));
}

/// An error and its causes on one line (this crate does not depend on the sequencer's).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The remote, counting the bytes it delivered.
struct Counting<'a> {
    inner: &'a dyn Remote,
    fetched: &'a AtomicU64,
}

impl Remote for Counting<'_> {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        let bytes = self.inner.fetch(blob, chunk)?;
        self.fetched
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// The assembled bytes into the incoming partial, hashed as written.
struct Appender<'a>(&'a mut Incoming);

impl std::io::Write for Appender<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
