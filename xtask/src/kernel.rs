//! `xtask kernel`: a cache of Debian's kernel for VM images, at `<repo>/.cache/kernel/`.
//!
//! Layout: `root/` (the unpacked `linux-image-<release>` package), `KERNEL` (path of vmlinuz),
//! `RELEASE` (`uname -r`), `MODULES` (path of `lib/modules/<release>`), `COMPRESSION` (how
//! the package shipped its modules; the cache always holds plain `.ko`), `STAMP` (package and
//! version the cache was made from; written last, so a cache without it is rebuilt).
//! `root/lib/modules/<release>/modules.dep` is generated here with the host's `depmod`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use slate_modules::ModuleDeps;

use crate::util::{self, output, run};

/// The modules an initramfs for the reference VM needs (see DESIGN.md).
pub const INITRAMFS_MODULES: [&str; 8] = [
    "virtio_blk",
    "squashfs",
    "loop",
    "overlay",
    "vfat",
    "ext4",
    "efivarfs",
    "i6300esb",
];

/// Compressed module suffixes and the command that decompresses files in place.
const COMPRESSED: [(&str, &[&str]); 3] = [
    (".ko.xz", &["xz", "-d", "-q", "-T1"]),
    (".ko.zst", &["zstd", "-d", "-q", "--rm"]),
    (".ko.gz", &["gzip", "-d", "-q"]),
];

pub fn kernel(force: bool) -> Result<()> {
    let cache = util::repo_root().join(".cache/kernel");
    let package = versioned_package()?;
    let version = util::candidate_version(&package)?;
    let stamp_text = format!("{package} {version}\n");
    let stamp = cache.join("STAMP");
    let fresh = fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text)
        && [
            "KERNEL",
            "RELEASE",
            "MODULES",
            "COMPRESSION",
            "vmlinuz",
            "modules",
        ]
        .iter()
        .all(|f| cache.join(f).exists());
    if fresh && !force {
        println!("kernel cache up to date ({package} {version}); nothing to do");
    } else {
        println!("building kernel cache from {package} {version}");
        build(&cache, &package, &version)?;
        util::write_atomic(&stamp, &stamp_text)?;
    }
    report(&cache)
}

/// A kernel cache like `.cache/kernel` in `cache`, of `package` at `version` (bench-delta's
/// older kernel), made unless its stamp says it is there.
pub fn kernel_at(cache: &Path, package: &str, version: &str) -> Result<()> {
    let stamp_text = format!("{package} {version}\n");
    let stamp = cache.join("STAMP");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text)
        && ["vmlinuz", "modules"]
            .iter()
            .all(|f| cache.join(f).exists())
    {
        return Ok(());
    }
    println!(
        "building a kernel cache from {package} {version} in {}",
        cache.display()
    );
    build(cache, package, version)?;
    util::write_atomic(&stamp, &stamp_text)
}

/// `linux-image-amd64` is a metapackage; the kernel is in the package it depends on.
fn versioned_package() -> Result<String> {
    let depends = output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && p.ends_with("-amd64") && !p.starts_with('<'))
        .map(str::to_owned)
        .context("`apt-cache depends linux-image-amd64` names no linux-image-*-amd64 package")
}

