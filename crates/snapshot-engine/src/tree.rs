//! Files of a snapshot: paths resolved inside it (a symlink's absolute target is read against
//! the snapshot, never the host), the manifest walk over `/usr` and `/boot`, the facts
//! validation needs, and `--tree`'s sync of an OS tree into the snapshot.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use slate_snapshot::manifest::{Manifest, Record};
use slate_snapshot::validate::RootFacts;

use crate::{io_err, EngineError, Result};

/// The paths a manifest covers (the seed's default; /etc and /var change at run time by design).
pub const MANIFEST_PATHS: [&str; 2] = ["usr", "boot"];

/// `rel` (relative to `root`) with every symlink followed inside `root`; `None` if something
/// on the way is missing or the links go round more than 40 times.
pub fn resolve_in_root(root: &Path, rel: &str) -> Option<PathBuf> {
    let mut todo: Vec<PathBuf> = vec![PathBuf::from(rel)];
    let mut done = PathBuf::new();
    let mut hops = 0;
    while let Some(path) = todo.pop() {
        let mut comps: Vec<Component> = path.components().collect();
        comps.reverse();
        while let Some(c) = comps.pop() {
            match c {
                Component::RootDir => done = PathBuf::new(),
                Component::CurDir | Component::Prefix(_) => {}
                Component::ParentDir => {
                    done.pop();
                }
                Component::Normal(name) => {
                    let candidate = done.join(name);
                    let meta = fs::symlink_metadata(root.join(&candidate)).ok()?;
                    if meta.file_type().is_symlink() {
                        hops += 1;
                        if hops > 40 {
                            return None;
                        }
                        let target = fs::read_link(root.join(&candidate)).ok()?;
                        let rest: PathBuf = comps.iter().rev().collect();
                        comps.clear();
                        todo.push(rest);
                        todo.push(target);
                    } else {
                        done = candidate;
                    }
                }
            }
        }
    }
    Some(root.join(done))
}

/// Opens a file to hash it without touching its access time: on a `relatime` pool, reading
/// every file of a snapshot would otherwise rewrite the metadata of each one read since its
/// last change — measured by `xtask bench-snapshot`, 4.8 MB of a 5.2 MB one-file upgrade.
/// `O_NOATIME` needs the file's owner or CAP_FOWNER; without them, a plain open.
fn open_without_atime(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOATIME.bits())
        .open(path)
        .or_else(|e| match e.raw_os_error() {
            Some(code) if code == nix::errno::Errno::EPERM as i32 => fs::File::open(path),
            _ => Err(e),
        })
}

fn sha256_file(path: &Path) -> Result<[u8; 32]> {
    let mut f = open_without_atime(path).map_err(io_err("reading", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(io_err("reading", path))?;
        if n == 0 {
            return Ok(h.finalize().into());
        }
        h.update(&buf[..n]);
    }
}

/// Adds `/usr` and `/boot` of the snapshot at `root` to `manifest`. Does not descend into
/// other file systems or nested subvolumes (another `st_dev`): they are not the snapshot's.
pub fn walk_into(root: &Path, manifest: &mut Manifest) -> Result<()> {
    let dev = fs::symlink_metadata(root)
        .map_err(io_err("reading", root))?
        .dev();
    let mut stack: Vec<PathBuf> = MANIFEST_PATHS.iter().map(PathBuf::from).collect();
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        let meta = match fs::symlink_metadata(&abs) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("reading", &abs)(e)),
        };
        let (uid, gid, perm) = (meta.uid(), meta.gid(), meta.mode() & 0o7777);
        let ft = meta.file_type();
        let record = if ft.is_symlink() {
            let target = fs::read_link(&abs).map_err(io_err("reading the link", &abs))?;
            let bytes = target.as_os_str().as_bytes();
            Record::Link {
                uid,
                gid,
                size: bytes.len() as u64,
                sha256: slate_snapshot::manifest::sha256(bytes),
            }
        } else if ft.is_file() {
            Record::File {
                mode: perm,
                uid,
                gid,
                size: meta.len(),
                sha256: sha256_file(&abs)?,
            }
        } else if ft.is_dir() {
            if meta.dev() == dev {
                for entry in fs::read_dir(&abs).map_err(io_err("listing", &abs))? {
                    let entry = entry.map_err(io_err("listing", &abs))?;
                    stack.push(rel.join(entry.file_name()));
                }
            }
            Record::Dir {
                mode: perm,
                uid,
                gid,
            }
        } else {
            Record::Other {
                mode: meta.mode(),
                uid,
                gid,
            }
        };
        manifest.insert(rel.as_os_str().as_bytes(), record)?;
    }
    Ok(())
}

/// What validation needs to know about the snapshot at `root`.
pub fn facts(root: &Path) -> RootFacts {
    let regular = |rel: &str| {
        resolve_in_root(root, rel)
            .and_then(|p| fs::metadata(p).ok())
            .filter(fs::Metadata::is_file)
    };
    let boot_files = fs::read_dir(root.join("boot"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| regular(&format!("boot/{n}")).is_some())
                .collect()
        })
        .unwrap_or_default();
    let systemd = ["usr/lib/systemd/systemd", "lib/systemd/systemd"]
        .iter()
        .any(|p| regular(p).is_some());
    let default_target = [
        "etc/systemd/system/default.target",
        "usr/lib/systemd/system/default.target",
        "lib/systemd/system/default.target",
    ]
    .iter()
    .any(|p| regular(p).is_some());
    RootFacts {
        boot_files,
        init_executable: regular("sbin/init").is_some_and(|m| m.permissions().mode() & 0o111 != 0),
        systemd,
        default_target,
        fstab: resolve_in_root(root, "etc/fstab").and_then(|p| fs::read_to_string(p).ok()),
    }
}

