//! STATE seeded with a machine configuration: an ext4 filesystem holding
//! `config/machine.toml` (0600), built by `mke2fs -d` (times pinned by `debugfs`) into a
//! temporary file and written onto the STATE partition through the [`Disk`] trait, like every
//! other byte slate writes.
//!
//! Why mke2fs and not a crate: no maintained Rust crate writes ext4, and the node formats STATE
//! with mke2fs too. It is a journaled ext4 (`-t ext4 -j`), like the one the node makes, so a
//! power cut is repaired by a journal replay (docs/node.md, "Volumes"). The temporary file is
//! never a disk: it is read back and written through the partition view, so a refused or
//! failed build writes nothing.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_disk::{Disk, DiskError, FileDisk};
use slate_layout::{LayoutError, STATE_LABEL};
use slate_machine_config::{ConfigError, STATE_PATH};

/// Why a STATE filesystem was not made or written. Refusals come before any write.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the machine configuration is refused")]
    Config(#[from] ConfigError),
    #[error("making the STATE filesystem with mke2fs (Debian package e2fsprogs): {0}")]
    Mkfs(String),
    #[error("opening {}", disk.display())]
    Open {
        disk: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} is not a slate disk (install an image on it first with `slate installer install`)",
        disk.display()
    )]
    NoTable {
        disk: PathBuf,
        #[source]
        source: LayoutError,
    },
    #[error("finding the STATE partition on {}", disk.display())]
    NoState {
        disk: PathBuf,
        #[source]
        source: LayoutError,
    },
    #[error(
        "STATE on {} already holds a filesystem (data at byte {offset} of the partition): the \
         node's key and /etc live there; pass --force to replace them",
        disk.display()
    )]
    NotBlank { disk: PathBuf, offset: u64 },
    #[error("writing STATE")]
    Write(#[source] DiskError),
    /// A `btrfs-image` disk: the configuration goes into the pool's `@state`.
    #[error("configuring the Btrfs pool of {}", disk.display())]
    Pool {
        disk: PathBuf,
        #[source]
        source: Box<crate::PoolError>,
    },
}

/// An ext4 image the size of STATE holding the configuration.
#[derive(Debug)]
pub struct StateFilesystem {
    image: Vec<u8>,
    /// The node's name, from the configuration.
    pub node_name: String,
}

impl StateFilesystem {
    /// Check `config_text` as the node will, then make the filesystem (`size` bytes). `seed`
    /// and `epoch` fix its UUID and timestamps: the same inputs give the same bytes.
    pub fn build(config_text: &str, size: u64, seed: &str, epoch: u64) -> Result<Self, StateError> {
        let parsed = slate_machine_config::parse_for_writing(config_text)?;
        let work = tempfile::tempdir().map_err(|e| StateError::Mkfs(e.to_string()))?;
        let root = work.path().join("root");
        let config_path = root.join(STATE_PATH);
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::PermissionsExt as _;
            let dir = config_path.parent().unwrap_or(&root);
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            std::fs::write(&config_path, config_text)?;
            std::fs::set_permissions(&config_path, std::fs::Permissions::from_mode(0o600))
        };
        write().map_err(|e| StateError::Mkfs(format!("staging the configuration: {e}")))?;
        let image_path = work.path().join("state.ext4");
        let uuid = slate_layout::partition_guid(seed, "STATE-filesystem").to_string();
        let output = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-j"])
            .args(["-L", STATE_LABEL, "-U", &uuid])
            .arg("-E")
            .arg(format!(
                "root_owner=0:0,hash_seed={uuid},lazy_itable_init=0"
            ))
            .arg("-d")
            .arg(&root)
            .arg(&image_path)
            .arg(format!("{}k", size / 1024))
            .env("E2FSPROGS_FAKE_TIME", epoch.max(1).to_string())
            .output()
            .map_err(|e| StateError::Mkfs(e.to_string()))?;
        if !output.status.success() {
            return Err(StateError::Mkfs(
                String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            ));
        }
        pin_staged_times(&image_path, work.path(), epoch)?;
        let mut image = Vec::with_capacity(size as usize);
        std::fs::File::open(&image_path)
            .and_then(|mut f| f.read_to_end(&mut image))
            .map_err(|e| StateError::Mkfs(format!("reading the image back: {e}")))?;
        image.resize(size as usize, 0);
        Ok(StateFilesystem {
            image,
            node_name: parsed.config.node.name,
        })
    }

    pub fn len(&self) -> u64 {
        self.image.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.image.is_empty()
    }

    /// Write it over the whole partition `view`, then flush.
    pub fn write_to(&self, view: &mut impl Disk) -> Result<(), DiskError> {
        const CHUNK: usize = 1 << 20;
        for (i, chunk) in self.image.chunks(CHUNK).enumerate() {
            view.write_at((i * CHUNK) as u64, chunk)?;
        }
        view.flush()
    }
}

