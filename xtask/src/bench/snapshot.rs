//! Benchmark (not a test): the Btrfs snapshot engine on a loop-mounted pool (mkfs.btrfs on a
//! 1 GiB file; root). Two comparisons:
//!
//! - time: `slate snapshot upgrade --command CMD` (snapshot, CMD chrooted with /proc, /sys,
//!   /dev bound, validation, the HMAC manifest of /usr and /boot, the ESP copies and entry)
//!   against CMD run chrooted on a plain copy of the same root — what the change costs without
//!   the transaction around it. CMD installs a "package" (300 files, about 5 MiB) into /usr.
//! - space: the bytes a snapshot adds to the pool for a one-file change (`btrfs filesystem
//!   usage -b`, "Used", after `btrfs filesystem sync`, so metadata counted as Btrfs stores it,
//!   DUP), against a full copy of the root's files: the shared extents at work.
//!
//! The root, `root-20260101-000000`, is the demo root (target/demo/rootfs) with the cached
//! kernel and an 8 MiB initramfs stand-in under /boot, the kernel's fs/ and net/ modules under
//! /usr/lib/modules, and 3,000 small files under /usr/share/bench. The ESP is a GPT disk image
//! with a FAT32 ESP made by slate's own crates, as the engine's tests make it. Every run starts
//! from the same state: a fresh copy of the empty ESP, and the previous run's snapshot removed
//! (subvolume deleted and cleaned, manifest removed) and synced, untimed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use slate_disk::FileDisk;

use crate::bench::{noise, print_ratios, stopwatch, Bench, Comparison, Sample, Side};
use crate::util::{output, repo_root, run};

const ROOT: &str = "root-20260101-000000";
const POOL_BYTES: u64 = 1 << 30;
const SMALL_FILES: usize = 3_000;
const PACKAGE_FILES: usize = 300;
/// The change both sides make: a package's files replaced under /usr.
const PACKAGE_CMD: &str = "rm -rf /usr/lib/bench-pkg && cp -a /opt/bench-pkg /usr/lib/bench-pkg";
const ONE_FILE_CMD: &str = "echo x > /usr/share/one-file";

/// The loop-mounted pool: the top level and the root snapshot mounted apart, as on a node.
/// Unmounted and detached on drop.
struct PoolMounts {
    loopdev: String,
    top: PathBuf,
    root: PathBuf,
}

impl Drop for PoolMounts {
    fn drop(&mut self) {
        for m in [&self.root, &self.top] {
            let _ = Command::new("umount").arg(m).output();
        }
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).output();
    }
}

fn mount_pool(work: &Path) -> Result<PoolMounts> {
    let img = work.join("pool.img");
    fs::File::create(&img)
        .and_then(|f| f.set_len(POOL_BYTES))
        .with_context(|| format!("creating {}", img.display()))?;
    output(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&img))
        .context("mkfs.btrfs (btrfs-progs)")?;
    let loopdev = output(Command::new("losetup").args(["-f", "--show"]).arg(&img))?
        .trim()
        .to_owned();
    let mounts = PoolMounts {
        loopdev,
        top: work.join("top"),
        root: work.join("root"),
    };
    for d in [&mounts.top, &mounts.root] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    run(Command::new("mount")
        .args(["-o", "subvolid=5", &mounts.loopdev])
        .arg(&mounts.top))?;
    run(Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(mounts.top.join(ROOT)))?;
    Ok(mounts)
}

