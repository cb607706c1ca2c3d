//! Benchmarks (not tests): each prints ratios against a named baseline measured in the same run,
//! because these machines are shared and absolute times mean little.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use slate_rootfs::{build_squashfs, Compression, SquashfsOptions};

use crate::util::{repo_root, run};

const RUNS: usize = 3;
const ZSTD_LEVEL: u32 = 15;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn time_runs(mut f: impl FnMut() -> Result<u64>) -> Result<(Duration, u64)> {
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..RUNS {
        let start = Instant::now();
        size = f()?;
        times.push(start.elapsed());
    }
    Ok((median(times), size))
}

fn slate_rootfs(tree: &Path, out: &Path) -> Result<u64> {
    let file = std::fs::File::create(out)?;
    let opts = SquashfsOptions {
        compression: Compression::Zstd { level: ZSTD_LEVEL },
        ..SquashfsOptions::default()
    };
    build_squashfs(tree, std::io::BufWriter::new(file), &opts)?;
    Ok(std::fs::metadata(out)?.len())
}

fn mksquashfs(tree: &Path, out: &Path, processors: Option<u32>) -> Result<u64> {
    let mut cmd = Command::new("mksquashfs");
    cmd.arg(tree)
        .arg(out)
        .args(["-noappend", "-quiet", "-no-progress"]);
    cmd.args([
        "-comp",
        "zstd",
        "-Xcompression-level",
        &ZSTD_LEVEL.to_string(),
    ]);
    cmd.args(["-all-root", "-mkfs-time", "0", "-all-time", "0"]);
    if let Some(n) = processors {
        cmd.args(["-processors", &n.to_string()]);
    }
    run(&mut cmd)?;
    Ok(std::fs::metadata(out)?.len())
}

/// slate's squashfs builder against mksquashfs (same tree, zstd level 15, 128 KiB blocks), on
/// the demo root and on a larger tree (the kernel's network drivers).
pub fn bench_rootfs() -> Result<()> {
    let root = repo_root();
    let trees = [
        ("demo rootfs", root.join("target/demo/rootfs")),
        (
            "kernel drivers/net",
            std::fs::canonicalize(root.join(".cache/kernel/modules"))
                .context("run `xtask kernel` first")?
                .join("kernel/drivers/net"),
        ),
    ];
    let work = tempfile_dir()?;
    println!(
        "squashfs build, zstd {ZSTD_LEVEL}, median of {RUNS} runs; ratio = slate / mksquashfs"
    );
    for (name, tree) in trees {
        ensure!(
            tree.is_dir(),
            "{} is missing (run `xtask demo` or `xtask kernel`)",
            tree.display()
        );
        let (slate_t, slate_s) = time_runs(|| slate_rootfs(&tree, &work.join("slate.sqsh")))?;
        let (mk_t, mk_s) = time_runs(|| mksquashfs(&tree, &work.join("mk.sqsh"), None))?;
        let (mk1_t, _) = time_runs(|| mksquashfs(&tree, &work.join("mk1.sqsh"), Some(1)))?;
        println!("{name}:");
        println!(
            "  time: slate {slate_t:.2?}, mksquashfs {mk_t:.2?} (all cores), {mk1_t:.2?} (1 core)"
        );
        println!(
            "  time ratio: {:.2}x vs mksquashfs all cores, {:.2}x vs mksquashfs 1 core",
            slate_t.as_secs_f64() / mk_t.as_secs_f64(),
            slate_t.as_secs_f64() / mk1_t.as_secs_f64()
        );
        println!(
            "  size: slate {slate_s} B, mksquashfs {mk_s} B, ratio {:.4}",
            slate_s as f64 / mk_s as f64
        );
    }
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = repo_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
