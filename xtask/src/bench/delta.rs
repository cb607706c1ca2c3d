//! Delta benchmark (not a test; issue 41): pairs of demo installer bundles, and what a node
//! running the first fetches to get the second — slate's chunks (from the two signed chunk
//! indexes, plus the new index) against casync's (Debian's `casync`, its default chunk sizes,
//! the old blobs as seed: the chunks of the new blobs' stores that the old blobs' store lacks,
//! compressed as casync serves them, plus the new `.caibx` indexes a casync client reads
//! first, as slate's columns count its new index), on the same blobs (the UKI and the
//! installer) in the same run; the node-side assembly of each pair against writing the same bytes, with its peak
//! memory; and the bundle build time beside the time of the index alone.
//!
//! Slate's bytes are counted twice: as raw ranges of the new blobs (what a node fetches from
//! a bundle without compressed chunks), and as its compressed chunks travel (formats.md §7.8:
//! each missing chunk's stored bytes, plus the compressed chunk table), from the table the
//! imager wrote into the new bundle (a signed layer since issue 41 part 2).
//!
//! A node whose new slate binary differs from its running one also derives the new root's
//! copy of that binary (formats.md §7.7, "Derived seeds"): slate's columns count what it still
//! fetches, and the row says how many bytes the derived seed saved and how long making it took
//! (part of the assembly's time, printed apart too).
//!
//! Pairs (inputs in `delta_inputs`): (a) version only, (b) one 1 MiB file added to the root,
//! (c) libc6 replaced by another build of it, (d) slate rebuilt with a small source change, (e)
//! the kernel of the previous point release replaced by the current one.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use slate_bundle::Bundle;

use super::delta_inputs::{self, Inputs};
use crate::util::{output, repo_root};

/// Build an installer bundle of `inputs`; its wall time in seconds.
fn build(slate: &Path, inputs: &Inputs, version: &str, out: &Path) -> Result<f64> {
    let _ = fs::remove_dir_all(out);
    let profile = out.with_extension("toml");
    fs::write(&profile, inputs.profile()?)?;
    let start = Instant::now();
    output(
        Command::new(slate)
            .args(["imager", "build", "--profile"])
            .arg(&profile)
            .args(["--version", version, "--output", "installer", "--out"])
            .arg(out)
            .env("SOURCE_DATE_EPOCH", "1700000000"),
    )?;
    Ok(start.elapsed().as_secs_f64())
}

/// The files of the blobs `index` lists (the UKI, the installer, the boot loader), in its order.
fn blob_files(bundle: &Bundle, index: &slate_delta::ChunkIndex) -> Vec<PathBuf> {
    index
        .blobs
        .iter()
        .map(|blob| {
            bundle
                .dir()
                .join("blobs/sha256")
                .join(&blob.oci_digest()["sha256:".len()..])
        })
        .collect()
}

/// casync's chunk store of `blobs` in `store`: chunk id → (compressed size), and the bytes of
/// the `.caibx` indexes it made (what a casync client fetches before any chunk).
fn casync_store(blobs: &[PathBuf], store: &Path) -> Result<(BTreeSet<(String, u64)>, u64)> {
    let _ = fs::remove_dir_all(store);
    fs::create_dir_all(store)?;
    for (i, blob) in blobs.iter().enumerate() {
        output(
            Command::new("casync")
                .arg("make")
                .arg(format!("--store={}", store.display()))
                .arg(store.join(format!("{i}.caibx")))
                .arg(blob),
        )?;
    }
    let mut chunks = BTreeSet::new();
    let mut caibx = 0;
    for shard in fs::read_dir(store)? {
        let shard = shard?;
        if !shard.file_type()?.is_dir() {
            caibx += shard.metadata()?.len();
            continue;
        }
        for chunk in fs::read_dir(shard.path())? {
            let chunk = chunk?;
            chunks.insert((
                chunk.file_name().to_string_lossy().into_owned(),
                chunk.metadata()?.len(),
            ));
        }
    }
    Ok((chunks, caibx))
}

/// Bytes casync fetches for `new` with `old`'s chunks at hand: compressed as served, and the
/// chunks' count. (Uncompressed sizes are not in the store's listing; the compressed figure is
/// what crosses the network.)
fn casync_fetch(old: &BTreeSet<(String, u64)>, new: &BTreeSet<(String, u64)>) -> (u64, usize) {
    let have: BTreeSet<&String> = old.iter().map(|(id, _)| id).collect();
    let missing: Vec<_> = new.iter().filter(|(id, _)| !have.contains(id)).collect();
    (missing.iter().map(|(_, size)| size).sum(), missing.len())
}