/// The root tree: demo root, /boot, modules, small files, the package, fstab.
fn fill_root(root: &Path, uuid: &str) -> Result<u64> {
    let repo = repo_root();
    let demo = repo.join("target/demo/rootfs");
    ensure!(
        demo.join("usr/bin/slate").is_file(),
        "{} has no usr/bin/slate: run `cargo xtask vm-prep` first",
        demo.display()
    );
    run(Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", demo.display()))
        .arg(root))?;
    let modules = fs::canonicalize(repo.join(".cache/kernel/modules"))
        .context("run `cargo xtask kernel` first")?;
    let release = modules
        .file_name()
        .and_then(|n| n.to_str())
        .context("the modules directory's name")?
        .to_owned();
    let boot = root.join("boot");
    fs::create_dir_all(&boot)?;
    fs::copy(
        repo.join(".cache/kernel/vmlinuz"),
        boot.join(format!("vmlinuz-{release}")),
    )
    .context("copying the kernel")?;
    fs::write(boot.join(format!("initrd.img-{release}")), noise(8 << 20))?;
    let dest = root.join(format!("usr/lib/modules/{release}/kernel"));
    fs::create_dir_all(&dest)?;
    for sub in ["fs", "net"] {
        run(Command::new("cp")
            .arg("-a")
            .arg(modules.join("kernel").join(sub))
            .arg(&dest))?;
    }
    let bytes = noise(16 << 10);
    for i in 0..SMALL_FILES {
        let dir = root.join(format!("usr/share/bench/{:02}", i / 100));
        fs::create_dir_all(&dir)?;
        let len = 512 + (i * 977) % (bytes.len() - 512 - 64);
        fs::write(
            dir.join(format!("file-{i:04}")),
            &bytes[i % 64..i % 64 + len],
        )?;
    }
    let pkg = root.join("opt/bench-pkg");
    fs::create_dir_all(&pkg)?;
    let payload = noise(5 << 20);
    let each = payload.len() / PACKAGE_FILES;
    for i in 0..PACKAGE_FILES {
        fs::write(
            pkg.join(format!("lib-{i:03}.so")),
            &payload[i * each..(i + 1) * each],
        )?;
    }
    fs::write(
        root.join("etc/fstab"),
        format!("UUID={uuid}\t/\tbtrfs\tsubvol={ROOT}\t0\t0\n"),
    )?;
    let du = output(Command::new("du").args(["-sb"]).arg(root))?;
    du.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du -sb of the root")
}

/// A 42 MiB GPT disk image with a 40 MiB FAT32 ESP, through slate's crates.
fn make_esp(path: &Path) -> Result<()> {
    let mut disk = FileDisk::create(path, slate_testkit::esp::ESP_ONLY_DISK)?;
    slate_testkit::esp::esp_only(&mut disk, "bench-snapshot", 1);
    Ok(())
}

/// `Used:` of `btrfs filesystem usage -b`, after a sync.
fn used_bytes(top: &Path) -> Result<f64> {
    run(Command::new("btrfs").args(["filesystem", "sync"]).arg(top))?;
    let text = output(
        Command::new("btrfs")
            .args(["filesystem", "usage", "-b"])
            .arg(top),
    )?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Used:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no Used: in btrfs filesystem usage")
}

/// The bench's state between runs: the pool, the pristine ESP, the slate binary.
struct Fixture {
    slate: PathBuf,
    pool: PoolMounts,
    pristine_esp: PathBuf,
    esp: PathBuf,
}

impl Fixture {
    /// A fresh ESP, synced: untimed.
    fn reset_esp(&self) -> Result<()> {
        fs::copy(&self.pristine_esp, &self.esp).context("copying the ESP image")?;
        run(&mut Command::new("sync"))
    }

    /// `slate snapshot upgrade --command CMD`; returns the new snapshot's name.
    fn upgrade(&self, cmd: &str) -> Result<String> {
        let out = output(
            Command::new(&self.slate)
                .args(["snapshot", "upgrade", "--command", cmd, "--root"])
                .arg(&self.pool.root)
                .arg("--esp-disk")
                .arg(&self.esp),
        )?;
        ensure!(out.contains("done:"), "the upgrade said: {out}");
        let mut new: Vec<String> = fs::read_dir(&self.pool.top)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("root-") && n != ROOT)
            .collect();
        match (new.pop(), new.is_empty()) {
            (Some(n), true) => Ok(n),
            _ => bail!("expected one new snapshot beside {ROOT}"),
        }
    }

    /// Removes a snapshot the upgrade made (its subvolume, cleaned, and manifest), synced.
    fn remove(&self, snapshot: &str) -> Result<()> {
        run(Command::new("btrfs")
            .args(["-q", "subvolume", "delete"])
            .arg(self.pool.top.join(snapshot)))?;
        run(Command::new("btrfs")
            .args(["subvolume", "sync"])
            .arg(&self.pool.top))?;
        let manifest = self
            .pool
            .top
            .join(format!(".slate/manifests/{snapshot}.manifest"));
        let _ = fs::remove_file(manifest);
        run(Command::new("btrfs")
            .args(["filesystem", "sync"])
            .arg(&self.pool.top))
    }

    fn manifest_len(&self, snapshot: &str) -> Result<f64> {
        let path = self
            .pool
            .top
            .join(format!(".slate/manifests/{snapshot}.manifest"));
        Ok(fs::metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .len() as f64)
    }
}

