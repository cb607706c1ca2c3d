//! A node whose root is a Btrfs snapshot (`slate imager build --output btrfs-image`; the
//! seed's mutable root, docs/update-transaction.md "Btrfs snapshots"): no META, no A/B UKIs.
//! Its persistent state is the pool's `@state` subvolume on `/system/state` and its users'
//! data `@home` on `/home`, both outside every snapshot so that a rollback keeps them. This is
//! what every layer reads of it: where the root comes from and how its pool opens. The boot's
//! volumes are `boot::snapshot_volumes`, the settle `settle::snapshot`, the API's listing and
//! upgrade `backend::snapshots`.

use std::path::{Path, PathBuf};

use slate_snapshot::SnapshotName;
use slate_snapshot_engine::{self as engine, Pool};

pub use slate_snapshot::{HOME_SUBVOLUME, STATE_SUBVOLUME};

/// Where the running root comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRoot {
    /// The snapshot mounted on `/`.
    pub snapshot: SnapshotName,
    /// The pool's partition (`/dev/vda2`).
    pub device: PathBuf,
    /// Its disk (`/dev/vda`), whose GPT also holds the ESP.
    pub disk: PathBuf,
}

/// The snapshot root as `/proc/self/mountinfo` shows it: `/` is Btrfs, mounted from a
/// top-level `root-…` subvolume. `None` on an image (squashfs) root.
pub fn from_mountinfo(text: &str) -> Option<(SnapshotName, PathBuf)> {
    let mounts = engine::mountinfo::parse(text);
    let root = engine::mountinfo::mount_at(&mounts, Path::new("/"))?;
    if root.fstype != "btrfs" {
        return None;
    }
    let snapshot = SnapshotName::parse(root.root.trim_start_matches('/')).ok()?;
    Some((snapshot, PathBuf::from(&root.source)))
}

/// Detects the snapshot root of this boot.
pub fn detect() -> Option<SnapshotRoot> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (snapshot, device) = from_mountinfo(&text)?;
    let disk = slate_host::disk_of_partition(&device).ok()?;
    Some(SnapshotRoot {
        snapshot,
        device,
        disk,
    })
}

pub fn open_pool(root: &SnapshotRoot, lock: bool) -> Result<Pool, String> {
    Pool::open(Path::new("/"), &root.disk, lock).map_err(|e| pool_error(&e))
}

pub fn pool_error(e: &engine::EngineError) -> String {
    format!(
        "opening the Btrfs pool: {}",
        slate_sequencer::error_chain(e)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNAPSHOT_ROOT: &str = "\
22 1 0:21 /root-20261202-034907 / rw,relatime shared:1 - btrfs /dev/vda2 rw,space_cache=v2,subvolid=256,subvol=/root-20261202-034907
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,size=10240k
";

    #[test]
    fn a_snapshot_root_is_recognised_from_mountinfo() {
        let (snapshot, device) = from_mountinfo(SNAPSHOT_ROOT).unwrap();
        assert_eq!(snapshot.as_str(), "root-20261202-034907");
        assert_eq!(device, PathBuf::from("/dev/vda2"));
    }

    #[test]
    fn image_roots_and_other_subvolumes_are_not_snapshot_roots() {
        let squashfs = "22 1 7:0 / / ro,relatime - squashfs /dev/loop0 ro\n";
        assert_eq!(from_mountinfo(squashfs), None);
        let at = "22 1 0:21 /@ / rw - btrfs /dev/vda2 rw,subvol=/@\n";
        assert_eq!(from_mountinfo(at), None);
        // The last mount on / is the one in effect.
        let over = format!("{SNAPSHOT_ROOT}30 22 0:30 / / rw - tmpfs tmpfs rw\n");
        assert_eq!(from_mountinfo(&over), None);
    }
}
