//! Assembling a blob from its signed chunk list: chunks the node already holds (a seed — the
//! running version's blob, listed by the running bundle's own signed index — or the chunk
//! cache) are re-hashed before use (on every core) and dropped when they do not match; the
//! others are fetched in parallel into the cache, each refused unless its digest matches; then
//! the blob is written in order while a second thread hashes it, and its full digest checked.
//!
//! Fetched chunks go to the cache before anything is written, so an interrupted assembly
//! resumes with what it had fetched. Where bytes are read and fetched from is the caller's
//! ([`ReadAt`], [`ChunkCache`], [`Remote`]); this module does no IO of its own.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::index::{BlobChunks, Chunk};
use crate::{sha256, Sha256};

/// Positional reads of a local file (the running UKI on the ESP, the running installer). Shared
/// by the threads that check a seed's chunks.
pub trait ReadAt: Sync {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// Chunks kept by digest between assemblies.
pub trait ChunkCache: Sync {
    /// The bytes stored under `digest`, if any (not yet checked).
    fn get(&self, digest: &Sha256) -> std::io::Result<Option<Vec<u8>>>;
    fn put(&self, digest: &Sha256, bytes: &[u8]) -> std::io::Result<()>;
}

/// Where missing chunks come from: the target blob in a registry or an OCI layout.
pub trait Remote: Sync {
    /// The `chunk.length` bytes at `chunk.offset` of the blob `blob` (`sha256:<hex>`).
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>>;
}

/// A local blob and its chunks as its own signed index lists them.
#[derive(Clone, Copy)]
pub struct Seed<'a> {
    pub chunks: &'a BlobChunks,
    pub file: &'a dyn ReadAt,
}

impl std::fmt::Debug for Seed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seed")
            .field("blob", &self.chunks.oci_digest())
            .finish()
    }
}

/// Where one chunk of the target comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Seed `seed`, at `offset`.
    Seed {
        seed: usize,
        offset: u64,
    },
    Cache,
    Fetch,
}

/// What an assembly will do, before it does it: the size up front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// One source per chunk of the target, in order.
    pub sources: Vec<Source>,
    pub fetch_bytes: u64,
    pub fetch_chunks: usize,
    pub reuse_bytes: u64,
    pub reuse_chunks: usize,
    /// The whole blob's size.
    pub full_bytes: u64,
    /// Seed chunks whose bytes did not match the digest their own signed index lists (rot or
    /// tampering on the ESP, a changed binary): not used, and worth telling the node's owner.
    pub refused: Vec<Refused>,
}

/// A seed's chunk that failed its digest while planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Which seed (index into the `seeds` given to [`plan`]).
    pub seed: usize,
    /// The chunk as the seed's index lists it (its offset in the seed).
    pub chunk: Chunk,
}

impl Plan {
    /// Whether fetching chunks beats one whole download. Each chunk is one request; counting
    /// 512 bytes of request and response headers each is what makes a delta of many small
    /// chunks lose to one download.
    pub fn worth_it(&self) -> bool {
        self.fetch_bytes + 512 * self.fetch_chunks as u64 + 512 < self.full_bytes
    }
}

