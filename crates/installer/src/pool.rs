//! The Btrfs pool of a `btrfs-image` disk (docs/formats.md §12.8): the GPT partition named
//! `SLATE-POOL`, loop-mounted by [`MountedPool`] (root only: mounting is the one way to write
//! a Btrfs file system; no Rust crate writes one and btrfs-progs write only through a mount
//! for what is needed here), and [`configure_pool`]: the machine configuration written to
//! `@state/config/machine.toml`, the place STATE's `config/machine.toml` has on an A/B disk.
//!
//! Unlike every other write slate makes to a disk, this one goes through the kernel's Btrfs
//! driver, not the `Disk` trait: a pool's bytes can only be written by a Btrfs implementation.
//! The loop device is a window on the partition alone (offset and size from the GPT), so
//! nothing outside the partition can be reached through it.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use slate_disk::FileDisk;
use slate_host::{HostError, MsFlags};
use slate_layout::{LayoutError, POOL_LABEL};
use slate_machine_config::{ConfigError, STATE_PATH};

pub use slate_snapshot::{HOME_SUBVOLUME, STATE_SUBVOLUME};

/// Why a pool could not be mounted or configured. Refusals come before any write.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{what} needs root: it loop-mounts the Btrfs pool (run it as root, e.g. with sudo)")]
    NotRoot { what: String },
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the machine configuration is refused")]
    Config(#[from] ConfigError),
    #[error("reading the partition table of {}", disk.display())]
    Layout {
        disk: PathBuf,
        #[source]
        source: LayoutError,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "{} on {} already holds a machine configuration: pass --force to replace it",
        path,
        disk.display()
    )]
    Exists { disk: PathBuf, path: String },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PoolError {
    let path = path.to_owned();
    move |source| PoolError::Io {
        action,
        path,
        source,
    }
}

/// Whether the effective uid is 0 (`Uid:` of /proc/self/status: real, effective, saved, fs).
fn effective_uid_is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Refuses, naming `what` and why, when not running as root.
pub fn require_root(what: &str) -> Result<(), PoolError> {
    if effective_uid_is_root() {
        Ok(())
    } else {
        Err(PoolError::NotRoot { what: what.into() })
    }
}

/// A Btrfs file system mounted from a window of a file or disk, top level (subvolid 5) at a
/// temporary directory. Dropping it unmounts (lazily, if it must) and detaches the loop
/// device, also on error paths; [`MountedPool::release`] does the same and reports failures.
#[derive(Debug)]
pub struct MountedPool {
    dir: Option<tempfile::TempDir>,
    device: Option<PathBuf>,
    mounted: bool,
}

impl MountedPool {
    /// Mounts the Btrfs file system at bytes `offset .. offset + len` of `image` (len 0: to the
    /// end), read-only when `read_only` (without replaying its log, so nothing is written).
    pub fn mount(image: &Path, offset: u64, len: u64, read_only: bool) -> Result<Self, PoolError> {
        require_root("mounting the Btrfs pool")?;
        let dir = tempfile::Builder::new()
            .prefix("slate-pool-")
            .tempdir()
            .map_err(io_err("creating a mount point in", &std::env::temp_dir()))?;
        let mut pool = MountedPool {
            dir: Some(dir),
            device: None,
            mounted: false,
        };
        let device = slate_host::attach_loop_window(image, offset, len, read_only)?;
        pool.device = Some(device.clone());
        let (flags, data) = if read_only {
            (MsFlags::MS_RDONLY, "subvolid=5,rescue=nologreplay")
        } else {
            (MsFlags::empty(), "subvolid=5")
        };
        slate_host::mount(&device, pool.path(), "btrfs", flags, Some(data))?;
        pool.mounted = true;
        Ok(pool)
    }

    /// The top level.
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }

    /// Unmounts and detaches the loop device, reporting what failed. Unmounting writes back
    /// everything the file system has cached.
    pub fn release(mut self) -> Result<(), PoolError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), PoolError> {
        if self.mounted {
            slate_host::unmount(self.path())?;
            self.mounted = false;
        }
        if let Some(device) = self.device.take() {
            slate_host::detach_loop(&device)?;
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_owned();
            dir.close().map_err(io_err("removing", &path))?;
        }
        Ok(())
    }
}