fn build(cache: &Path, package: &str, version: &str) -> Result<()> {
    let deb = util::download_deb(package, version, &cache.join("debs"))?;
    let root = cache.join("root");
    util::unpack_deb(&deb, &root)?;

    let boot = root.join("boot");
    let mut kernels: Vec<PathBuf> = Vec::new();
    for entry in fs::read_dir(&boot).with_context(|| format!("reading {}", boot.display()))? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        {
            kernels.push(path);
        }
    }
    let [vmlinuz] = kernels.as_slice() else {
        bail!(
            "expected exactly one vmlinuz-* in {}, found {kernels:?}",
            boot.display()
        );
    };
    let release = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_owned()
        })
        .unwrap_or_default();
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| root.join(d).join(&release))
        .find(|d| d.is_dir())
        .with_context(|| format!("no lib/modules/{release} in {}", root.display()))?;

    let shipped = match decompress_modules(&modules)? {
        0 => "uncompressed .ko".to_owned(),
        n => format!("compressed ({n} files), decompressed to .ko in the cache"),
    };
    println!("  modules as shipped: {shipped}");
    // Debian ships no modules.dep: the package's postinst runs depmod on the installed
    // system. Run the real depmod on the unpacked tree (after any decompression, so the
    // index names the .ko files that are actually there).
    println!("  depmod -b {} {release}", root.display());
    run(Command::new(depmod()).arg("-b").arg(&root).arg(&release)).context(
        "running depmod to create modules.dep (it is in Debian's kmod package: apt-get install kmod)",
    )?;
    // Every path modules.dep names must be on disk, or the initramfs builder would fail late.
    let deps = load_deps(&modules)?;
    for (_, rel) in deps.iter() {
        ensure!(
            modules.join(rel).is_file(),
            "modules.dep names missing file {rel}"
        );
    }
    println!("  {} loadable modules in {}", deps.len(), modules.display());

    util::write_atomic(&cache.join("KERNEL"), &format!("{}\n", vmlinuz.display()))?;
    util::write_atomic(&cache.join("RELEASE"), &format!("{release}\n"))?;
    util::write_atomic(&cache.join("MODULES"), &format!("{}\n", modules.display()))?;
    util::write_atomic(&cache.join("COMPRESSION"), &format!("{shipped}\n"))?;
    // Stable names for profiles, whatever the release: `vmlinuz` and `modules`.
    for (link, target) in [
        ("vmlinuz", vmlinuz.as_path()),
        ("modules", modules.as_path()),
    ] {
        let link = cache.join(link);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

/// depmod lives in /usr/sbin, which an unprivileged user's PATH often lacks.
fn depmod() -> PathBuf {
    ["/usr/sbin/depmod", "/sbin/depmod"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("depmod"))
}

/// Decompresses `.ko.{xz,zst,gz}` in place, because the initramfs loads plain files and the
/// kernel may lack in-kernel module decompression. Returns how many files were converted.
fn decompress_modules(modules: &Path) -> Result<usize> {
    let mut files = Vec::new();
    walk_files(modules, &mut files)?;
    let mut total = 0;
    for (suffix, cmd) in COMPRESSED {
        let mut matching: Vec<&PathBuf> = files
            .iter()
            .filter(|p| p.to_string_lossy().ends_with(suffix))
            .collect();
        if matching.is_empty() {
            continue;
        }
        matching.sort();
        println!(
            "  decompressing {} {suffix} modules with {}",
            matching.len(),
            cmd[0]
        );
        // Batches keep argv well under the kernel's limit.
        for batch in matching.chunks(256) {
            run(Command::new(cmd[0]).args(&cmd[1..]).args(batch))?;
        }
        total += matching.len();
    }
    Ok(total)
}

fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn load_deps(modules: &Path) -> Result<ModuleDeps> {
    let read = |name: &str| {
        let path = modules.join(name);
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let dep = read("modules.dep")?;
    let builtin = read("modules.builtin")?;
    ModuleDeps::parse(&dep)
        .and_then(|d| d.with_builtin(&builtin))
        .with_context(|| format!("parsing the indexes in {}", modules.display()))
}

/// Prints the facts later tasks rely on: release, kernel path, compression, and how each
/// initramfs module is provided.
fn report(cache: &Path) -> Result<()> {
    let read = |name: &str| -> Result<String> {
        let path = cache.join(name);
        Ok(fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .to_owned())
    };
    let modules = PathBuf::from(read("MODULES")?);
    println!("release:  {}", read("RELEASE")?);
    println!("vmlinuz:  {}", read("KERNEL")?);
    println!("modules:  {}", modules.display());
    let deps = load_deps(&modules)?;
    println!("modules as shipped: {}", read("COMPRESSION")?);
    println!("loadable modules: {}", deps.len());
    println!("{:<12} provided as", "module");
    for name in INITRAMFS_MODULES {
        let how = match (deps.path_of(name), deps.is_builtin(name)) {
            (Some(path), _) => format!("module  {path}"),
            (None, true) => "built-in".to_owned(),
            (None, false) => "MISSING".to_owned(),
        };
        println!("{name:<12} {how}");
    }
    let closure = deps
        .resolve(INITRAMFS_MODULES)
        .context("resolving the initramfs module closure")?;
    println!("load order for the initramfs ({} files):", closure.len());
    for path in closure {
        println!("  {path}");
    }
    Ok(())
}
