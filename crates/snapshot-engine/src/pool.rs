//! The pool: the running root's mount, the top level (subvolid 5) mounted beside it, the lock,
//! the manifest key, the manifests and the in-progress markers — all under `<top>/.slate/`,
//! outside every snapshot, so no snapshot carries or can rewrite them.

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use slate_disk::FileDisk;
use slate_snapshot::manifest::{Manifest, KEY_LEN};
use slate_snapshot::{SnapshotName, PREFIX};

use crate::tree::write_atomically;
use crate::{io_err, mountinfo, EngineError, Result};

/// The engine's directory on the top level.
pub const ENGINE_DIR: &str = ".slate";
/// Where top levels are mounted: `/run/slate/btrfs-<uuid>` (one place per pool, so a run after
/// a killed one finds the same paths and whatever is still mounted under them).
const TOP_MOUNTS: &str = "/run/slate";

/// An opened pool: the running root, its top level and the ESP disk.
#[derive(Debug)]
pub struct Pool {
    pub root: PathBuf,
    pub top: PathBuf,
    pub uuid: String,
    /// The running root's subvolume, when it is a snapshot (`root-…`).
    pub running: Option<SnapshotName>,
    /// Its subvolume path as mounted (`root-…`, `@`), for messages.
    pub running_subvol: String,
    pub esp_disk: PathBuf,
    /// `flock` on `<top>/.slate/lock` for the pool's lifetime: one engine per pool.
    _lock: Option<nix::fcntl::Flock<fs::File>>,
    mounted_top: bool,
}

