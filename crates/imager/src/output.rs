//! Outputs appear whole or not at all: they are written beside their destination under a
//! temporary name and renamed into place; a failed build removes its temporary.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::ImagerError;

fn out_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImagerError + '_ {
    move |source| ImagerError::Output {
        path: path.to_owned(),
        source,
    }
}

/// A destination being prepared. Creating it checks that the destination is writable, so a bad
/// output path fails before any build work.
#[derive(Debug)]
pub enum PendingOutput {
    File {
        temp: tempfile::NamedTempFile,
        dest: PathBuf,
    },
    Dir {
        temp: tempfile::TempDir,
        dest: PathBuf,
    },
}

fn parent_of(dest: &Path) -> &Path {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

impl PendingOutput {
    pub fn file(dest: &Path) -> Result<Self, ImagerError> {
        let temp = tempfile::Builder::new()
            .prefix(".slate-imager-")
            .tempfile_in(parent_of(dest))
            .map_err(out_err(dest))?;
        Ok(Self::File {
            temp,
            dest: dest.to_owned(),
        })
    }

    pub fn dir(dest: &Path) -> Result<Self, ImagerError> {
        let temp = tempfile::Builder::new()
            .prefix(".slate-imager-")
            .tempdir_in(parent_of(dest))
            .map_err(out_err(dest))?;
        Ok(Self::Dir {
            temp,
            dest: dest.to_owned(),
        })
    }

    /// Where to build.
    pub fn path(&self) -> &Path {
        match self {
            Self::File { temp, .. } => temp.path(),
            Self::Dir { temp, .. } => temp.path(),
        }
    }

    /// Move the finished output into place (replacing an older one).
    pub fn commit(self) -> Result<PathBuf, ImagerError> {
        match self {
            Self::File { temp, dest } => {
                // Temporary files are private (0600); an artifact is not.
                fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o644))
                    .map_err(out_err(&dest))?;
                temp.as_file().sync_all().map_err(out_err(&dest))?;
                temp.persist(&dest).map_err(|e| out_err(&dest)(e.error))?;
                Ok(dest)
            }
            Self::Dir { temp, dest } => {
                let built = temp.keep();
                fs::set_permissions(&built, fs::Permissions::from_mode(0o755))
                    .map_err(out_err(&dest))?;
                if dest.exists() {
                    let old = parent_of(&dest).join(format!(
                        ".slate-imager-old-{}",
                        dest.file_name().and_then(|n| n.to_str()).unwrap_or("out")
                    ));
                    let _ = fs::remove_dir_all(&old);
                    fs::rename(&dest, &old).map_err(out_err(&dest))?;
                    fs::rename(&built, &dest).map_err(out_err(&dest))?;
                    fs::remove_dir_all(&old).map_err(out_err(&old))?;
                } else {
                    fs::rename(&built, &dest).map_err(out_err(&dest))?;
                }
                Ok(dest)
            }
        }
    }
}

/// Write `bytes` to `dest` atomically.
pub fn write_output(dest: &Path, bytes: &[u8]) -> Result<PathBuf, ImagerError> {
    let pending = PendingOutput::file(dest)?;
    fs::write(pending.path(), bytes).map_err(out_err(dest))?;
    pending.commit()
}
