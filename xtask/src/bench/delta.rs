//! Delta benchmark (not a test; issue 41): pairs of demo installer bundles, and what a node
//! running the first fetches to get the second — slate's chunks (from the two signed chunk
//! indexes, plus the new index) against casync's (Debian's `casync`, its default chunk sizes,
//! the old blobs as seed: the chunks of the new blobs' stores that the old blobs' store lacks,
//! compressed as casync serves them and uncompressed), on the same blobs (the UKI and the
//! installer) in the same run; and the bundle build time beside the time of the index alone.
//!
//! Pairs: (a) version only, (b) version and one 1 MiB file (random bytes) added to the root.
//! Not yet: (c) a package replaced, (d) slate rebuilt with a small change, (e) another kernel.
//! Inputs: the demo profile's (`xtask kernel`, `xtask slate-static`, `xtask base-rootfs`),
//! copied under target/bench/delta so builds elsewhere do not change them mid-run.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use slate_bundle::Bundle;

use crate::util::{output, repo_root, run};

const ROLES: [&str; 2] = [slate_bundle::UKI_ROLE, slate_bundle::INSTALLER_ROLE];

/// The demo profile with its inputs' paths made absolute (under `inputs`) and the root `root`.
fn profile(inputs: &Path, root: &Path) -> Result<String> {
    let text = fs::read_to_string(repo_root().join("profiles/demo.toml"))?;
    let abs = |rel: &str| format!("{}/", inputs.join(rel).display());
    Ok(text
        .replace("../.cache/kernel/", &abs("kernel"))
        .replace("../target/demo/rootfs", &root.display().to_string())
        .replace(
            "../target/static/x86_64-unknown-linux-gnu/release/",
            &abs("static"),
        )
        .replace("../target/demo/keys/", &abs("keys")))
}

fn copy_inputs(inputs: &Path) -> Result<()> {
    let root = repo_root();
    let _ = fs::remove_dir_all(inputs);
    fs::create_dir_all(inputs.join("kernel"))?;
    fs::create_dir_all(inputs.join("static"))?;
    let static_dir = root.join("target/static/x86_64-unknown-linux-gnu/release");
    for (from, to) in [
        (root.join(".cache/kernel/vmlinuz"), inputs.join("kernel")),
        (root.join(".cache/kernel/modules"), inputs.join("kernel")),
        (root.join("target/demo/rootfs"), inputs.join("rootfs")),
        (root.join("target/demo/keys"), inputs.join("keys")),
        (static_dir.join("slate"), inputs.join("static")),
        (static_dir.join("slate-init"), inputs.join("static")),
    ] {
        if !from.exists() {
            bail!(
                "{} is missing: run `cargo xtask kernel`, `cargo xtask slate-static` and \
                 `cargo xtask base-rootfs` first",
                from.display()
            );
        }
        // -H: the inputs may be links (a worktree's to a checkout's), their insides not.
        run(Command::new("cp").arg("-aH").arg(&from).arg(&to))?;
    }
    // (b): one 1 MiB file of random bytes in the root, the same bytes every run.
    run(Command::new("cp")
        .arg("-a")
        .arg(inputs.join("rootfs"))
        .arg(inputs.join("rootfs-plus")))?;
    let mut x: u64 = 41;
    let bytes: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(inputs.join("rootfs-plus/root/added.bin"), bytes)?;
    Ok(())
}

/// Build an installer bundle; its wall time in seconds.
fn build(slate: &Path, profile: &Path, version: &str, out: &Path) -> Result<f64> {
    let _ = fs::remove_dir_all(out);
    let start = Instant::now();
    output(
        Command::new(slate)
            .args(["imager", "build", "--profile"])
            .arg(profile)
            .args(["--version", version, "--output", "installer", "--out"])
            .arg(out)
            .env("SOURCE_DATE_EPOCH", "1700000000"),
    )?;
    Ok(start.elapsed().as_secs_f64())
}

/// The blob files of `roles` in the bundle at `dir`.
fn blob_files(bundle: &Bundle) -> Result<Vec<PathBuf>> {
    ROLES
        .iter()
        .map(|role| {
            let blob = bundle.blob_ref(role)?;
            let hex = blob
                .digest
                .strip_prefix("sha256:")
                .context("a sha256 digest")?;
            Ok(bundle.dir().join("blobs/sha256").join(hex))
        })
        .collect()
}

