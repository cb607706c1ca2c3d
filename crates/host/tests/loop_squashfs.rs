//! Privileged: a real squashfs image attached to a real loop device and mounted read-only.
//! Needs root, `/dev/loop-control` and `mksquashfs`: skipped (saying why) without them, failed
//! under `CI=true` (see slate-testkit).

use std::path::Path;
use std::process::Command;

use slate_host::{attach_loop_read_only, detach_loop, mount, unmount, MsFlags};

/// Whether this machine can run the privileged tests.
fn privileged() -> bool {
    slate_testkit::require_root()
        && slate_testkit::require_path("/dev/loop-control", "modprobe loop")
        && slate_testkit::require_tool("mksquashfs")
}

#[test]
fn squashfs_on_a_read_only_loop_device() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/os-release"), "ID=slate\n").unwrap();
    let image = dir.path().join("rootfs.sqsh");
    let status = Command::new("mksquashfs")
        .arg(&tree)
        .arg(&image)
        .args(["-noappend", "-quiet", "-no-progress"])
        .status()
        .unwrap();
    assert!(status.success(), "mksquashfs failed");

    let device = attach_loop_read_only(&image).unwrap();
    let name = device.file_name().unwrap().to_str().unwrap().to_string();
    let ro = std::fs::read_to_string(format!("/sys/block/{name}/ro")).unwrap();
    assert_eq!(ro.trim(), "1", "{} is not read-only", device.display());
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap();
    assert_eq!(Path::new(backing.trim()), image.canonicalize().unwrap());

    let target = dir.path().join("mnt");
    std::fs::create_dir(&target).unwrap();
    let mounted = mount(&device, &target, "squashfs", MsFlags::MS_RDONLY, None);
    if let Err(err) = mounted {
        detach_loop(&device).unwrap();
        panic!("{err}: {:?}", std::error::Error::source(&err));
    }
    let content = std::fs::read_to_string(target.join("etc/os-release"));
    let write = std::fs::write(target.join("etc/new"), "x");
    unmount(&target).unwrap();
    detach_loop(&device).unwrap();

    assert_eq!(content.unwrap(), "ID=slate\n");
    assert!(write.is_err(), "a read-only mount accepted a write");
    // Detaching frees the device: its backing file is gone.
    assert!(!Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists());
}

#[test]
fn attaching_a_missing_image_names_it() {
    if !privileged() {
        return;
    }
    let err = attach_loop_read_only(Path::new("/nonexistent/rootfs.sqsh")).unwrap_err();
    assert_eq!(err.to_string(), "cannot open /nonexistent/rootfs.sqsh");
}