/// Plan `target` from `seeds` and `cache`: each seed chunk whose digest the target lists is
/// read and re-hashed (a chunk of a seed that does not match its own signed digest is not used:
/// the next seed listing that digest is tried), and so is each cached chunk. Reads nothing
/// else. The seeds' chunks are checked on up to [`HASH_THREADS`] threads: hashing every reused
/// byte is most of an assembly's work.
pub fn plan(
    target: &BlobChunks,
    seeds: &[Seed<'_>],
    cache: Option<&dyn ChunkCache>,
) -> Result<Plan, AssembleError> {
    let (mut found, mut refused) = first_matching(target, seeds);
    refused.sort_by_key(|r| (r.seed, r.chunk.offset));
    let mut sources = Vec::with_capacity(target.chunks.len());
    let (mut fetch_bytes, mut fetch_chunks, mut reuse_bytes, mut reuse_chunks) = (0, 0, 0, 0);
    for chunk in &target.chunks {
        let mut source = found.get(&chunk.digest).copied();
        if source.is_none() {
            if let Some(cache) = cache {
                if cached(cache, chunk)?.is_some() {
                    source = Some(Source::Cache);
                    found.insert(chunk.digest, Source::Cache);
                }
            }
        }
        let source = source.unwrap_or(Source::Fetch);
        if source == Source::Fetch {
            fetch_bytes += u64::from(chunk.length);
            fetch_chunks += 1;
            // A chunk listed twice is fetched once, then read from the cache.
            found.insert(chunk.digest, Source::Cache);
        } else {
            reuse_bytes += u64::from(chunk.length);
            reuse_chunks += 1;
        }
        sources.push(source);
    }
    Ok(Plan {
        sources,
        fetch_bytes,
        fetch_chunks,
        reuse_bytes,
        reuse_chunks,
        full_bytes: target.size,
        refused,
    })
}

/// Threads that hash local chunks while planning.
pub const HASH_THREADS: usize = 4;

/// For each digest the target lists, the first seed chunk (in seed order) whose bytes match it;
/// and the seed chunks read on the way that did not match.
fn first_matching(
    target: &BlobChunks,
    seeds: &[Seed<'_>],
) -> (HashMap<Sha256, Source>, Vec<Refused>) {
    let wanted: HashSet<Sha256> = target.chunks.iter().map(|c| c.digest).collect();
    let mut order: Vec<Sha256> = Vec::new();
    let mut candidates: HashMap<Sha256, Vec<(usize, Chunk)>> = HashMap::new();
    for (s, seed) in seeds.iter().enumerate() {
        for chunk in seed
            .chunks
            .chunks
            .iter()
            .filter(|c| wanted.contains(&c.digest))
        {
            let list = candidates.entry(chunk.digest).or_default();
            if list.is_empty() {
                order.push(chunk.digest);
            }
            list.push((s, *chunk));
        }
    }
    let next = AtomicUsize::new(0);
    let found = Mutex::new(HashMap::new());
    let refused = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, HASH_THREADS)
        .min(order.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let Some(digest) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let good = candidates[digest].iter().find(|(seed, chunk)| {
                    let ok = read_seed(&seeds[*seed], chunk).is_ok();
                    if !ok {
                        refused.lock().expect("no panics hold it").push(Refused {
                            seed: *seed,
                            chunk: *chunk,
                        });
                    }
                    ok
                });
                if let Some((seed, chunk)) = good {
                    let source = Source::Seed {
                        seed: *seed,
                        offset: chunk.offset,
                    };
                    found
                        .lock()
                        .expect("no panics hold it")
                        .insert(*digest, source);
                }
            });
        }
    });
    (
        found.into_inner().expect("no panics hold it"),
        refused.into_inner().expect("no panics hold it"),
    )
}

