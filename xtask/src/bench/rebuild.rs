//! Incremental image builds (issue 43; not a test): the demo profile's installer bundle built
//! by `slate imager build` as vm-prep builds it, again after one file of the root changed, with
//! the build cache (`--cache`) against a clean build of the same tree. Every run checks that
//! the cached rebuild wrote the bytes the clean build wrote. Further references from the same
//! runs: mksquashfs alone on the changed root, and the clean build of the root squashfs alone,
//! from which "mksquashfs + the rest of today's pipeline" is computed.

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use sha2::{Digest as _, Sha256};

use crate::bench::{print_ratios, stopwatch, Bench, Comparison, Sample, Side};
use crate::util::{output, repo_root, run};

/// The file of the root each rebuild changes: small, as most edits of an OS's files are; it
/// lands in a fragment block shared with other small files.
const CHANGED: &str = "usr/share/slate/www/index.html";

/// The demo profile with its inputs' paths made absolute and its root at `root`.
fn profile(root: &Path) -> Result<String> {
    let repo = repo_root();
    let text = fs::read_to_string(repo.join("profiles/demo.toml"))?;
    let text = text.replace(
        "\"../target/demo/rootfs\"",
        &format!("{:?}", root.display()),
    );
    Ok(text.replace("\"../", &format!("\"{}/", repo.display())))
}

/// `slate imager build --output KIND` of the profile into `out` (removed first), with a
/// cache or without; what it printed.
fn build(
    slate: &Path,
    profile: &Path,
    kind: &str,
    out: &Path,
    cache: Option<&Path>,
) -> Result<String> {
    let _ = fs::remove_dir_all(out);
    let _ = fs::remove_file(out);
    let mut cmd = Command::new(slate);
    cmd.args(["imager", "build", "--profile"])
        .arg(profile)
        .args(["--output", kind, "--out"])
        .arg(out)
        .env("SOURCE_DATE_EPOCH", "1700000000");
    if let Some(cache) = cache {
        cmd.arg("--cache").arg(cache);
    }
    output(&mut cmd)
}

