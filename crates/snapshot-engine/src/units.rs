//! `slate snapshot install-units`: the systemd units of step 8 written into a root (the running
//! one, or an image's tree), each file atomically, and the unit enabled by its `wants` link.

use std::fs;
use std::path::{Path, PathBuf};

use slate_snapshot::units::{units, UnitFiles, UnitsSpec};

use crate::tree::write_atomically;
use crate::{io_err, Result};

/// Writes the units under `root` (unless `dry_run`); returns the paths written.
pub fn install_units(root: &Path, spec: &UnitsSpec, dry_run: bool) -> Result<Vec<PathBuf>> {
    let UnitFiles {
        files,
        wants_link: (link, target),
    } = units(spec)?;
    let mut written = Vec::new();
    for (rel, text) in &files {
        let path = root.join(rel);
        if !dry_run {
            let dir = path.parent().unwrap_or(root);
            fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
            write_atomically(&path, text.as_bytes(), 0o644)?;
        }
        written.push(path);
    }
    let link_path = root.join(&link);
    if !dry_run {
        let dir = link_path.parent().unwrap_or(root);
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        let _ = fs::remove_file(&link_path);
        std::os::unix::fs::symlink(&target, &link_path).map_err(io_err("linking", &link_path))?;
    }
    written.push(link_path);
    Ok(written)
}