impl Pool {
    /// Opens the pool that `root` (a mounted Btrfs subvolume) belongs to. `lock`: take the
    /// pool's lock (every command but a dry run).
    pub fn open(root: &Path, esp_disk: &Path, lock: bool) -> Result<Pool> {
        let root = root.canonicalize().map_err(io_err("resolving", root))?;
        if !slate_host::is_subvolume(&root)? {
            return Err(EngineError::Invalid(format!(
                "{} is not the root of a Btrfs subvolume",
                root.display()
            )));
        }
        let text = fs::read_to_string("/proc/self/mountinfo")
            .map_err(io_err("reading", Path::new("/proc/self/mountinfo")))?;
        let mounts = mountinfo::parse(&text);
        let mount = mountinfo::mount_at(&mounts, &root)
            .filter(|m| m.fstype == "btrfs")
            .ok_or_else(|| {
                EngineError::Invalid(format!("{} is not a Btrfs mount point", root.display()))
            })?;
        let running_subvol = mount.root.trim_start_matches('/').to_owned();
        if running_subvol.contains('/') {
            return Err(EngineError::Invalid(format!(
                "{} mounts the nested subvolume {running_subvol}; snapshots live on the top level",
                root.display()
            )));
        }
        let disk = esp_disk.to_string_lossy();
        if let Some(m) = mountinfo::fat_mounts_of(&mounts, &disk).first() {
            return Err(EngineError::Invalid(format!(
                "{} (on {disk}) is mounted at {}: unmount it first; slate writes the ESP \
                 through the disk, and a mounted FAT would overwrite those writes",
                m.source,
                m.mount_point.display()
            )));
        }
        let running = SnapshotName::parse(&running_subvol).ok();
        let uuid = slate_host::pool_uuid(&root)?;
        let top = Path::new(TOP_MOUNTS).join(format!("btrfs-{uuid}"));
        let mut mounted_top = false;
        if mountinfo::mount_at(&mounts, &top).is_none_or(|m| m.root != "/") {
            fs::create_dir_all(&top).map_err(io_err("creating", &top))?;
            slate_host::mount(
                &mount.source,
                &top,
                "btrfs",
                // The engine reads whole snapshots (manifests): no access-time writes.
                slate_host::MsFlags::MS_NOATIME,
                Some("subvolid=5"),
            )?;
            mounted_top = true;
        }
        let mut pool = Pool {
            root,
            top,
            uuid,
            running,
            running_subvol,
            esp_disk: esp_disk.to_path_buf(),
            _lock: None,
            mounted_top,
        };
        if lock {
            let dir = pool.engine_dir();
            for d in [dir.clone(), dir.join("manifests"), dir.join("in-progress")] {
                fs::create_dir_all(&d).map_err(io_err("creating", &d))?;
            }
            let path = dir.join("lock");
            let f = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io_err("opening", &path))?;
            let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
                .map_err(|_| EngineError::Locked(path.clone()))?;
            pool._lock = Some(held);
        }
        Ok(pool)
    }

    /// The pool reached through its top level alone, mounted at `top` by the caller: no
    /// running root, no ESP, no lock. What an image build uses to write `<top>/.slate`
    /// ([`crate::seed_engine_dir`]); nothing here reads `root` or `esp_disk`.
    pub(crate) fn at_top(top: &Path, uuid: &str) -> Pool {
        Pool {
            root: top.to_path_buf(),
            top: top.to_path_buf(),
            uuid: uuid.to_owned(),
            running: None,
            running_subvol: String::new(),
            esp_disk: PathBuf::new(),
            _lock: None,
            mounted_top: false,
        }
    }

    pub fn engine_dir(&self) -> PathBuf {
        self.top.join(ENGINE_DIR)
    }

    /// `<top>/<snapshot>`: where a snapshot is reached (never through the running root).
    pub fn path_of(&self, snapshot: &SnapshotName) -> PathBuf {
        self.top.join(snapshot.as_str())
    }

    pub fn manifest_path(&self, snapshot: &SnapshotName) -> PathBuf {
        self.engine_dir()
            .join("manifests")
            .join(format!("{snapshot}.manifest"))
    }

    pub fn marker_path(&self, snapshot: &SnapshotName) -> PathBuf {
        self.engine_dir()
            .join("in-progress")
            .join(snapshot.as_str())
    }

    /// The snapshots on the top level (`root-…` subvolumes), oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotName>> {
        Ok(slate_host::child_subvolumes(&self.top)?
            .into_iter()
            .filter(|n| n.starts_with(PREFIX))
            .filter_map(|n| SnapshotName::parse(&n).ok())
            .collect())
    }

    /// Snapshots marked in progress (an upgrade that did not finish).
    pub fn markers(&self) -> Result<Vec<SnapshotName>> {
        let dir = self.engine_dir().join("in-progress");
        let Ok(rd) = fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<SnapshotName> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| SnapshotName::parse(&n).ok())
            .collect();
        out.sort();
        Ok(out)
    }

    pub fn open_esp(&self) -> Result<FileDisk> {
        FileDisk::open(&self.esp_disk).map_err(io_err("opening the ESP disk", &self.esp_disk))
    }

    pub fn open_esp_read_only(&self) -> Result<FileDisk> {
        FileDisk::open_read_only(&self.esp_disk)
            .map_err(io_err("opening the ESP disk", &self.esp_disk))
    }

    /// The manifest key, created (32 random bytes, mode 0600) on first use.
    pub fn key(&self, create: bool) -> Result<Option<[u8; KEY_LEN]>> {
        let path = self.engine_dir().join("manifest.key");
        match fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; KEY_LEN] = bytes.try_into().map_err(|_| {
                    EngineError::Invalid(format!("{} is not {KEY_LEN} bytes", path.display()))
                })?;
                Ok(Some(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let mut key = [0; KEY_LEN];
                fs::File::open("/dev/urandom")
                    .and_then(|mut f| f.read_exact(&mut key))
                    .map_err(io_err("reading", Path::new("/dev/urandom")))?;
                write_atomically(&path, &key, 0o600)?;
                Ok(Some(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("reading", &path)(e)),
        }
    }

    pub fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let key = self.key(true)?.expect("created");
        write_atomically(
            &self.manifest_path(&manifest.snapshot),
            &manifest.render_signed(&key),
            0o600,
        )
    }

    /// Writes the in-progress marker, durable before the snapshot it names is created.
    pub fn mark(&self, snapshot: &SnapshotName) -> Result<()> {
        write_atomically(&self.marker_path(snapshot), b"", 0o600)
    }

    pub fn unmark(&self, snapshot: &SnapshotName) -> Result<()> {
        let path = self.marker_path(snapshot);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("removing", &path)(e)),
            _ => Ok(()),
        }
    }

    /// Detaches whatever a killed run left mounted under `dir` (its /proc, /sys, /dev binds).
    pub fn detach_under(&self, dir: &Path) -> Result<()> {
        let text = fs::read_to_string("/proc/self/mountinfo")
            .map_err(io_err("reading", Path::new("/proc/self/mountinfo")))?;
        for point in mountinfo::under(&mountinfo::parse(&text), dir) {
            let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.mounted_top {
            let _ = nix::mount::umount2(&self.top, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
