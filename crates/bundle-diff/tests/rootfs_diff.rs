//! The root filesystem diff over real squashfs images: two trees built by slate-rootfs' builder
//! (and one by backhand's writer, for owners) differing by one file added, one changed, one
//! removed, one symlink retargeted, one mode change; the exact lists, their text and JSON, and
//! bad images refused without a panic.

use std::fs;
use std::io::Cursor;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use backhand::compression::Compressor;
use backhand::{FilesystemCompressor, FilesystemWriter, NodeHeader};
use slate_bundle::Digest;
use slate_bundle_diff::{
    diff_rootfs, list_squashfs, Aspect, Listing, NodeKind, RootfsDiff, RootfsError,
};
use slate_rootfs::{build_squashfs, SquashfsOptions};

fn file(root: &Path, rel: &str, content: &[u8], mode: u32) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, content).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
}

fn squashfs(root: &Path) -> Vec<u8> {
    let opts = SquashfsOptions {
        compression: slate_rootfs::Compression::Zstd { level: 3 },
        ..SquashfsOptions::default()
    };
    let mut out = Cursor::new(Vec::new());
    build_squashfs(root, &mut out, &opts).unwrap();
    out.into_inner()
}

/// Both trees: what A has, and B with the five differences (and one new directory).
fn images() -> (Vec<u8>, Vec<u8>) {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for (i, dir) in dirs.iter().enumerate() {
        let root = dir.path();
        fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
        let b = i == 1;
        file(
            root,
            "etc/hostname",
            if b { b"node-b\n" } else { b"node\n" },
            0o644,
        );
        file(root, "etc/motd", if b { b"bbbb" } else { b"aaaa" }, 0o644);
        file(root, "etc/same", b"unchanged", 0o644);
        file(
            root,
            "usr/bin/tool",
            b"#!/bin/sh\n",
            if b { 0o700 } else { 0o755 },
        );
        if b {
            file(root, "usr/bin/new-tool", b"new", 0o755);
            fs::create_dir(root.join("opt")).unwrap();
            fs::set_permissions(root.join("opt"), fs::Permissions::from_mode(0o755)).unwrap();
        } else {
            file(root, "etc/old", b"old", 0o644);
        }
        fs::create_dir_all(root.join("lib")).unwrap();
        let target = if b { "libx.so.2" } else { "libx.so.1" };
        std::os::unix::fs::symlink(target, root.join("lib/libx.so")).unwrap();
        for d in ["etc", "usr", "usr/bin", "lib"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    (squashfs(dirs[0].path()), squashfs(dirs[1].path()))
}

fn paths<T>(list: &[T], path: impl Fn(&T) -> &str) -> Vec<&str> {
    list.iter().map(path).collect()
}

#[test]
fn the_lists_are_exactly_the_differences() {
    let (a, b) = images();
    let (a, b) = (list_squashfs(&a).unwrap(), list_squashfs(&b).unwrap());
    let tool = &a[b"/usr/bin/tool".as_slice()];
    assert_eq!(
        (tool.kind, tool.mode, tool.uid, tool.gid),
        (NodeKind::File, 0o755, 0, 0)
    );
    assert_eq!(tool.size, Some(10));
    assert_eq!(tool.digest, Some(Digest::of(b"#!/bin/sh\n")));
    assert_eq!(a[b"/".as_slice()].kind, NodeKind::Dir);

    let d = diff_rootfs(&a, &b);
    assert_eq!(paths(&d.added, |e| &e.path), ["/opt", "/usr/bin/new-tool"]);
    assert_eq!(d.added[0].node.kind, NodeKind::Dir);
    assert_eq!(d.added[1].node.size, Some(3));
    assert_eq!(paths(&d.removed, |e| &e.path), ["/etc/old"]);
    let changed: Vec<_> = d
        .changed
        .iter()
        .map(|c| (c.path.as_str(), c.what.clone()))
        .collect();
    assert_eq!(
        changed,
        [
            ("/etc/hostname", vec![Aspect::Size, Aspect::Content]),
            ("/etc/motd", vec![Aspect::Content]),
            ("/lib/libx.so", vec![Aspect::Target]),
            ("/usr/bin/tool", vec![Aspect::Mode]),
        ]
    );
    let hostname = &d.changed[0];
    assert_eq!((hostname.old.size, hostname.new.size), (Some(5), Some(7)));

    // The same image against itself: nothing.
    assert_eq!(diff_rootfs(&a, &a), RootfsDiff::default());
    // B against A: the mirror image.
    let back = diff_rootfs(&b, &a);
    assert_eq!(
        paths(&back.removed, |e| &e.path),
        ["/opt", "/usr/bin/new-tool"]
    );
    assert_eq!(paths(&back.added, |e| &e.path), ["/etc/old"]);
}

#[test]
fn json_names_kinds_modes_and_digests() {
    let (a, b) = images();
    let d = diff_rootfs(&list_squashfs(&a).unwrap(), &list_squashfs(&b).unwrap());
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(
        json["added"][1],
        serde_json::json!({
            "path": "/usr/bin/new-tool",
            "kind": "file",
            "mode": "0755",
            "uid": 0,
            "gid": 0,
            "size": 3,
            "digest": Digest::of(b"new").to_string(),
        })
    );
    assert_eq!(json["changed"][2]["what"], serde_json::json!(["target"]));
    assert_eq!(json["changed"][2]["old"]["target"], "libx.so.1");
    assert_eq!(json["changed"][2]["new"]["target"], "libx.so.2");
    assert_eq!(json["changed"][3]["old"]["mode"], "0755");
    assert_eq!(json["changed"][3]["new"]["mode"], "0700");
}

/// backhand's writer, for what slate's builder never writes: owners other than root.
fn owned_image(uid: u32, gid: u32) -> Vec<u8> {
    let mut writer = FilesystemWriter::default();
    writer.set_compressor(FilesystemCompressor::new(Compressor::Zstd, None).unwrap());
    let header = NodeHeader::new(0o755, 0, 0, 0);
    writer.push_dir("home", header).unwrap();
    writer
        .push_file(
            Cursor::new(b"x".to_vec()),
            "home/file",
            NodeHeader::new(0o600, uid, gid, 0),
        )
        .unwrap();
    let mut out = Cursor::new(Vec::new());
    writer.write(&mut out).unwrap();
    out.into_inner()
}

#[test]
fn owners_are_compared() {
    let a = list_squashfs(&owned_image(0, 0)).unwrap();
    let b = list_squashfs(&owned_image(1000, 100)).unwrap();
    let d = diff_rootfs(&a, &b);
    assert!(d.added.is_empty() && d.removed.is_empty());
    assert_eq!(d.changed.len(), 1);
    assert_eq!(d.changed[0].path, "/home/file");
    assert_eq!(d.changed[0].what, [Aspect::Uid, Aspect::Gid]);
    assert_eq!((d.changed[0].new.uid, d.changed[0].new.gid), (1000, 100));
}

#[test]
fn bad_images_are_errors_not_panics() {
    let (a, _) = images();
    assert!(matches!(list_squashfs(b""), Err(RootfsError::Squashfs(_))));
    assert!(matches!(
        list_squashfs(&[0u8; 4096]),
        Err(RootfsError::Squashfs(_))
    ));
    // The superblock's bytes_used (offset 40): the image proper, before its padding to 4 KiB.
    let used = u64::from_le_bytes(a[40..48].try_into().unwrap()) as usize;
    assert!(used < a.len());
    for cut in [96, used / 2, used - 1] {
        let result: Result<Listing, _> = list_squashfs(&a[..cut]);
        assert!(result.is_err(), "cut at {cut} of {} listed", a.len());
    }
    // Every single byte flipped in turn: an error or a listing, never a panic.
    for i in (0..a.len()).step_by(7) {
        let mut bad = a.clone();
        bad[i] ^= 0x5a;
        let _ = list_squashfs(&bad);
    }
}

#[test]
fn an_image_that_would_expand_too_far_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // 80 MiB of zeros compress to a few KiB: past 64 MiB + 256 times the image.
    file(dir.path(), "zeros", &vec![0u8; 80 << 20], 0o644);
    let image = squashfs(dir.path());
    match list_squashfs(&image) {
        Err(RootfsError::Expansion { declared, .. }) => assert_eq!(declared, 80 << 20),
        other => panic!("listed: {:?}", other.map(|l| l.len())),
    }
}
