//! Parallel compression: the thread count changes how fast an image is built, never its bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Cursor, Read};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::Command;

use backhand::{FilesystemReader, InnerNode};
use slate_rootfs::{build_squashfs, Compression, SquashfsOptions};

const BLOCK: usize = 128 * 1024;

/// Compressible text, different for each `seed`.
fn text(seed: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = seed;
    while out.len() < len {
        out.extend_from_slice(format!("{seed}: entry {} = {}\n", i % 613, i * 31).as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// Many small files (the fragment buffer fills and is cut many times), files of one to several
/// blocks with and without a tail, incompressible ones (stored uncompressed), a block of zeros
/// (a hole), a duplicate of a large file, and empty files. Returns every file's content.
fn make_tree(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut noise = slate_testkit::Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut files = BTreeMap::new();
    for i in 0..200 {
        let dir = PathBuf::from(format!("d{}/s{}", i % 7, i % 3));
        let len = match i % 10 {
            0 | 5 => noise.below(300),
            1 | 2 | 6 | 7 => noise.below(12_000),
            3 => noise.below(BLOCK),
            _ => 0,
        };
        let data = if i % 11 == 0 {
            noise.bytes(len)
        } else {
            text(i, len)
        };
        files.insert(dir.join(format!("small{i}")), data);
    }
    for i in 0..8 {
        let blocks = 1 + i % 3;
        let tail = if i % 2 == 0 { 0 } else { noise.below(BLOCK) };
        let len = blocks * BLOCK + tail;
        let data = if i % 4 == 3 {
            noise.bytes(len)
        } else {
            text(1000 + i, len)
        };
        files.insert(PathBuf::from(format!("big/b{i}")), data);
    }
    let mut holey = text(7, 2 * BLOCK + 99);
    holey[BLOCK..2 * BLOCK].fill(0);
    files.insert("big/holey".into(), holey);
    let mixed = [noise.bytes(BLOCK / 2), text(8, BLOCK)].concat();
    files.insert("big/mixed".into(), mixed);
    let copy = files[Path::new("big/b3")].clone();
    files.insert("copy-of-b3".into(), copy);
    for (rel, data) in &files {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    }
    files
}

fn build(src: &Path, threads: usize) -> Vec<u8> {
    let opts = SquashfsOptions {
        source_date_epoch: 1_700_000_000,
        threads: NonZeroUsize::new(threads),
        ..SquashfsOptions::default()
    };
    let mut out = Cursor::new(Vec::new());
    build_squashfs(src, &mut out, &opts).unwrap();
    out.into_inner()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let differing = a.iter().zip(b).position(|(x, y)| x != y);
    differing.or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[test]
fn one_two_and_sixteen_threads_write_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = make_tree(&src);
    let one = build(&src, 1);
    for threads in [2, 16] {
        let other = build(&src, threads);
        assert!(
            one == other,
            "{threads} threads: {} bytes against {} with 1 thread, first difference at {:?}",
            other.len(),
            one.len(),
            first_difference(&one, &other)
        );
    }

    // Read back with backhand: every file whole, and nothing else.
    let reader = FilesystemReader::from_reader(Cursor::new(one.clone())).unwrap();
    let mut read_back = BTreeMap::new();
    for node in reader.files() {
        if let InnerNode::File(file) = &node.inner {
            let mut data = Vec::new();
            reader.file(file).reader().read_to_end(&mut data).unwrap();
            let rel = node.fullpath.strip_prefix("/").unwrap().to_owned();
            read_back.insert(rel, data);
        }
    }
    assert_eq!(read_back.len(), files.len());
    for (rel, data) in &files {
        let got = &read_back[rel];
        assert!(got == data, "{rel:?}: {} bytes read back", got.len());
    }

    // And with squashfs-tools: the listing is the tree.
    let image = tmp.path().join("root.sqsh");
    fs::write(&image, &one).unwrap();
    let out = Command::new("unsquashfs")
        .arg("-l")
        .arg(&image)
        .output()
        .expect("unsquashfs (squashfs-tools) must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: BTreeSet<PathBuf> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("squashfs-root/"))
        .map(PathBuf::from)
        .filter(|p| files.contains_key(p))
        .collect();
    assert_eq!(listed.len(), files.len());
}

#[test]
fn small_blocks_and_an_empty_tree_too() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert_eq!(build(&empty, 1), build(&empty, 3));

    // 4 KiB blocks: every file above is many blocks, every small one closes fragments often.
    // (A low level, for time: what the thread count may change does not depend on it.)
    let src = tmp.path().join("src");
    make_tree(&src);
    let with = |threads| {
        let opts = SquashfsOptions {
            block_size: 4096,
            compression: Compression::Zstd { level: 3 },
            threads: NonZeroUsize::new(threads),
            ..SquashfsOptions::default()
        };
        let mut out = Cursor::new(Vec::new());
        build_squashfs(&src, &mut out, &opts).unwrap();
        out.into_inner()
    };
    assert!(with(1) == with(5));
}
