use std::process::Command;

use super::*;

#[test]
fn exactly_one_release_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(module_release(dir.path()).is_err());
    std::fs::create_dir(dir.path().join("6.1.0-13-amd64")).unwrap();
    std::fs::write(dir.path().join("stray-file"), "").unwrap();
    assert_eq!(module_release(dir.path()).unwrap(), "6.1.0-13-amd64");
    std::fs::create_dir(dir.path().join("6.1.0-12-amd64")).unwrap();
    let err = module_release(dir.path()).unwrap_err().to_string();
    assert!(err.contains("expected exactly one kernel release"), "{err}");
}

/// A manifest line for `file` with `content` (its real size and digest).
fn line(file: &str, name: &str, content: &[u8]) -> String {
    use sha2::{Digest as _, Sha256};
    format!(
        "{file} {name} 1.0 {} sha256:{:x}\n",
        content.len(),
        Sha256::digest(content)
    )
}

#[test]
fn extensions_are_found_through_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let ext = dir.path().join("extensions");
    assert_eq!(find_extensions(&ext).unwrap(), Extensions::default());
    std::fs::create_dir(&ext).unwrap();
    assert_eq!(find_extensions(&ext).unwrap(), Extensions::default());
    for name in ["b.sqsh", "a.sqsh", "stray.sqsh"] {
        std::fs::write(ext.join(name), "").unwrap();
    }
    let err = find_extensions(&ext).unwrap_err().to_string();
    assert!(err.contains("no manifest"), "{err}");
    let manifest = format!(
        "# header\n{}{}",
        line("b.sqsh", "b", b""),
        line("a.sqsh", "a", b"")
    );
    std::fs::write(ext.join(MANIFEST), manifest).unwrap();
    let found = find_extensions(&ext).unwrap();
    let files: Vec<&str> = found.ordered.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(files, ["b.sqsh", "a.sqsh"]);
    assert_eq!(found.unlisted, ["stray.sqsh"]);
    std::fs::write(ext.join(MANIFEST), line("missing.sqsh", "m", b"")).unwrap();
    let err = find_extensions(&ext).unwrap_err().to_string();
    assert!(err.contains("lists missing.sqsh"), "{err}");
    std::fs::write(ext.join(MANIFEST), "a.sqsh\n").unwrap();
    let err = format!("{:#}", find_extensions(&ext).unwrap_err());
    assert!(err.contains("line 1: 1 fields"), "{err}");
}

#[test]
fn an_extension_that_does_not_match_its_digest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.sqsh"), b"squashfs").unwrap();
    let entry = |text: String| parse_extensions_manifest(&text).unwrap().remove(0);
    check_extension(dir.path(), &entry(line("a.sqsh", "a", b"squashfs"))).unwrap();
    let err = check_extension(dir.path(), &entry(line("a.sqsh", "a", b"squashfz")))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("system extension a 1.0") && err.contains("has digest"),
        "{err}"
    );
    let err = check_extension(dir.path(), &entry(line("a.sqsh", "a", b"squash")))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is 8 bytes, the image's manifest says 6"),
        "{err}"
    );
}

/// Whether this machine can run the privileged test (skipped, saying why, when not; failed
/// under `CI=true`).
fn privileged() -> bool {
    slate_testkit::require_root()
        && slate_testkit::require_path("/dev/loop-control", "modprobe loop")
        && slate_testkit::require_tool("mksquashfs")
}

fn squashfs(dir: &Path, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let tree = dir.join(format!("{name}.tree"));
    for (path, content) in files {
        let path = tree.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let image = dir.join(name);
    let status = Command::new("mksquashfs")
        .arg(&tree)
        .arg(&image)
        .args(["-noappend", "-quiet", "-no-progress"])
        .status()
        .unwrap();
    assert!(status.success(), "mksquashfs {name} failed");
    image
}

fn tear_down(target: &Path, layers: &[Layer], devices: &[PathBuf]) {
    host::unmount(target).unwrap();
    if layers.len() > 1 {
        for layer in layers {
            host::unmount(&layer.mountpoint).unwrap();
        }
    }
    for device in devices {
        host::detach_loop(device).unwrap();
    }
}

/// The real thing, as root: squashfs images on loop devices, stacked by overlayfs.
#[test]
fn root_stack_layers_extensions_over_the_rootfs() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rootfs = squashfs(dir.path(), "rootfs.sqsh", &[("a", "root"), ("b", "root")]);
    let ext_dir = dir.path().join("extensions");
    squashfs(&ext_dir, "one.sqsh", &[("b", "one"), ("c", "one")]);
    squashfs(&ext_dir, "two.sqsh", &[("c", "two"), ("d", "two")]);
    let entry_line = |file: &str| {
        let bytes = std::fs::read(ext_dir.join(file)).unwrap();
        line(file, file.trim_end_matches(".sqsh"), &bytes)
    };
    std::fs::write(
        ext_dir.join(MANIFEST),
        format!("{}{}", entry_line("one.sqsh"), entry_line("two.sqsh")),
    )
    .unwrap();
    let log = KmsgLogger::stderr("test");

    let extensions = find_extensions(&ext_dir).unwrap();
    let files: Vec<String> = extensions.ordered.iter().map(|e| e.file.clone()).collect();
    let layers = plan_layers(&rootfs, &ext_dir, &files, &dir.path().join("layers"));
    let target = dir.path().join("newroot");
    std::fs::create_dir(&target).unwrap();
    let devices = mount_root_stack(&log, &layers, &target).unwrap();
    let read = |name: &str| std::fs::read_to_string(target.join(name)).unwrap_or_default();
    let seen = [read("a"), read("b"), read("c"), read("d")];
    let writable = std::fs::write(target.join("new"), "x").is_ok();
    tear_down(&target, &layers, &devices);
    assert_eq!(seen, ["root", "one", "one", "two"]);
    assert!(!writable, "the overlay root accepted a write");

    // Without extensions the rootfs is mounted directly.
    let layers = plan_layers(&rootfs, &ext_dir, &[], &dir.path().join("layers"));
    let devices = mount_root_stack(&log, &layers, &target).unwrap();
    let seen = [read("a"), read("b"), read("c")];
    tear_down(&target, &layers, &devices);
    assert_eq!(devices.len(), 1);
    assert_eq!(seen, ["root", "root", ""]);
}