pub fn bench_delta(slate: Option<&Path>) -> Result<()> {
    let root = repo_root();
    let slate = match slate {
        Some(slate) => slate.to_owned(),
        None => root.join("target/release/slate"),
    };
    let work = root.join("target/bench/delta");
    let inputs = work.join("inputs");
    let [plain, plus, old_libc, old_kernel] = delta_inputs::prepare(&inputs)?;
    let v1 = work.join("v1");
    let v2 = work.join("v2");
    // The build's time as the median of three clean builds: one build moved 1.15x -> 1.20x
    // between runs of the same code (a second and a half, at the mercy of the load).
    let build_secs = median(
        (0..ROUNDS)
            .map(|_| build(&slate, &plain, "1.0.0", &v1))
            .collect::<Result<_>>()?,
    );
    build(&slate, &plain, "2.0.0", &v2)?;
    let made = |inputs: &Inputs, version: &str, name: &str| -> Result<PathBuf> {
        let out = work.join(name);
        build(&slate, inputs, version, &out)?;
        Ok(out)
    };
    println!(
        "{:<30} {:>12} {:>12} {:>7} {:>12} {:>7} {:>7} {:>12} {:>7} {:>7}",
        "pair",
        "full B",
        "slate raw B",
        "raw%",
        "slate zst B",
        "zst%",
        "chunks",
        "casync B",
        "casync%",
        "chunks"
    );
    let index_secs = index_time(&v2)?;
    let row = |name: &'static str, old: &Path, new: &Path| compare(name, old, new, &work);
    row("(a) version only", &v1, &v2)?;
    row(
        "(b) +1 MiB file in the root",
        &v1,
        &made(&plus, "2.0.0", "v2-plus")?,
    )?;
    row(
        "(c) libc6 another build",
        &made(&old_libc, "1.0.0", "v1-oldlibc")?,
        &v2,
    )?;
    row(
        "(e) kernel, previous -> current",
        &made(&old_kernel, "1.0.0", "v1-oldkernel")?,
        &v2,
    )?;
    let changed = delta_inputs::changed_slate(&plain, &inputs)?;
    let v2_slate = made(&changed, "2.0.0", "v2-slate")?;
    row("(d) slate small change", &v1, &v2_slate)?;
    let zstd_secs = levels(&v1, &v2_slate)?;
    // The imager writes the index and the compressed chunks: the build without them is the
    // build less their times, each measured again here on the same blobs.
    let bare = (build_secs - index_secs - zstd_secs).max(1e-9);
    println!(
        "bundle build (v1) as the imager writes it (chunk index, compressed chunks at level \
         {}; median of {ROUNDS}): {build_secs:.2} s; of which the compression {zstd_secs:.2} s and the index \
         {index_secs:.2} s (recomputed here); without the compressed chunks {:.2} s, without \
         either {bare:.2} s: {:.3}x of that",
        slate_delta::zchunks::LEVEL,
        build_secs - zstd_secs,
        build_secs / bare
    );
    Ok(())
}