/// casync's chunk store of `blobs` in `store`: chunk id → (compressed size).
fn casync_store(blobs: &[PathBuf], store: &Path) -> Result<BTreeSet<(String, u64)>> {
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
    for shard in fs::read_dir(store)? {
        let shard = shard?;
        if !shard.file_type()?.is_dir() {
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
    Ok(chunks)
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
    copy_inputs(&inputs)?;
    let (plain, plus) = (work.join("demo.toml"), work.join("demo-plus.toml"));
    fs::write(&plain, profile(&inputs, &inputs.join("rootfs"))?)?;
    fs::write(&plus, profile(&inputs, &inputs.join("rootfs-plus"))?)?;
    let v1 = work.join("v1");
    let build_secs = build(&slate, &plain, "1.0.0", &v1)?;
    let pairs = [
        ("(a) version only", &plain, "2.0.0", work.join("v2")),
        (
            "(b) +1 MiB file in the root",
            &plus,
            "2.0.0",
            work.join("v2-plus"),
        ),
    ];
    let old = Bundle::open(&v1, None)?;
    let old_index = old.chunk_index()?.context("v1 carries no chunk index")?;
    let old_store = casync_store(&blob_files(&old)?, &work.join("casync-v1"))?;
    println!(
        "{:<30} {:>12} {:>12} {:>7} {:>7} {:>12} {:>7} {:>7}",
        "pair", "full B", "slate B", "slate%", "chunks", "casync B", "casync%", "chunks"
    );
    let mut index_secs = 0.0;
    let mut assembly = Vec::new();
    for (name, profile, version, out) in pairs {
        build(&slate, profile, version, &out)?;
        let new = Bundle::open(&out, None)?;
        let index = new
            .chunk_index()?
            .context("the new bundle carries no chunk index")?;
        let estimate = slate_delta::estimate(&index, &[&old_index]);
        let files = blob_files(&new)?;
        let blobs: Vec<Vec<u8>> = files.iter().map(fs::read).collect::<Result<_, _>>()?;
        let start = Instant::now();
        let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
        let again = slate_bundle::index_of(&refs, index.params).context("an index")?;
        index_secs = start.elapsed().as_secs_f64();
        anyhow::ensure!(again == index, "the index is not reproducible");
        assembly.push((name, assemble_timed(&old, &old_index, &new, &index, &work)?));
        let store = casync_store(&files, &work.join("casync-new"))?;
        let (casync_bytes, casync_chunks) = casync_fetch(&old_store, &store);
        let full = estimate.full_bytes();
        let pct = |n: u64| 100.0 * n as f64 / full as f64;
        println!(
            "{:<30} {:>12} {:>12} {:>6.2}% {:>7} {:>12} {:>6.2}% {:>7}",
            name,
            full,
            estimate.fetch_bytes(),
            pct(estimate.fetch_bytes()),
            estimate.fetch_chunks(),
            casync_bytes,
            pct(casync_bytes),
            casync_chunks
        );
    }
    for (name, (secs, plain, bytes)) in assembly {
        println!(
            "{name}: node-side assembly of the UKI and installer ({bytes} bytes, from v1's blobs \
             and v2's layout, fsynced): {secs:.3} s; the same bytes written and fsynced: \
             {plain:.3} s ({:.0} % of that speed)",
            100.0 * plain / secs
        );
    }
    println!(
        "bundle build (v1): {build_secs:.2} s; of which the chunk index of its blobs, \
         recomputed here: {index_secs:.2} s (so without it {:.2} s, {:.3}x)",
        build_secs - index_secs,
        build_secs / (build_secs - index_secs).max(1e-9)
    );
    Ok(())
}

/// Assemble `new`'s indexed blobs on the side of a node running `old` (seeds: `old`'s blob
/// files; remote: `new`'s layout; a fresh chunk cache), each into a file, fsynced. Returns the
/// seconds, the seconds of writing the same bytes plainly (and fsyncing), and the bytes.
fn assemble_timed(
    old: &Bundle,
    old_index: &slate_delta::ChunkIndex,
    new: &Bundle,
    index: &slate_delta::ChunkIndex,
    work: &Path,
) -> Result<(f64, f64, u64)> {
    use slate_transport::chunks::{DirCache, FileSeed, LayoutRemote};
    use std::io::Write as _;
    let files: Vec<FileSeed> = blob_files(old)?
        .iter()
        .map(|p| fs::File::open(p).map(FileSeed))
        .collect::<Result<_, _>>()?;
    let seeds: Vec<slate_delta::Seed<'_>> = old_index
        .blobs
        .iter()
        .zip(&files)
        .map(|(chunks, file)| slate_delta::Seed { chunks, file })
        .collect();
    let cache_dir = work.join("chunk-cache");
    let _ = fs::remove_dir_all(&cache_dir);
    let cache = DirCache::new(&cache_dir)?;
    let remote = LayoutRemote::new(new.dir());
    let out = work.join("assembled");
    let (mut secs, mut bytes) = (0.0, 0);
    for target in &index.blobs {
        let start = Instant::now();
        let plan = slate_delta::plan(target, &seeds, Some(&cache))?;
        let mut file = fs::File::create(&out)?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, &mut file);
        slate_delta::assemble(target, &plan, &seeds, &cache, &remote, 4, &mut writer)?;
        drop(writer);
        file.sync_all()?;
        secs += start.elapsed().as_secs_f64();
        bytes += target.size;
    }
    let whole: Vec<Vec<u8>> = blob_files(new)?
        .iter()
        .map(fs::read)
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    for blob in &whole {
        let mut file = fs::File::create(&out)?;
        file.write_all(blob)?;
        file.sync_all()?;
    }
    let plain = start.elapsed().as_secs_f64();
    let _ = fs::remove_file(&out);
    Ok((secs, plain, bytes))
}
