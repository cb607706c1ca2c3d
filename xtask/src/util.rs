//! Helpers shared by the tasks: locating the repository, running commands with context, and
//! fetching Debian packages into a cache.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The workspace root: xtask lives at `<repo>/xtask`.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_owned()
}

/// Human-readable form of a command for messages.
pub fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Runs `cmd`, inheriting stdio, and fails with the command line if it does not succeed.
pub fn run(cmd: &mut Command) -> Result<()> {
    let text = describe(cmd);
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{text}`"))?;
    if !status.success() {
        bail!("`{text}` failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; stderr is included in the error on failure.
pub fn output(cmd: &mut Command) -> Result<String> {
    let text = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{text}`"))?;
    if !out.status.success() {
        bail!(
            "`{text}` failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{text}` printed non-UTF-8 output"))
}

/// The candidate version apt would install for `package`.
pub fn candidate_version(package: &str) -> Result<String> {
    let policy = output(Command::new("apt-cache").args(["policy", package]))?;
    policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(|v| v.trim().to_owned())
        .filter(|v| v != "(none)")
        .with_context(|| format!("apt has no candidate version of {package} (apt-get update?)"))
}

/// The `.deb` of `package` in `dir`, downloaded with `apt-get download` unless already there.
/// Debian names downloads `<package>_<version>_<arch>.deb`, with `:` in the version as `%3a`.
pub fn download_deb(package: &str, version: &str, dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let prefix = format!("{package}_{}_", version.replace(':', "%3a"));
    let find = || -> Result<Option<PathBuf>> {
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with(&prefix) && name.ends_with(".deb") {
                return Ok(Some(path));
            }
        }
        Ok(None)
    };
    if let Some(deb) = find()? {
        println!("  have {}", deb.display());
        return Ok(deb);
    }
    println!("  apt-get download {package}={version}");
    run(Command::new("apt-get")
        .args(["download", "-q", &format!("{package}={version}")])
        .current_dir(dir))?;
    find()?.with_context(|| {
        format!(
            "apt-get download succeeded but no {prefix}*.deb in {}",
            dir.display()
        )
    })
}

/// Unpacks `deb` into `dest` (replaced whole): extract next to it, then rename, so an
/// interrupted run never leaves a half-unpacked tree under the final name.
pub fn unpack_deb(deb: &Path, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension("partial");
    remove_if_exists(&tmp)?;
    println!("  dpkg -x {} {}", deb.display(), dest.display());
    run(Command::new("dpkg").arg("-x").arg(deb).arg(&tmp))?;
    remove_if_exists(dest)?;
    fs::rename(&tmp, dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))
}

pub fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => {
            fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
        }
        Ok(_) => fs::remove_file(path).with_context(|| format!("removing {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", path.display())),
    }
}

/// Writes `contents` to `path` via a temporary file and rename, so readers never see half.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// `packages` at apt's candidate versions, each unpacked once into `<cache>/<package>/`
/// (again when its candidate version changes, as its `<package>.STAMP` says).
pub fn unpacked_packages(cache: &Path, packages: &[&str]) -> Result<Vec<PathBuf>> {
    let mut trees = Vec::new();
    for package in packages {
        let version = candidate_version(package)?;
        let tree = cache.join(package);
        let stamp = cache.join(format!("{package}.STAMP"));
        let stamp_text = format!("{package} {version}\n");
        if !(fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text) && tree.is_dir()) {
            println!("unpacking {package} {version}");
            let deb = download_deb(package, &version, &cache.join("debs"))?;
            unpack_deb(&deb, &tree)?;
            write_atomic(&stamp, &stamp_text)?;
        }
        trees.push(tree);
    }
    Ok(trees)
}

/// `rel` inside the unpacked tree `tree`, following symlinks inside it (an absolute link
/// target is taken relative to `tree`, as it would be in the image); `None` if absent.
pub fn resolve_in(tree: &Path, rel: &Path) -> Option<PathBuf> {
    let mut path = tree.join(rel);
    for _ in 0..8 {
        let meta = fs::symlink_metadata(&path).ok()?;
        if !meta.file_type().is_symlink() {
            return meta.is_file().then_some(path);
        }
        let target = fs::read_link(&path).ok()?;
        path = match target.strip_prefix("/") {
            Ok(absolute) => tree.join(absolute),
            Err(_) => path.parent()?.join(target),
        };
    }
    None
}
