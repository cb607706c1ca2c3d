//! Conformance: images written by slate-rootfs, read back by squashfs-tools' `unsquashfs`.

use std::collections::BTreeSet;
use std::fs;
use std::io::Cursor;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use slate_rootfs::{
    build_squashfs, build_squashfs_with_progress, HardLinks, RootfsError, SquashfsOptions, Xattrs,
};

const EPOCH: u32 = 1_700_000_000;

fn opts() -> SquashfsOptions {
    SquashfsOptions {
        source_date_epoch: EPOCH,
        ..SquashfsOptions::default()
    }
}

fn write_mode(path: &Path, data: &[u8], mode: u32) {
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with the shapes a root filesystem has. Returns true if device nodes were made: that
/// needs root, without which the tree has none (saying so; failed under `CI=true`).
fn make_tree(root: &Path) -> bool {
    fs::create_dir_all(root.join("usr/lib/deep/er")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::create_dir_all(root.join("bin")).unwrap();
    write_mode(&root.join("bin/tool"), b"#!/bin/sh\necho hi\n", 0o755);
    write_mode(&root.join("secret"), b"only root", 0o600);
    write_mode(&root.join("setuid"), b"s", 0o4755);
    write_mode(&root.join("empty-file"), b"", 0o644);
    // Bigger than one 128 KiB block, not all zeros, plus a sparse-looking zero block.
    let mut big: Vec<u8> = (0..400_000u32).map(|i| (i * 7 % 251) as u8).collect();
    big.extend(std::iter::repeat_n(0u8, 131_072));
    write_mode(&root.join("usr/lib/deep/er/big.bin"), &big, 0o644);
    write_mode(&root.join("usr/lib/dup1"), b"same bytes", 0o644);
    write_mode(&root.join("usr/lib/dup2"), b"same bytes", 0o644);
    symlink("../usr/lib/dup1", root.join("bin/rel-link")).unwrap();
    symlink("/usr/lib/deep", root.join("abs-link")).unwrap();
    symlink("dangling-target", root.join("dangling")).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o1777)).unwrap();
    let fifo = Command::new("mkfifo").arg(root.join("fifo")).status();
    assert!(fifo.is_ok_and(|s| s.success()), "mkfifo failed");
    let null = Command::new("mknod")
        .args(["-m", "666"])
        .arg(root.join("null"))
        .args(["c", "1", "3"])
        .status();
    let made = null.is_ok_and(|s| s.success());
    if slate_testkit::require(
        made,
        "mknod of device nodes (root)",
        "run the tests as root",
    ) {
        let status = Command::new("mknod")
            .arg(root.join("vda"))
            .args(["b", "254", "0"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    made
}

fn build(src: &Path, opts: &SquashfsOptions) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    build_squashfs(src, &mut out, opts).unwrap();
    out.into_inner()
}

fn all_paths(root: &Path) -> BTreeSet<PathBuf> {
    let mut paths = BTreeSet::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            paths.insert(path.strip_prefix(root).unwrap().to_owned());
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    paths
}

fn unsquashfs(args: &[&str], image: &Path) -> String {
    let out = Command::new("unsquashfs")
        .args(args)
        .arg(image)
        .output()
        .expect("unsquashfs (squashfs-tools) must be installed");
    assert!(
        out.status.success(),
        "unsquashfs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn unsquashfs_lists_and_extracts_the_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let devices = make_tree(&src);
    let image = tmp.path().join("root.sqsh");
    let mut file = fs::File::create(&image).unwrap();
    let stats = build_squashfs(&src, &mut file, &opts()).unwrap();
    drop(file);
    assert_eq!(stats.image_bytes, fs::metadata(&image).unwrap().len());
    assert_eq!(stats.files, 7);
    assert_eq!(stats.symlinks, 3);
    assert_eq!(stats.devices, if devices { 2 } else { 0 });

    // `unsquashfs -l` prints squashfs-root and squashfs-root/<path> for every inode.
    let expected = all_paths(&src);
    let listed: BTreeSet<PathBuf> = unsquashfs(&["-l"], &image)
        .lines()
        .filter_map(|l| l.strip_prefix("squashfs-root/"))
        .map(PathBuf::from)
        .collect();
    assert_eq!(listed, expected);

    // Numeric long listing: every inode owned by 0/0 and dated EPOCH.
    let long = unsquashfs(&["-lln", "-UTC"], &image);
    let entries: Vec<&str> = long
        .lines()
        .filter(|l| l.contains("squashfs-root"))
        .collect();
    assert_eq!(entries.len(), expected.len() + 1);
    for line in entries {
        assert!(line.contains(" 0/0 "), "owner not 0/0: {line}");
        assert!(line.contains("2023-11-14 22:13"), "mtime not EPOCH: {line}");
    }
    let superblock = unsquashfs(&["-s"], &image);
    assert!(superblock.contains("Compression zstd"), "{superblock}");

    let dest = tmp.path().join("extracted");
    unsquashfs(&["-q", "-n", "-d", dest.to_str().unwrap()], &image);
    assert_eq!(all_paths(&dest), expected);
    for rel in &expected {
        let (a, b) = (src.join(rel), dest.join(rel));
        let (ma, mb) = (
            fs::symlink_metadata(&a).unwrap(),
            fs::symlink_metadata(&b).unwrap(),
        );
        assert_eq!(ma.file_type(), mb.file_type(), "{rel:?}");
        if ma.is_symlink() {
            assert_eq!(
                fs::read_link(&a).unwrap(),
                fs::read_link(&b).unwrap(),
                "{rel:?}"
            );
            continue;
        }
        assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "mode of {rel:?}");
        assert_eq!(mb.mtime(), i64::from(EPOCH), "mtime of {rel:?}");
        if ma.is_file() {
            assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap(), "{rel:?}");
        }
        if ma.file_type().is_char_device() || ma.file_type().is_block_device() {
            assert_eq!(ma.rdev(), mb.rdev(), "device number of {rel:?}");
        }
    }
}

#[test]
fn builds_are_bit_identical_whatever_the_source_mtimes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let first = build(&src, &opts());
    assert_eq!(first, build(&src, &opts()));

    // Touching sources must not change the image: only the options' epoch is stored.
    let file = fs::File::options()
        .write(true)
        .open(src.join("bin/tool"))
        .unwrap();
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(12345))
        .unwrap();
    assert_eq!(first, build(&src, &opts()));

    let other_epoch = SquashfsOptions {
        source_date_epoch: EPOCH + 1,
        ..opts()
    };
    assert_ne!(first, build(&src, &other_epoch));
}