/// `slate`: the binary to measure; `None` builds the static one as the other benchmarks do
/// (`xtask vm-prep`, which also rebuilds target/demo/rootfs).
pub fn bench_snapshot(slate: Option<&Path>) -> Result<Vec<Comparison>> {
    ensure!(
        output(Command::new("id").arg("-u"))?.trim() == "0",
        "bench-snapshot needs root: it loop-mounts a Btrfs pool"
    );
    let slate = match slate {
        Some(s) => fs::canonicalize(s).with_context(|| format!("{}", s.display()))?,
        None => crate::vm_test::prepare()?.slate,
    };
    let work = repo_root().join("target/bench/snapshot");
    if work.exists() {
        // A killed run may have left its mounts there.
        for m in ["root", "top"] {
            let _ = Command::new("umount").arg(work.join(m)).output();
        }
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let pool = mount_pool(&work)?;
    let uuid = output(Command::new("blkid").args(["-s", "UUID", "-o", "value", &pool.loopdev]))?
        .trim()
        .to_owned();
    let root_bytes = fill_root(&pool.top.join(ROOT), &uuid)?;
    let files = output(Command::new("find").arg(pool.top.join(ROOT)))?
        .lines()
        .count();
    // The baseline's copy of the root, beside it on the same pool (a plain directory).
    let copy = pool.top.join("copy");
    run(Command::new("cp")
        .arg("-a")
        .arg(pool.top.join(ROOT))
        .arg(&copy))?;
    run(Command::new("mount")
        .args(["-o", &format!("subvol={ROOT}"), &pool.loopdev])
        .arg(&pool.root))?;
    let fixture = Fixture {
        slate,
        pristine_esp: work.join("esp-pristine.img"),
        esp: work.join("esp.img"),
        pool,
    };
    make_esp(&fixture.pristine_esp)?;

    let about = format!(
        "root {ROOT}: {files} entries, {:.0} MiB; pool 1 GiB on a loop device",
        root_bytes as f64 / f64::from(1 << 20)
    );
    let slate_side = Side::new("slate snapshot upgrade", |_| {
        fixture.reset_esp()?;
        let (new, secs) = stopwatch(|| fixture.upgrade(PACKAGE_CMD))?;
        fixture.remove(&new)?;
        Ok(Sample::new(secs))
    });
    let baseline = Side::new("chroot CMD on a copy", |_| {
        run(&mut Command::new("sync"))?;
        let ((), secs) = stopwatch(|| {
            run(Command::new("chroot")
                .arg(&copy)
                .args(["/bin/sh", "-c", PACKAGE_CMD]))
        })?;
        Ok(Sample::new(secs))
    });
    let time = Bench::new("snapshot upgrade", "s")
        .about(about.clone())
        .about(format!("CMD: {PACKAGE_CMD} ({PACKAGE_FILES} files, 5 MiB)"))
        .about("slate: snapshot, CMD chrooted, validate, manifest, ESP copies + entry")
        .about("baseline: chroot <copy of the root> /bin/sh -c CMD")
        .run(slate_side, baseline, vec![])?;
    time.print();

    let space_side = Side::new("snapshot + one-file change", |_| {
        fixture.reset_esp()?;
        let before = used_bytes(&fixture.pool.top)?;
        let new = fixture.upgrade(ONE_FILE_CMD)?;
        let after = used_bytes(&fixture.pool.top)?;
        let manifest = fixture.manifest_len(&new)?;
        fixture.remove(&new)?;
        Ok(Sample::new(after - before).with("manifest", "B", manifest))
    });
    let mut space = Bench::new("snapshot space, one-file change", "B")
        .about(about)
        .about(format!("CMD: {ONE_FILE_CMD}"))
        .about("slate: pool Used (btrfs filesystem usage -b, after sync) after - before;")
        .about("it includes the snapshot's manifest in <top>/.slate (figure below); the walk")
        .about("reads with O_NOATIME on a noatime top level, so reading dirties no metadata")
        .about("baseline: the root's files copied whole (du -sb)")
        .no_warm_up("a size, not a time")
        .run(
            space_side,
            Side::computed("full copy (du -sb)", root_bytes as f64),
            vec![],
        )?;
    if let Some(manifest) = space.slate.figure("manifest") {
        let added = space.slate.stats().median - manifest;
        space.extra(
            "without_manifest",
            serde_json::json!(added),
            format!("added by the snapshot itself (Used delta - manifest): {added:.0} B"),
        );
    }
    space.print();
    drop(fixture);
    let comparisons = vec![time, space];
    print_ratios(&comparisons);
    if std::env::var_os("SLATE_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&work);
    }
    Ok(comparisons)
}
