//! Root filesystem benchmark (not a test): slate's squashfs builder against mksquashfs on all
//! cores (same tree, zstd level 15, 128 KiB blocks), with mksquashfs on one core as a further
//! reference, on the demo root and on a larger tree (the kernel's network drivers).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use slate_rootfs::{build_squashfs, Compression, SquashfsOptions};

use crate::bench::{print_ratios, stopwatch, Bench, Comparison, Sample, Side};
use crate::util::{repo_root, run};

const ZSTD_LEVEL: u32 = 15;

fn slate_rootfs(tree: &Path, out: &Path) -> Result<()> {
    let file = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    // Everything else (block size, compression threads) as the imager leaves it by default.
    let opts = SquashfsOptions {
        compression: Compression::Zstd { level: ZSTD_LEVEL },
        ..SquashfsOptions::default()
    };
    build_squashfs(tree, std::io::BufWriter::new(file), &opts)?;
    Ok(())
}

pub(crate) fn mksquashfs(tree: &Path, out: &Path, processors: Option<u32>) -> Result<()> {
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
    run(&mut cmd)
}

/// A side that builds `out` with `build`, timed, and records the image's size.
fn building<'a>(name: &str, out: PathBuf, build: impl Fn(&Path) -> Result<()> + 'a) -> Side<'a> {
    Side::new(name, move |_| {
        let ((), secs) = stopwatch(|| build(&out))?;
        let size = fs::metadata(&out)
            .with_context(|| format!("reading {}", out.display()))?
            .len();
        Ok(Sample::new(secs).with("size", "B", size as f64))
    })
}

/// The demo root (built by `vm_test::prepare`) and the kernel's network drivers.
pub fn bench_rootfs() -> Result<Vec<Comparison>> {
    crate::vm_test::prepare()?;
    let root = repo_root();
    let trees = [
        ("demo root", root.join("target/demo/rootfs")),
        (
            "kernel drivers/net",
            fs::canonicalize(root.join(".cache/kernel/modules"))
                .context("run `xtask kernel` first")?
                .join("kernel/drivers/net"),
        ),
    ];
    let work = root.join("target/bench/rootfs");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let mut comparisons = Vec::new();
    for (name, tree) in trees {
        ensure!(tree.is_dir(), "{} is missing", tree.display());
        let bench = Bench::new(&format!("rootfs {name}"), "s").about(format!(
            "squashfs of {}, zstd {ZSTD_LEVEL}, 128 KiB blocks",
            tree.display()
        ));
        let slate = building(
            "slate_rootfs::build_squashfs",
            work.join("slate.sqsh"),
            |out| slate_rootfs(&tree, out),
        );
        let all = building("mksquashfs all cores", work.join("mk.sqsh"), |out| {
            mksquashfs(&tree, out, None)
        });
        let one = building("mksquashfs 1 core", work.join("mk1.sqsh"), |out| {
            mksquashfs(&tree, out, Some(1))
        });
        let mut c = bench.run(slate, all, vec![one])?;
        let (s, b) = (c.slate.figure("size"), c.baseline.figure("size"));
        if let (Some(s), Some(b)) = (s, b) {
            c.extra(
                "size_ratio",
                serde_json::json!(s / b),
                format!("size ratio (slate / mksquashfs): {:.4}", s / b),
            );
        }
        c.print();
        comparisons.push(c);
    }
    fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    print_ratios(&comparisons);
    Ok(comparisons)
}
