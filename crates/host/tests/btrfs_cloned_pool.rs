//! Privileged: two copies of one Btrfs file system mounted at once. Since Linux 6.7 the second
//! gets a random in-memory fsid; `pool_uuid` must still name the on-disk UUID, the one boot
//! entries and GRUB search by. Needs root, loop devices and mkfs.btrfs (failed under CI=true
//! without them, see slate-testkit).

use std::path::Path;
use std::process::Command;

/// The UUID blkid reads from the image's superblock: what `root=UUID=` and GRUB's search
/// match, found without the code under test.
fn on_disk_uuid(image: &Path) -> String {
    slate_testkit::sh(
        "blkid",
        &["-p", "-s", "UUID", "-o", "value", image.to_str().unwrap()],
    )
}

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount_loop(image: &Path, at: &Path) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    slate_testkit::sh(
        "mount",
        &["-o", "loop", image.to_str().unwrap(), at.to_str().unwrap()],
    );
    Mount(at.to_path_buf())
}

#[test]
fn a_cloned_pool_mounted_twice_reports_its_on_disk_uuid() {
    if !(slate_testkit::require_root()
        && slate_testkit::require_path("/dev/loop-control", "modprobe loop")
        && slate_testkit::require_tool("mkfs.btrfs")
        && slate_testkit::require_tool("blkid"))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.img");
    let clone = dir.path().join("clone.img");
    std::fs::File::create(&first)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    slate_testkit::sh("mkfs.btrfs", &["-q", first.to_str().unwrap()]);
    std::fs::copy(&first, &clone).unwrap();
    let uuid = on_disk_uuid(&first);
    assert_eq!(on_disk_uuid(&clone), uuid);

    let a = mount_loop(&first, &dir.path().join("a"));
    if !slate_testkit::require_path(
        "/sys/fs/btrfs/features/temp_fsid",
        "a kernel with Btrfs temp-fsid (Linux 6.7 or later)",
    ) {
        return;
    }
    let b = mount_loop(&clone, &dir.path().join("b"));
    assert_eq!(slate_host::pool_uuid(&a.0).unwrap(), uuid);
    assert_eq!(slate_host::pool_uuid(&b.0).unwrap(), uuid);
    // The kernel really did give the clone another fsid.
    let temp = std::fs::read_dir("/sys/fs/btrfs")
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path().join("temp_fsid");
            std::fs::read_to_string(p).ok()
        })
        .filter(|t| t.trim() == "1")
        .count();
    assert!(temp >= 1, "no temporary fsid in /sys/fs/btrfs");
    drop(b);
    drop(a);
}