/// `mke2fs -d` copies each staged inode's atime, mtime and ctime from the staging directory,
/// and a ctime cannot be set from user space: two builds a second apart differed in those
/// fields. debugfs sets the three to `epoch` on every inode `-d` created (root, the
/// configuration's directory and file), so the image depends on its inputs alone.
fn pin_staged_times(image: &Path, work: &Path, epoch: u64) -> Result<(), StateError> {
    let config_dir = Path::new(STATE_PATH)
        .parent()
        .map(|d| format!("/{}", d.display()))
        .unwrap_or_else(|| "/".to_owned());
    let mut commands = String::new();
    for inode in ["/".to_owned(), config_dir, format!("/{STATE_PATH}")] {
        for field in ["atime", "mtime", "ctime"] {
            commands.push_str(&format!("set_inode_field {inode} {field} @{epoch}\n"));
        }
    }
    let script = work.join("pin-times.debugfs");
    std::fs::write(&script, commands)
        .map_err(|e| StateError::Mkfs(format!("staging the debugfs commands: {e}")))?;
    let output = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&script)
        .arg(image)
        .env("E2FSPROGS_FAKE_TIME", epoch.max(1).to_string())
        .output()
        .map_err(|e| StateError::Mkfs(format!("running debugfs: {e}")))?;
    // debugfs exits 0 even when a command fails: anything on stderr but its version banner
    // ("debugfs 1.47.0 (…)") is a failed command.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let failed = stderr
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with("debugfs "));
    if !output.status.success() || failed.is_some() {
        return Err(StateError::Mkfs(format!(
            "pinning the staged inodes' times with debugfs: {}",
            failed.unwrap_or(stderr.trim())
        )));
    }
    Ok(())
}

/// What [`seed_config`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedReport {
    pub node_name: String,
    /// Bytes written: STATE's whole file system, or the configuration file on a Btrfs pool.
    pub state_len: u64,
    /// Where: `STATE`, or `SLATE-POOL:@state/config/machine.toml`.
    pub place: String,
    /// False for a dry run.
    pub written: bool,
}

/// Put a machine configuration onto the STATE partition of the slate disk `disk` (formatting
/// STATE). Refused, before anything is written, when the configuration is invalid or STATE
/// already holds data and `force` is not given.
///
/// A `btrfs-image` disk (a `SLATE-POOL` partition and no STATE) gets it as
/// `@state/config/machine.toml` in its pool instead (`crate::pool::configure_pool`; root
/// only), refused without `force` when a configuration is there already.
pub fn seed_config(
    disk: &Path,
    config_text: &str,
    force: bool,
    dry_run: bool,
) -> Result<SeedReport, StateError> {
    let open = if dry_run {
        FileDisk::open_read_only(disk)
    } else {
        FileDisk::open(disk)
    };
    let mut file = open.map_err(|source| StateError::Open {
        disk: disk.to_owned(),
        source,
    })?;
    let pool_err = |source| StateError::Pool {
        disk: disk.to_owned(),
        source: Box::new(source),
    };
    // A disk with no readable table is no slate disk of either kind: say that, rather than
    // what looking for a Btrfs pool on it found.
    let parts = slate_layout::partitions(&mut file).map_err(|source| StateError::NoTable {
        disk: disk.to_owned(),
        source,
    })?;
    let has_state = parts.iter().any(|p| p.label == STATE_LABEL);
    let pool = parts
        .iter()
        .find(|p| p.label == slate_layout::POOL_LABEL)
        .map(|p| (p.start, p.len));
    if !has_state {
        if let Some(window) = pool {
            drop(file);
            let done = crate::pool::configure_pool(disk, window, config_text, force, dry_run)
                .map_err(pool_err)?;
            return Ok(SeedReport {
                node_name: done.node_name,
                state_len: done.len,
                place: format!("{}:{}", slate_layout::POOL_LABEL, done.path),
                written: !dry_run,
            });
        }
    }
    let mut view = slate_layout::open_partition(&mut file, STATE_LABEL).map_err(|source| {
        StateError::NoState {
            disk: disk.to_owned(),
            source,
        }
    })?;
    let mut head = vec![0u8; view.len().min(crate::CLEARED_HEAD) as usize];
    view.read_at(0, &mut head).map_err(StateError::Write)?;
    if let Some(offset) = head.iter().position(|&b| b != 0) {
        if !force {
            return Err(StateError::NotBlank {
                disk: disk.to_owned(),
                offset: offset as u64,
            });
        }
    }
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let fs = StateFilesystem::build(config_text, view.len(), &disk.display().to_string(), epoch)?;
    let report = SeedReport {
        node_name: fs.node_name.clone(),
        state_len: fs.len(),
        place: STATE_LABEL.to_owned(),
        written: !dry_run,
    };
    if !dry_run {
        fs.write_to(&mut view).map_err(StateError::Write)?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = include_str!("../../machine-config/tests/fixtures/node-v1-own-ca.toml");

    /// A journaled ext4 (superblock `s_feature_compat` has `has_journal`, 0x4), and the same
    /// inputs give the same bytes, also when the two builds fall in different seconds (the
    /// staging directory's own times must not reach the image).
    #[test]
    fn state_is_a_reproducible_journaled_ext4() {
        if !slate_testkit::require_tool("mke2fs") || !slate_testkit::require_tool("debugfs") {
            return;
        }
        let build = || StateFilesystem::build(CONFIG, 32 << 20, "disk.raw", 1_700_000_000);
        let a = build().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let b = build().unwrap();
        assert_eq!(a.len(), 32 << 20);
        assert_eq!(&a.image[1080..1082], &[0x53, 0xEF], "ext magic");
        let compat = u32::from_le_bytes(a.image[1024 + 0x5C..1024 + 0x60].try_into().unwrap());
        assert_ne!(compat & 0x4, 0, "has_journal");
        assert!(
            a.image == b.image,
            "the same inputs must give the same bytes"
        );
        // debugfs's edits leave a filesystem e2fsck finds clean (checksums included).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.ext4");
        std::fs::write(&path, &a.image).unwrap();
        let fsck = Command::new("e2fsck")
            .arg("-fn")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "e2fsck: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
    }
}