/// One pair's row of the table (printed), and its assembly timed.
fn compare(name: &str, old_dir: &Path, new_dir: &Path, work: &Path) -> Result<()> {
    let old = Bundle::open(old_dir, None)?;
    let old_index = old
        .chunk_index()?
        .context("the old bundle carries no chunk index")?;
    let new = Bundle::open(new_dir, None)?;
    let index = new
        .chunk_index()?
        .context("the new bundle carries no chunk index")?;
    let derived = derived_seed(&old, &old_index, &new)?;
    let held: Vec<&slate_delta::ChunkIndex> = std::iter::once(&old_index)
        .chain(derived.as_ref().map(|d| &d.index))
        .collect();
    let estimate = slate_delta::estimate(&index, &held);
    let files = blob_files(&new, &index);
    let timed = assemble_timed(&old, &old_index, &new, &index, work)?;
    let (old_store, _) = casync_store(&blob_files(&old, &old_index), &work.join("casync-old"))?;
    let (store, caibx) = casync_store(&files, &work.join("casync-new"))?;
    let (casync_bytes, casync_chunks) = casync_fetch(&old_store, &store);
    let full = estimate.full_bytes();
    let pct = |n: u64| 100.0 * n as f64 / full as f64;
    let (ztable, z) = new
        .zchunk_table()?
        .context("the new bundle carries no compressed chunk table")?;
    let (zchunks, _) = slate_delta::zchunks::compressed_fetch(&index, &held, &z);
    let zfetch = zchunks + estimate.index_bytes + ztable.to_bytes().len() as u64;
    println!(
        "{:<30} {:>12} {:>12} {:>6.2}% {:>12} {:>6.2}% {:>7} {:>12} {:>6.2}% {:>7}",
        name,
        full,
        estimate.fetch_bytes(),
        pct(estimate.fetch_bytes()),
        zfetch,
        pct(zfetch),
        estimate.fetch_chunks(),
        casync_bytes + caibx,
        pct(casync_bytes + caibx),
        casync_chunks
    );
    // Like for like, each tool's columns count what it fetches first to know which chunks it
    // lacks (slate: the chunk index and the compressed chunk table; casync: its `.caibx`
    // indexes); here the chunks alone beside those indexes.
    let table_bytes = ztable.to_bytes().len() as u64;
    println!(
        "    chunks alone: slate {zchunks} ({:.2} %), casync {casync_bytes} ({:.2} %); \
         indexes: slate {} (chunk index {}, table {table_bytes}), casync {caibx} (.caibx)",
        pct(zchunks),
        pct(casync_bytes),
        estimate.index_bytes + table_bytes,
        estimate.index_bytes,
    );
    if let Some(d) = &derived {
        let without = slate_delta::zchunks::compressed_fetch(&index, &[&old_index], &z).0;
        println!(
            "    derived seed (the new root's copy of the new slate binary, {} bytes, made from \
             the binary in {:.3} s): chunks without it {without} ({:.2} %), so it saved {} bytes",
            d.index.blobs[0].size,
            d.secs,
            pct(without),
            without.saturating_sub(zchunks)
        );
    }
    println!(
        "    assembly of the indexed blobs ({} bytes, from the old version's blobs and the new \
         one's layout, fsynced; median of {ROUNDS}): {:.3} s, peak memory +{} KiB; the same \
         bytes written and fsynced: {:.3} s ({:.0} % of that speed){}",
        timed.bytes,
        timed.secs,
        timed.peak_kib,
        timed.plain_secs,
        100.0 * timed.plain_secs / timed.secs,
        if timed.derive_secs > 0.0 {
            format!(
                "; of it deriving the seed {:.3} s, without which {:.0} % of that speed",
                timed.derive_secs,
                100.0 * timed.plain_secs / (timed.secs - timed.derive_secs).max(1e-9)
            )
        } else {
            String::new()
        }
    );
    println!(
        "    one SHA-256 pass over the same bytes, one core: {:.3} s ({:.0} % of the write's time)",
        timed.hash_secs,
        100.0 * timed.hash_secs / timed.plain_secs
    );
    Ok(())
}

/// `bundle`'s compressed chunk table and blob at `level` (as the imager would make them).
fn compressed(
    bundle: &Bundle,
    index: &slate_delta::ChunkIndex,
    level: i32,
) -> Result<(slate_delta::ZTable, Vec<u8>)> {
    let blobs: Vec<Vec<u8>> = blob_files(bundle, index)
        .iter()
        .map(fs::read)
        .collect::<Result<_, _>>()?;
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    Ok(slate_delta::zchunks::compress(index, &refs, level)?)
}

