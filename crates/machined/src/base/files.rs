//! Crash-safe file writes on the node's own file systems (STATE, /etc, /var).

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Write `contents` to `path` so that a crash leaves either the old file or the new one:
/// a temp file beside it, fsync, rename, fsync of the directory.
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{}.tmp", name.unwrap_or_default()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// [`write_atomically`], unless `path` is already a regular file with exactly `contents` and
/// `mode`. Returns whether it wrote. Every boot sets the same hostname, name servers and /etc
/// files as the last: each rewrite cost two journal commits on STATE, which under emulation
/// are milliseconds of the boot's one CPU, for bytes that were already there and durable.
pub fn write_if_changed(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<bool> {
    if holds(path, contents, mode) {
        return Ok(false);
    }
    write_atomically(path, contents, mode)?;
    Ok(true)
}

/// Whether `path` (not followed if a link) is a regular file of `mode` holding `contents`.
fn holds(path: &Path, contents: &[u8], mode: u32) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !meta.is_file() || meta.len() != contents.len() as u64 || meta.mode() & 0o7777 != mode {
        return false;
    }
    // The length matched, so this reads at most what the caller holds in memory already.
    std::fs::read(path).is_ok_and(|old| old == contents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn inode(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn an_unchanged_file_is_not_rewritten_and_a_changed_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc/hostname");
        assert!(write_if_changed(&path, b"node-1\n", 0o644).unwrap());
        let first = inode(&path);
        // Same bytes and mode: left alone (a rewrite renames a new inode into place).
        assert!(!write_if_changed(&path, b"node-1\n", 0o644).unwrap());
        assert_eq!(inode(&path), first);
        // Other bytes of the same length, another length, another mode: each rewritten.
        for (contents, mode) in [
            (&b"node-2\n"[..], 0o644),
            (&b"node-22\n"[..], 0o644),
            (&b"node-22\n"[..], 0o600),
        ] {
            let before = inode(&path);
            assert!(write_if_changed(&path, contents, mode).unwrap());
            assert_ne!(inode(&path), before);
            assert_eq!(std::fs::read(&path).unwrap(), contents);
            let got = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(got, mode);
        }
    }

    #[test]
    fn a_link_to_the_same_bytes_is_replaced_by_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"nameserver 10.0.2.3\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = dir.path().join("resolv.conf");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(write_if_changed(&path, b"nameserver 10.0.2.3\n", 0o644).unwrap());
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    }
}