impl Drop for MountedPool {
    fn drop(&mut self) {
        if self.mounted && slate_host::unmount(self.path()).is_ok() {
            self.mounted = false;
        }
        if self.mounted {
            // Still busy: the directory is kept, since removing it would remove the files of
            // the file system mounted there.
            if let Some(dir) = self.dir.take() {
                let _ = dir.keep();
            }
        }
        // Deferred by the kernel while the file system is still mounted.
        if let Some(device) = self.device.take() {
            let _ = slate_host::detach_loop(&device);
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

/// Where the pool lies on `disk`: its GPT partition named `SLATE-POOL`, or `None` when the
/// disk has no such partition.
pub fn find_pool(disk: &Path) -> Result<Option<(u64, u64)>, PoolError> {
    let file = FileDisk::open_read_only(disk).map_err(io_err("opening", disk))?;
    let parts = slate_layout::partitions(file).map_err(|source| PoolError::Layout {
        disk: disk.to_owned(),
        source,
    })?;
    Ok(parts
        .iter()
        .find(|p| p.label == POOL_LABEL)
        .map(|p| (p.start, p.len)))
}

/// What [`configure_pool`] did (or would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfigured {
    pub node_name: String,
    /// `@state/config/machine.toml`.
    pub path: String,
    pub len: u64,
    pub replaced: bool,
}

/// Writes `config_text` (checked as the node will check it, before anything) to
/// `@state/config/machine.toml` of the pool at bytes `offset..offset + len` of `disk`: the
/// directories 0700, the file 0600, under a temporary name, fsync'd and renamed. An existing
/// configuration is replaced only with `force`. A dry run mounts the pool read-only and
/// writes nothing.
pub fn configure_pool(
    disk: &Path,
    (offset, len): (u64, u64),
    config_text: &str,
    force: bool,
    dry_run: bool,
) -> Result<PoolConfigured, PoolError> {
    let parsed = slate_machine_config::parse_for_writing(config_text)?;
    let rel = format!("{STATE_SUBVOLUME}/{STATE_PATH}");
    let pool = MountedPool::mount(disk, offset, len, dry_run)?;
    let state = pool.path().join(STATE_SUBVOLUME);
    if !slate_host::is_subvolume(&state).unwrap_or(false) {
        return Err(PoolError::Invalid(format!(
            "the Btrfs pool on {} has no {STATE_SUBVOLUME} subvolume: is it a slate \
             btrfs-image disk?",
            disk.display()
        )));
    }
    let target = state.join(STATE_PATH);
    let exists = fs::symlink_metadata(&target).is_ok();
    if exists && !force {
        return Err(PoolError::Exists {
            disk: disk.to_owned(),
            path: rel,
        });
    }
    if !dry_run {
        write_private(&state, &target, config_text.as_bytes())?;
    }
    pool.release()?;
    Ok(PoolConfigured {
        node_name: parsed.config.node.name,
        path: rel,
        len: config_text.len() as u64,
        replaced: exists,
    })
}

/// `target`'s missing parents below `base` made 0700, then `target` written 0600 under a
/// temporary name, fsync'd, renamed, its directory fsync'd.
fn write_private(base: &Path, target: &Path, bytes: &[u8]) -> Result<(), PoolError> {
    let dir = target.parent().unwrap_or(base);
    let mut missing = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d.filter(|p| *p != base && !p.exists()) {
        missing.push(p.to_owned());
        d = p.parent();
    }
    for p in missing.iter().rev() {
        fs::create_dir(p).map_err(io_err("creating", p))?;
        fs::set_permissions(p, fs::Permissions::from_mode(0o700)).map_err(io_err("chmod", p))?;
    }
    let tmp = dir.join(".machine.toml.tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("creating", &tmp))?;
    f.write_all(bytes).map_err(io_err("writing", &tmp))?;
    f.sync_all().map_err(io_err("syncing", &tmp))?;
    fs::rename(&tmp, target).map_err(io_err("renaming into place", target))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("syncing", dir))
}