/// The level's choice, on pair (d): for each candidate level, the seconds of compressing the
/// new bundle's chunks (single-threaded, median of [`ROUNDS`]), the compressed blob's size, and
/// what the pair fetches. The seconds at the chosen level are returned.
fn levels(old_dir: &Path, new_dir: &Path) -> Result<f64> {
    let old = Bundle::open(old_dir, None)?;
    let old_index = old.chunk_index()?.context("no chunk index")?;
    let new = Bundle::open(new_dir, None)?;
    let index = new.chunk_index()?.context("no chunk index")?;
    let full: u64 = index.blobs.iter().map(|b| b.size).sum();
    let derived = derived_seed(&old, &old_index, &new)?;
    let held: Vec<&slate_delta::ChunkIndex> = std::iter::once(&old_index)
        .chain(derived.as_ref().map(|d| &d.index))
        .collect();
    let mut chosen = None;
    for level in [3, 6, 9, 12, 19] {
        let mut secs = Vec::new();
        let mut made = None;
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let out = compressed(&new, &index, level)?;
            secs.push(start.elapsed().as_secs_f64());
            if let Some(before) = &made {
                anyhow::ensure!(*before == out, "level {level}: not reproducible");
            }
            made = Some(out);
        }
        let (table, blob) = made.context("rounds")?;
        let z = table.check(&index)?;
        let (fetch, _) = slate_delta::zchunks::compressed_fetch(&index, &held, &z);
        let secs = median(secs);
        println!(
            "    level {level:>2}: compressing the (d) bundle's chunks {secs:.2} s (median of \
             {ROUNDS}), blob {} of {full} bytes, (d) fetches {fetch} bytes of chunks ({:.2} %)",
            blob.len(),
            100.0 * fetch as f64 / full as f64
        );
        if level == slate_delta::zchunks::LEVEL {
            chosen = Some(secs);
        }
    }
    chosen.context("the chosen level is one of the candidates")
}

/// The seconds of computing `bundle`'s chunk index again from its blobs (as the imager does), the
/// median of [`ROUNDS`].
fn index_time(bundle: &Path) -> Result<f64> {
    let bundle = Bundle::open(bundle, None)?;
    let index = bundle.chunk_index()?.context("no chunk index")?;
    let blobs: Vec<Vec<u8>> = blob_files(&bundle, &index)
        .iter()
        .map(fs::read)
        .collect::<Result<_, _>>()?;
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let mut secs = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let again = slate_bundle::index_of(&refs, index.params).context("an index")?;
        secs.push(start.elapsed().as_secs_f64());
        anyhow::ensure!(again == index, "the index is not reproducible");
    }
    Ok(median(secs))
}

/// One pair's assembly: seconds, the seconds of writing the same bytes plainly, the bytes, and
/// the memory it took beyond what the process held before.
struct Timed {
    secs: f64,
    /// Of `secs`, deriving the new root's copy of a changed slate binary (median of rounds).
    derive_secs: f64,
    plain_secs: f64,
    /// One SHA-256 pass over the same bytes, one core.
    hash_secs: f64,
    bytes: u64,
    peak_kib: u64,
}

/// A `kB` field of /proc/self/status.
fn status_kib(field: &str) -> Result<u64> {
    let status = fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .with_context(|| format!("no {field} in /proc/self/status"))
}

/// The seed a node running `old` derives once `new`'s slate binary is in place (machined's
/// `root_copy`, with the storage of `old`'s root image); `None` when the binary did not change
/// (the node then holds it, and its copy in the running UKI, already).
struct Derived {
    index: slate_delta::ChunkIndex,
    secs: f64,
}

fn derived_seed(
    old: &Bundle,
    old_index: &slate_delta::ChunkIndex,
    new: &Bundle,
) -> Result<Option<Derived>> {
    let binary_digest = &new.blob_ref(slate_bundle::INSTALLER_ROLE)?.digest;
    if old_index.blob(binary_digest).is_some() {
        return Ok(None);
    }
    let storage = slate_bundle_diff::root_storage(&old.read_blob(slate_bundle::UKI_ROLE)?)
        .context("the old UKI's root image storage")?;
    let binary = new.read_blob(slate_bundle::INSTALLER_ROLE)?;
    let start = Instant::now();
    let seed = slate_machined::root_copy(&binary, storage)?.context("a binary under one block")?;
    let secs = start.elapsed().as_secs_f64();
    Ok(Some(Derived {
        index: slate_delta::ChunkIndex {
            params: slate_delta::DEFAULT_PARAMS,
            blobs: vec![seed.chunks],
        },
        secs,
    }))
}

fn seed_of(d: &slate_transport::SeedBlob) -> slate_delta::Seed<'_> {
    slate_delta::Seed {
        chunks: &d.chunks,
        file: &*d.file,
    }
}