#[test]
fn progress_reports_every_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    make_tree(tmp.path());
    let mut calls = Vec::new();
    let mut out = Cursor::new(Vec::new());
    let stats = build_squashfs_with_progress(tmp.path(), &mut out, &opts(), &mut |done, total| {
        calls.push((done, total))
    })
    .unwrap();
    let n = stats.files;
    assert_eq!(calls.first(), Some(&(0, n)));
    assert_eq!(calls.last(), Some(&(n, n)));
    assert_eq!(calls.len() as u64, n + 1);
    assert!(calls.windows(2).all(|w| w[1].0 == w[0].0 + 1));
}

#[test]
fn hard_links_are_copied_or_refused() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("a"), b"linked").unwrap();
    fs::hard_link(tmp.path().join("a"), tmp.path().join("b")).unwrap();
    let mut out = Cursor::new(Vec::new());
    let stats = build_squashfs(tmp.path(), &mut out, &opts()).unwrap();
    assert_eq!((stats.files, stats.hard_links_copied), (2, 1));

    let refuse = SquashfsOptions {
        hard_links: HardLinks::Error,
        ..opts()
    };
    let err = build_squashfs(tmp.path(), Cursor::new(Vec::new()), &refuse).unwrap_err();
    assert!(matches!(&err, RootfsError::HardLink { path, .. } if path == Path::new("b")));
    assert!(err.to_string().contains("hard link"), "{err}");
}

#[test]
fn xattrs_are_refused_unless_ignored() {
    // Under the target directory rather than /tmp, which may be a tmpfs without user xattrs.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = tmp.path().join("capable");
    fs::write(&file, b"x").unwrap();
    let set = xattr::set(&file, "user.slate-test", b"1");
    if !slate_testkit::require(
        set.is_ok(),
        "user xattrs on the filesystem of CARGO_TARGET_TMPDIR",
        &format!("setting one failed: {set:?}"),
    ) {
        return;
    }
    let err = build_squashfs(tmp.path(), Cursor::new(Vec::new()), &opts()).unwrap_err();
    assert!(err.to_string().contains("user.slate-test"), "{err}");
    let ignore = SquashfsOptions {
        xattrs: Xattrs::Ignore,
        ..opts()
    };
    build_squashfs(tmp.path(), Cursor::new(Vec::new()), &ignore).unwrap();
}

#[test]
fn unreadable_input_names_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let err = build_squashfs(
        &tmp.path().join("missing"),
        Cursor::new(Vec::new()),
        &opts(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    let file = tmp.path().join("file");
    fs::write(&file, b"").unwrap();
    let err = build_squashfs(&file, Cursor::new(Vec::new()), &opts()).unwrap_err();
    assert!(matches!(err, RootfsError::NotADirectory(_)));
}