/// Why an assembly stopped. Nothing it wrote should be used then: the caller discards it.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("chunk {index} (bytes {offset}..{end}) fetched from the remote does not match its signed digest sha256:{expected}: refused")]
    RemoteCorrupt {
        index: usize,
        offset: u64,
        end: u64,
        expected: String,
    },
    #[error("fetching chunk {index} (bytes {offset}..{end}) of {blob}")]
    Fetch {
        index: usize,
        offset: u64,
        end: u64,
        blob: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the chunk cache")]
    Cache(#[source] std::io::Error),
    #[error("a local chunk went missing between planning and writing (sha256:{0})")]
    LocalChanged(String),
    #[error("writing the assembled blob")]
    Write(#[source] std::io::Error),
    #[error("the assembled blob's digest is sha256:{actual}, its index says sha256:{expected}")]
    Digest { expected: String, actual: String },
}

/// Counts of an assembly that finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assembled {
    pub fetched_bytes: u64,
    pub fetched_chunks: usize,
    pub reused_bytes: u64,
}

/// Carry out `plan` (from [`plan`], with the same seeds and cache): fetch its missing chunks on
/// up to `parallel` threads into `cache`, then write the target blob to `out` in order and check
/// its whole digest, hashed on a second thread as it is written.
pub fn assemble(
    target: &BlobChunks,
    plan: &Plan,
    seeds: &[Seed<'_>],
    cache: &dyn ChunkCache,
    remote: &dyn Remote,
    parallel: usize,
    out: &mut dyn Write,
) -> Result<Assembled, AssembleError> {
    let blob = target.oci_digest();
    let mut missing: Vec<usize> = Vec::new();
    let mut seen = HashSet::new();
    for (i, source) in plan.sources.iter().enumerate() {
        if *source == Source::Fetch && seen.insert(target.chunks[i].digest) {
            missing.push(i);
        }
    }
    let next = Mutex::new(missing.into_iter());
    let failure: Mutex<Option<AssembleError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..parallel.max(1) {
            s.spawn(|| loop {
                if failure.lock().expect("no panics hold it").is_some() {
                    return;
                }
                let Some(i) = next.lock().expect("no panics hold it").next() else {
                    return;
                };
                if let Err(e) = fetch_one(&blob, i, &target.chunks[i], cache, remote) {
                    failure.lock().expect("no panics hold it").get_or_insert(e);
                    return;
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().expect("no panics hold it") {
        return Err(e);
    }
    // The whole digest is computed on its own thread from the chunks as they are written, so
    // the write waits for neither. The chunks were checked by `plan` (local) or as they arrived
    // (fetched); what changed since is caught by this digest before the caller uses a byte.
    let (chunks_out, chunks_in) = std::sync::mpsc::sync_channel::<Vec<u8>>(16);
    let (written, actual) = std::thread::scope(|s| {
        let hasher = s.spawn(move || {
            let mut whole = <sha2::Sha256 as sha2::Digest>::new();
            for bytes in chunks_in {
                sha2::Digest::update(&mut whole, &bytes);
            }
            let digest: Sha256 = sha2::Digest::finalize(whole).into();
            digest
        });
        let written = write_in_order(target, plan, seeds, cache, out, &chunks_out);
        drop(chunks_out);
        (written, hasher.join().expect("the hasher does not panic"))
    });
    written?;
    if actual != target.digest {
        return Err(AssembleError::Digest {
            expected: hex::encode(target.digest),
            actual: hex::encode(actual),
        });
    }
    Ok(Assembled {
        fetched_bytes: plan.fetch_bytes,
        fetched_chunks: plan.fetch_chunks,
        reused_bytes: plan.reuse_bytes,
    })
}

/// The target's chunks, in order, into `out` and to the hasher.
fn write_in_order(
    target: &BlobChunks,
    plan: &Plan,
    seeds: &[Seed<'_>],
    cache: &dyn ChunkCache,
    out: &mut dyn Write,
    hasher: &std::sync::mpsc::SyncSender<Vec<u8>>,
) -> Result<(), AssembleError> {
    for (chunk, source) in target.chunks.iter().zip(&plan.sources) {
        let changed = || AssembleError::LocalChanged(hex::encode(chunk.digest));
        let bytes = match *source {
            Source::Seed { seed, offset } => {
                let mut buf = vec![0; chunk.length as usize];
                seeds[seed]
                    .file
                    .read_at(offset, &mut buf)
                    .map_err(|_| changed())?;
                buf
            }
            Source::Cache | Source::Fetch => cache
                .get(&chunk.digest)
                .map_err(AssembleError::Cache)?
                .filter(|b| b.len() == chunk.length as usize)
                .ok_or_else(changed)?,
        };
        out.write_all(&bytes).map_err(AssembleError::Write)?;
        // The hasher ends only when the sender is dropped; had it died, the digest is wrong.
        let _ = hasher.send(bytes);
    }
    out.flush().map_err(AssembleError::Write)
}

fn fetch_one(
    blob: &str,
    index: usize,
    chunk: &Chunk,
    cache: &dyn ChunkCache,
    remote: &dyn Remote,
) -> Result<(), AssembleError> {
    let end = chunk.offset + u64::from(chunk.length);
    let bytes = remote
        .fetch(blob, chunk)
        .map_err(|source| AssembleError::Fetch {
            index,
            offset: chunk.offset,
            end,
            blob: blob.to_owned(),
            source,
        })?;
    if bytes.len() != chunk.length as usize || sha256(&bytes) != chunk.digest {
        return Err(AssembleError::RemoteCorrupt {
            index,
            offset: chunk.offset,
            end,
            expected: hex::encode(chunk.digest),
        });
    }
    cache
        .put(&chunk.digest, &bytes)
        .map_err(AssembleError::Cache)
}

/// The seed's bytes of `chunk` (at the seed's own offset), if they match the digest.
fn read_seed(seed: &Seed<'_>, chunk: &Chunk) -> Result<Vec<u8>, ()> {
    let mut buf = vec![0; chunk.length as usize];
    seed.file.read_at(chunk.offset, &mut buf).map_err(|_| ())?;
    (sha256(&buf) == chunk.digest).then_some(buf).ok_or(())
}

/// The cache's bytes of `chunk`, if present and matching.
fn cached(cache: &dyn ChunkCache, chunk: &Chunk) -> Result<Option<Vec<u8>>, AssembleError> {
    Ok(cache
        .get(&chunk.digest)
        .map_err(AssembleError::Cache)?
        .filter(|b| b.len() == chunk.length as usize && sha256(b) == chunk.digest))
}

#[cfg(test)]
#[path = "assemble_tests.rs"]
mod tests;