/// Rounds of each assembly and of its baseline; the medians are reported.
const ROUNDS: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Assemble `new`'s indexed blobs on the side of a node running `old` (seeds: `old`'s blob
/// files; remote: `new`'s layout; a fresh chunk cache), each into a file, fsynced; then write
/// the same bytes from memory and fsync them, the disk's own speed. Medians of [`ROUNDS`].
fn assemble_timed(
    old: &Bundle,
    old_index: &slate_delta::ChunkIndex,
    new: &Bundle,
    index: &slate_delta::ChunkIndex,
    work: &Path,
) -> Result<Timed> {
    use slate_transport::chunks::{DirCache, FileSeed, LayoutRemote};
    use std::io::Write as _;
    let files: Vec<FileSeed> = blob_files(old, old_index)
        .iter()
        .map(|p| fs::File::open(p).map(FileSeed))
        .collect::<Result<_, _>>()?;
    let seeds: Vec<slate_delta::Seed<'_>> = old_index
        .blobs
        .iter()
        .zip(&files)
        .map(|(chunks, file)| slate_delta::Seed { chunks, file })
        .collect();
    let remote = LayoutRemote::new(new.dir());
    let binary = new
        .manifest()
        .blobs
        .get(slate_bundle::INSTALLER_ROLE)
        .context("no installer blob")?
        .digest
        .clone();
    let mut ordered: Vec<&slate_delta::BlobChunks> = index.blobs.iter().collect();
    ordered.sort_by_key(|b| b.oci_digest() != binary);
    let binary_to_derive = index
        .blob(&binary)
        .filter(|_| old_index.blob(&binary).is_none())
        .map(|b| b.digest);
    // Read before the pull, as the node reads its running UKI's.
    let storage = match binary_to_derive {
        Some(_) => {
            let bytes = old.read_blob(slate_bundle::UKI_ROLE)?;
            Some(slate_bundle_diff::root_storage(&bytes)?)
        }
        None => None,
    };
    let out = work.join("assembled");
    let cache_dir = work.join("chunk-cache");
    let bytes: u64 = index.blobs.iter().map(|b| b.size).sum();
    let (mut rounds, mut derive_rounds, mut peak_kib) = (Vec::new(), Vec::new(), 0);
    for round in 0..ROUNDS {
        let _ = fs::remove_dir_all(&cache_dir);
        let cache = DirCache::new(&cache_dir)?;
        // "5" resets the peak resident size to the current one (proc(5)): the peak after
        // is what the assembly added.
        fs::write("/proc/self/clear_refs", "5")?;
        let before = status_kib("VmRSS:")?;
        let start = Instant::now();
        // As a node pulls: the slate binary first, then, when it changed, the seed derived
        // from it (its copy in the new root) serves the blobs after it.
        let (mut derived, mut derive_secs) = (None, 0.0);
        for target in &ordered {
            let mut seeds = seeds.clone();
            if let Some(d) = &derived {
                seeds.push(seed_of(d));
            }
            let plan = slate_delta::plan(target, &seeds, Some(&cache))?;
            let mut file = fs::File::create(&out)?;
            let mut writer = std::io::BufWriter::with_capacity(1 << 20, &mut file);
            slate_delta::assemble(target, &plan, &seeds, &cache, &remote, 4, &mut writer)?;
            drop(writer);
            file.sync_all()?;
            if Some(target.digest) == binary_to_derive && derived.is_none() {
                if let Some(storage) = storage {
                    let start = Instant::now();
                    derived = slate_machined::root_copy(&fs::read(&out)?, storage)?;
                    derive_secs = start.elapsed().as_secs_f64();
                }
            }
        }
        rounds.push(start.elapsed().as_secs_f64());
        derive_rounds.push(derive_secs);
        if round == 0 {
            peak_kib = status_kib("VmHWM:")?.saturating_sub(before);
        }
    }
    let whole: Vec<Vec<u8>> = blob_files(new, index)
        .iter()
        .map(fs::read)
        .collect::<Result<_, _>>()?;
    let mut plain = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for blob in &whole {
            let mut file = fs::File::create(&out)?;
            file.write_all(blob)?;
            file.sync_all()?;
        }
        plain.push(start.elapsed().as_secs_f64());
    }
    // The floor under any assembly that checks what it writes: one SHA-256 pass over the
    // same bytes, on one core (an assembly makes two: each reused chunk against its signed
    // digest, then the whole blob).
    let mut hashed = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for blob in &whole {
            std::hint::black_box(slate_delta::sha256(blob));
        }
        hashed.push(start.elapsed().as_secs_f64());
    }
    let _ = fs::remove_file(&out);
    let _ = fs::remove_dir_all(&cache_dir);
    Ok(Timed {
        hash_secs: median(hashed),
        secs: median(rounds),
        derive_secs: median(derive_rounds),
        plain_secs: median(plain),
        bytes,
        peak_kib,
    })
}