/// SHA-256 over a directory's files (relative path and bytes, in path order) or a file.
fn digest(path: &Path) -> Result<String> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
        for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, files)?;
            } else {
                files.push(path);
            }
        }
        Ok(())
    }
    let mut h = Sha256::new();
    if path.is_dir() {
        let mut files = Vec::new();
        walk(path, &mut files)?;
        files.sort();
        for file in files {
            h.update(file.strip_prefix(path)?.as_os_str().as_encoded_bytes());
            h.update([0]);
            h.update(fs::read(&file)?);
        }
    } else {
        h.update(fs::read(path)?);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// The count after `label` in the CLI's "build cache: N reused, M stored, …" line.
fn cache_count(said: &str, label: &str) -> Result<f64> {
    let line = said
        .lines()
        .find(|l| l.starts_with("build cache:"))
        .with_context(|| format!("no cache line in:\n{said}"))?;
    let before = line
        .split(',')
        .find(|part| part.trim_end().ends_with(label))
        .with_context(|| format!("no {label:?} in {line:?}"))?;
    let n = before
        .trim_end()
        .strip_suffix(label)
        .unwrap_or_default()
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default();
    n.parse()
        .with_context(|| format!("{n:?} in {line:?} is not a count"))
}

pub fn bench_rebuild(slate: Option<&Path>) -> Result<Vec<Comparison>> {
    // What the demo profile names, as vm-prep makes it (not the Debian root it also makes).
    crate::kernel::kernel(false)?;
    let static_slate = crate::slate_static::slate_static()?;
    let keys = crate::vm_test::demo_keys();
    if !keys.join("slate.pub").exists() {
        let _ = fs::remove_dir_all(&keys);
        run(Command::new(&static_slate)
            .args(["keygen", "--out"])
            .arg(&keys))?;
    }
    let repo = repo_root();
    crate::base_rootfs::base_rootfs(
        &repo.join("target/demo/rootfs"),
        "0",
        Some(&static_slate),
        true,
    )?;
    let slate = slate.map_or(static_slate, Path::to_path_buf);
    let work = repo.join("target/bench/rebuild");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    // A copy of the demo root, so that vm-prep elsewhere never sees the changed file.
    let root = work.join("root");
    run(Command::new("cp")
        .arg("-a")
        .arg(repo.join("target/demo/rootfs"))
        .arg(&root))?;
    let original = fs::read_to_string(root.join(CHANGED))
        .with_context(|| format!("the demo root has no {CHANGED}"))?;
    let profile_path = work.join("demo.toml");
    fs::write(&profile_path, profile(&root)?)?;
    let cache = work.join("cache");
    // The digest of the last cached rebuild, which the clean build of the same tree must match.
    let rebuilt: RefCell<Option<String>> = RefCell::new(None);

    let bench = Bench::new("rebuild after one file changed", "s")
        .about(format!(
            "demo installer bundle (`slate imager build --output installer`, {}); each run \
             changes /{CHANGED}",
            slate.display()
        ))
        .about("warm-up: the first build with an empty cache (fills it)");
    let cached = Side::new("rebuild with --cache", |run_no| {
        // Each run's change is new to the cache, as the next edit of a day's work is.
        fs::write(
            root.join(CHANGED),
            format!("{original}<!-- rebuild {run_no} -->\n"),
        )?;
        let out = work.join("cached");
        let (said, secs) =
            stopwatch(|| build(&slate, &profile_path, "installer", &out, Some(&cache)))?;
        *rebuilt.borrow_mut() = Some(digest(&out)?);
        Ok(Sample::new(secs)
            .with("reused", "entries", cache_count(&said, "reused")?)
            .with("stored", "entries", cache_count(&said, "stored")?))
    });
    let clean = Side::new("clean build", |_| {
        let out = work.join("clean");
        let ((), secs) =
            stopwatch(|| build(&slate, &profile_path, "installer", &out, None).map(drop))?;
        let clean = digest(&out)?;
        let cached = rebuilt
            .borrow_mut()
            .take()
            .context("the cached rebuild ran first")?;
        ensure!(
            cached == clean,
            "the cached rebuild wrote other bytes than a clean build of the same tree \
             (sha256 {cached} vs {clean})"
        );
        Ok(Sample::new(secs))
    });
    let mksquashfs = Side::new("mksquashfs of the root alone", |_| {
        let out = work.join("mk.sqsh");
        let _ = fs::remove_file(&out);
        let ((), secs) = stopwatch(|| crate::bench::rootfs::mksquashfs(&root, &out, None))?;
        Ok(Sample::new(secs))
    });
    let rootfs = Side::new("clean build of the root squashfs", |_| {
        let out = work.join("rootfs.sqsh");
        let ((), secs) =
            stopwatch(|| build(&slate, &profile_path, "rootfs", &out, None).map(drop))?;
        Ok(Sample::new(secs))
    });
    let mut c = bench.run(cached, clean, vec![mksquashfs, rootfs])?;
    c.extra(
        "byte_identical",
        serde_json::json!(true),
        "every cached rebuild's bundle: the same SHA-256 as the clean build of its tree",
    );
    let medians: Vec<f64> = c.also.iter().map(|m| m.stats().median).collect();
    if let [mk, sqsh] = medians[..] {
        let pipeline = c.baseline.stats().median - sqsh + mk;
        let r = c.slate.stats().median / pipeline;
        c.extra(
            "mksquashfs_pipeline_s",
            serde_json::json!(pipeline),
            format!(
                "mksquashfs + the rest of today's pipeline (clean build - its squashfs + \
                 mksquashfs): {pipeline:.3} s; rebuild / that: {r:.2}x"
            ),
        );
    }
    c.extra(
        "target",
        serde_json::json!(0.25),
        "target (issue 43): rebuild <= 0.25x the clean build",
    );
    c.print();
    fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    let comparisons = vec![c];
    print_ratios(&comparisons);
    Ok(comparisons)
}