/// The OS name for entry titles: os-release's `PRETTY_NAME` (or `NAME`, `ID`), else "Linux".
pub fn os_name(root: &Path) -> String {
    ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .filter_map(|p| resolve_in_root(root, p))
        .find_map(|p| fs::read_to_string(p).ok())
        .and_then(|t| {
            slate_bootspec::OsRelease::parse(&t)
                .title()
                .map(str::to_owned)
        })
        .filter(|t| !t.trim().is_empty() && !t.chars().any(char::is_control))
        .unwrap_or_else(|| "Linux".to_owned())
}

/// Makes the snapshot at `dest` hold the OS tree `src`: every file, link and directory of
/// `src` copied over (mode, owner and link targets kept), and under `/usr` and `/boot` — the
/// OS payload the tree replaces — whatever `src` does not have removed. `/etc`, `/var` and
/// the rest only gain or change files: they hold the machine's own state.
pub fn sync_tree(src: &Path, dest: &Path) -> Result<()> {
    copy_dir(src, dest, Path::new(""))?;
    for top in MANIFEST_PATHS {
        prune_missing(src, dest, Path::new(top))?;
    }
    Ok(())
}

fn remove_any(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    if meta.is_dir() {
        fs::remove_dir_all(path).map_err(io_err("removing", path))
    } else {
        fs::remove_file(path).map_err(io_err("removing", path))
    }
}

fn copy_dir(src_root: &Path, dest_root: &Path, rel: &Path) -> Result<()> {
    let src_dir = src_root.join(rel);
    for entry in fs::read_dir(&src_dir).map_err(io_err("listing", &src_dir))? {
        let entry = entry.map_err(io_err("listing", &src_dir))?;
        let rel = rel.join(entry.file_name());
        let (s, d) = (src_root.join(&rel), dest_root.join(&rel));
        let meta = fs::symlink_metadata(&s).map_err(io_err("reading", &s))?;
        let existing = fs::symlink_metadata(&d).ok();
        let ft = meta.file_type();
        if existing.as_ref().is_some_and(|e| e.file_type() != ft) {
            remove_any(&d)?;
        }
        if ft.is_dir() {
            if !d.is_dir() {
                fs::create_dir(&d).map_err(io_err("creating", &d))?;
            }
            copy_dir(src_root, dest_root, &rel)?;
        } else if ft.is_symlink() {
            remove_any(&d)?;
            let target = fs::read_link(&s).map_err(io_err("reading the link", &s))?;
            std::os::unix::fs::symlink(&target, &d).map_err(io_err("creating the link", &d))?;
        } else if ft.is_file() {
            // Never write through an existing hard link into files other snapshots share.
            remove_any(&d)?;
            fs::copy(&s, &d).map_err(io_err("copying to", &d))?;
        } else {
            return Err(EngineError::Invalid(format!(
                "{}: devices, FIFOs and sockets are not copied from a tree",
                s.display()
            )));
        }
        std::os::unix::fs::lchown(&d, Some(meta.uid()), Some(meta.gid()))
            .map_err(io_err("setting the owner of", &d))?;
        if !ft.is_symlink() {
            fs::set_permissions(&d, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(io_err("setting the mode of", &d))?;
        }
    }
    Ok(())
}

fn prune_missing(src_root: &Path, dest_root: &Path, rel: &Path) -> Result<()> {
    let d = dest_root.join(rel);
    let Ok(meta) = fs::symlink_metadata(&d) else {
        return Ok(());
    };
    if fs::symlink_metadata(src_root.join(rel)).is_err() {
        return remove_any(&d);
    }
    if meta.is_dir() {
        for entry in fs::read_dir(&d).map_err(io_err("listing", &d))? {
            let entry = entry.map_err(io_err("listing", &d))?;
            prune_missing(src_root, dest_root, &rel.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` under a temporary name, fsyncs, renames and fsyncs the directory:
/// the name never refers to a partial file, also after a power cut.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = OsStr::new(".").to_os_string();
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err("creating", &tmp))?;
    f.write_all(bytes).map_err(io_err("writing", &tmp))?;
    f.sync_all().map_err(io_err("syncing", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("renaming into place", path))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("syncing", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
        fs::write(root.join("usr/lib/systemd/systemd"), "x").unwrap();
        fs::create_dir_all(root.join("sbin")).unwrap();
        std::os::unix::fs::symlink("/usr/lib/systemd/systemd", root.join("sbin/init")).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/passwd"), "").unwrap();
        std::os::unix::fs::symlink("../../../etc/passwd", root.join("usr/lib/p")).unwrap();
        assert_eq!(
            resolve_in_root(root, "sbin/init"),
            Some(root.join("usr/lib/systemd/systemd"))
        );
        // `..` stops at the snapshot's root.
        assert_eq!(
            resolve_in_root(root, "usr/lib/p"),
            Some(root.join("etc/passwd"))
        );
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert_eq!(resolve_in_root(root, "loop"), None);
    }
}
