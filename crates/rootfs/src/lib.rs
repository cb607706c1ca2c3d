//! Reproducible squashfs images of a root filesystem directory tree.
//!
//! The imager packs the node's root filesystem into `rootfs.sqsh`, which the initramfs
//! mounts read-only. An image id is a hash of the artifacts, so two builds of the same tree
//! must give the same bytes: every inode gets the same mtime (`SOURCE_DATE_EPOCH`) and
//! uid/gid 0, entries are visited in byte order, and nothing from the build host (time, user,
//! inode numbers) reaches the image. Writing is done by the `backhand` crate.
//!
//! Kept: regular files, directories, symlinks, character/block devices, FIFOs, sockets, and
//! permission bits including setuid/setgid/sticky. Two things backhand 0.25 cannot write:
//! - extended attributes (e.g. `security.capability`): refused with an error naming the file
//!   by default ([`Xattrs::Error`]), or dropped with [`Xattrs::Ignore`];
//! - hard-link inodes: by default ([`HardLinks::Copy`]) each link becomes its own inode whose
//!   data is deduplicated, which a read-only root cannot tell apart except by link count;
//!   [`HardLinks::Error`] refuses them instead.
//!
//! Data blocks are compressed on [`SquashfsOptions::threads`] threads; the image is the same,
//! byte for byte, whatever their number (see `parallel.rs` for why), and whether or not a
//! [`BlockCache`] gave some of them (see `cache.rs`).

mod cache;
mod file_data;
mod parallel;
mod tree_file;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::io::{self, Cursor, Seek, Write};
use std::num::NonZeroUsize;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::thread;

use backhand::compression::{CompressionOptions, Compressor, Zstd};
use backhand::{
    BackhandError, FilesystemCompressor, FilesystemReader, FilesystemWriter, NodeHeader,
    MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};

pub use cache::{block_key, BlockCache};
pub use file_data::{file_data, storage_of, Storage, StorageError};
use tree_file::{Shared, TreeFile};

/// Block compression of the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    /// zstd at `level` (1..=22); mksquashfs's default zstd level is 15.
    Zstd { level: u32 },
}

/// What to do with a regular file that has more than one link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardLinks {
    /// Store every link as its own inode; file data is deduplicated, so the cost is one inode.
    Copy,
    /// Refuse the tree, naming the second link found.
    Error,
}

/// What to do with extended attributes (e.g. `security.capability`), which are not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xattrs {
    /// Refuse the tree, naming the file: silently dropping a file capability breaks programs.
    Error,
    /// Drop them.
    Ignore,
}

/// How to build the image. [`Default`] is zstd 15, 128 KiB blocks, epoch 0, all cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquashfsOptions {
    /// mtime of every inode and of the superblock (seconds since 1970).
    pub source_date_epoch: u32,
    pub compression: Compression,
    /// Data block size: a power of two from 4 KiB to 1 MiB.
    pub block_size: u32,
    pub hard_links: HardLinks,
    pub xattrs: Xattrs,
    /// Threads compressing data blocks; `None` is one per available core. Only the build's
    /// speed depends on it, never the image's bytes.
    pub threads: Option<NonZeroUsize>,
}

impl Default for SquashfsOptions {
    fn default() -> Self {
        Self {
            source_date_epoch: 0,
            compression: Compression::Zstd { level: 15 },
            block_size: 128 * 1024,
            hard_links: HardLinks::Copy,
            xattrs: Xattrs::Error,
            threads: None,
        }
    }
}

impl SquashfsOptions {
    /// Defaults, with `source_date_epoch` taken from the `SOURCE_DATE_EPOCH` environment
    /// variable when set (the reproducible-builds convention).
    pub fn from_env() -> Result<Self, RootfsError> {
        let mut opts = Self::default();
        if let Some(value) = std::env::var_os("SOURCE_DATE_EPOCH") {
            let text = value.to_string_lossy().into_owned();
            opts.source_date_epoch = text.trim().parse().map_err(|_| {
                RootfsError::InvalidOption(format!(
                    "SOURCE_DATE_EPOCH={text:?} is not a u32 seconds value"
                ))
            })?;
        }
        Ok(opts)
    }
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub files: u64,
    /// Directories, not counting the root.
    pub dirs: u64,
    pub symlinks: u64,
    /// Character and block devices.
    pub devices: u64,
    /// FIFOs and sockets.
    pub special: u64,
    /// Extra links of hard-linked files stored as separate inodes ([`HardLinks::Copy`]).
    pub hard_links_copied: u64,
    /// Sum of regular file sizes.
    pub file_bytes: u64,
    /// Size of the image written, padding included.
    pub image_bytes: u64,
}

/// Errors name the path involved, relative to the source directory where possible.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RootfsError {
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: source of a squashfs image must be a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("{}: extended attributes {names:?} cannot be stored (backhand writes no xattrs)", .path.display())]
    Xattrs { path: PathBuf, names: Vec<String> },
    #[error("{}: hard link to {} (hard links are refused by the options)", .path.display(), .first.display())]
    HardLink { path: PathBuf, first: PathBuf },
    #[error("{}: device {major}:{minor} does not fit squashfs's 12-bit major / 20-bit minor", .path.display())]
    DeviceNumber {
        path: PathBuf,
        major: u64,
        minor: u64,
    },
    #[error("invalid option: {0}")]
    InvalidOption(String),
    #[error("squashfs writer failed while {context}: {source}")]
    Squashfs {
        context: &'static str,
        source: BackhandError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RootfsError + '_ {
    move |source| RootfsError::Io {
        path: path.to_owned(),
        source,
    }
}

fn sq_err(context: &'static str) -> impl FnOnce(BackhandError) -> RootfsError {
    move |source| RootfsError::Squashfs { context, source }
}

/// Builds a squashfs image of `src_dir` into `out`. See [`build_squashfs_with_progress`].
pub fn build_squashfs<W: Write + Seek>(
    src_dir: &Path,
    out: W,
    opts: &SquashfsOptions,
) -> Result<Stats, RootfsError> {
    build_squashfs_with_progress(src_dir, out, opts, &mut |_, _| {})
}

/// Builds a squashfs image of `src_dir` into `out`, calling `progress(files_done,
/// files_total)` once before any data is written and after each regular file is compressed.
/// `files_total` is the number of regular files; the tree is scanned fully (and checked for
/// unsupported items) before the first byte is written.
pub fn build_squashfs_with_progress<W: Write + Seek>(
    src_dir: &Path,
    out: W,
    opts: &SquashfsOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Stats, RootfsError> {
    build(src_dir, out, opts, None, progress).map(|(stats, _)| stats)
}

/// [`build_squashfs_with_progress`], with data blocks and fragments taken from `cache` when
/// it holds their frame, and the others kept there once compressed. The image is the same
/// bytes as without a cache.
pub fn build_squashfs_cached<W: Write + Seek>(
    src_dir: &Path,
    out: W,
    opts: &SquashfsOptions,
    cache: &dyn BlockCache,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Stats, RootfsError> {
    build(src_dir, out, opts, Some(cache), progress).map(|(stats, _)| stats)
}

/// The build, with how the parallel compression's prediction fared (for the tests).
fn build<W: Write + Seek>(
    src_dir: &Path,
    mut out: W,
    opts: &SquashfsOptions,
    cache: Option<&dyn BlockCache>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Stats, parallel::Report), RootfsError> {
    let compressor = compressor(opts)?;
    let root_meta = fs::metadata(src_dir).map_err(io_err(src_dir))?;
    if !root_meta.is_dir() {
        return Err(RootfsError::NotADirectory(src_dir.to_owned()));
    }
    let mut items = Vec::new();
    scan(src_dir, Path::new(""), opts, &mut items)?;
    let mut stats = count(&items, opts)?;

    // The root's own mtime has no setter in backhand 0.25 (`FilesystemWriter::root` is
    // private); a writer derived from a reader inherits the reader's root node, whose header
    // is public. So: write an empty image, read it, stamp its root, derive the real writer.
    let root_header = header(root_meta.mode(), opts);
    let mut empty = Cursor::new(Vec::new());
    let mut seed = FilesystemWriter::default();
    seed.set_compressor(compressor);
    seed.write(&mut empty)
        .map_err(sq_err("seeding the root node"))?;
    empty.set_position(0);
    let mut seed_reader =
        FilesystemReader::from_reader(empty).map_err(sq_err("seeding the root node"))?;
    seed_reader.root.root_mut().header = root_header;

    // backhand's writer reads the files in the order of its nodes, which it keeps sorted by
    // path; the parallel reader must read them in the same order.
    let mut files: Vec<(&Path, usize)> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| matches!(item.kind, Kind::File { .. }))
        .map(|(i, item)| (item.rel.as_path(), i))
        .collect();
    files.sort_by(|a, b| a.0.cmp(b.0));
    let mut position = vec![usize::MAX; items.len()];
    for (pos, (_, i)) in files.iter().enumerate() {
        position[*i] = pos;
    }
    let paths: Vec<PathBuf> = files.iter().map(|(rel, _)| src_dir.join(rel)).collect();
    // The workers compress with zstd only: a new `Compression` must fail to compile here.
    let Compression::Zstd { level } = opts.compression;
    let plan = parallel::Plan {
        files: &paths,
        block_size: opts.block_size as usize,
        // Checked to be 1..=22 by `compressor`.
        zstd_level: level as i32,
        cache,
        threads: opts.threads.map_or_else(
            || thread::available_parallelism().map_or(1, NonZeroUsize::get),
            NonZeroUsize::get,
        ),
    };

    let shared = Rc::new(RefCell::new(Shared::new(stats.files, progress)));
    let (written, report) = parallel::with_workers(&plan, |feed| {
        let mut writer = FilesystemWriter::from_fs_reader(&seed_reader)
            .map_err(sq_err("seeding the root node"))?;
        writer.set_kind(parallel::kind());
        writer.set_compressor(compressor);
        writer.set_block_size(opts.block_size);
        writer.set_time(opts.source_date_epoch);
        writer.set_only_root_id();
        writer.set_no_duplicate_files(true);
        for (i, item) in items.iter().enumerate() {
            let hdr = header(item.mode, opts);
            let rel = &item.rel;
            let pushed = match &item.kind {
                Kind::Dir => writer.push_dir(rel, hdr),
                Kind::File { .. } => writer.push_file(
                    TreeFile::new(
                        position[i],
                        src_dir.join(rel),
                        Rc::clone(feed),
                        Rc::clone(&shared),
                    ),
                    rel,
                    hdr,
                ),
                Kind::Symlink(target) => writer.push_symlink(target.clone(), rel, hdr),
                Kind::Char(dev) => writer.push_char_device(*dev, rel, hdr),
                Kind::Block(dev) => writer.push_block_device(*dev, rel, hdr),
                Kind::Fifo => writer.push_fifo(rel, hdr),
                Kind::Socket => writer.push_socket(rel, hdr),
            };
            pushed.map_err(sq_err("adding an entry"))?;
        }
        shared.borrow_mut().start();
        Ok(writer.write(&mut out))
    })
    .map_err(io_err(Path::new("<compression threads>")))?;
    // A read error inside backhand loses the path; report the one the reader recorded.
    if let Some((path, source)) = shared.borrow_mut().take_failure() {
        return Err(RootfsError::Io { path, source });
    }
    let (_, bytes) = written?.map_err(sq_err("writing the image"))?;
    out.flush().map_err(io_err(Path::new("<output>")))?;
    stats.image_bytes = bytes;
    Ok((stats, report))
}

/// Counts the items, refusing hard links if the options say so.
fn count(items: &[Item], opts: &SquashfsOptions) -> Result<Stats, RootfsError> {
    let mut stats = Stats::default();
    let mut first_links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    for item in items {
        match &item.kind {
            Kind::File { dev_ino, size } => {
                stats.files += 1;
                stats.file_bytes += size;
                if let Some(key) = dev_ino {
                    if let Some(first) = first_links.get(key) {
                        if opts.hard_links == HardLinks::Error {
                            return Err(RootfsError::HardLink {
                                path: item.rel.clone(),
                                first: first.clone(),
                            });
                        }
                        stats.hard_links_copied += 1;
                    } else {
                        first_links.insert(*key, item.rel.clone());
                    }
                }
            }
            Kind::Dir => stats.dirs += 1,
            Kind::Symlink(_) => stats.symlinks += 1,
            Kind::Char(_) | Kind::Block(_) => stats.devices += 1,
            Kind::Fifo | Kind::Socket => stats.special += 1,
        }
    }
    Ok(stats)
}

fn compressor(opts: &SquashfsOptions) -> Result<FilesystemCompressor, RootfsError> {
    let bs = opts.block_size;
    if !bs.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
        // backhand panics on these; turn that into an error.
        return Err(RootfsError::InvalidOption(format!(
            "block size {bs} is not a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
        )));
    }
    match opts.compression {
        Compression::Zstd { level } => {
            if !(1..=22).contains(&level) {
                return Err(RootfsError::InvalidOption(format!(
                    "zstd level {level} is outside 1..=22"
                )));
            }
            let options = CompressionOptions::Zstd(Zstd {
                compression_level: level,
            });
            FilesystemCompressor::new(Compressor::Zstd, Some(options))
                .map_err(sq_err("configuring zstd"))
        }
    }
}

/// uid/gid are always 0: the image is a system image, and host build users must not leak.
fn header(mode: u32, opts: &SquashfsOptions) -> NodeHeader {
    // Masked to 12 bits, so the cast cannot truncate.
    NodeHeader::new((mode & 0o7777) as u16, 0, 0, opts.source_date_epoch)
}

#[derive(Debug)]
enum Kind {
    Dir,
    File {
        /// Set when the file has more than one link.
        dev_ino: Option<(u64, u64)>,
        size: u64,
    },
    Symlink(PathBuf),
    Char(u32),
    Block(u32),
    Fifo,
    Socket,
}

#[derive(Debug)]
struct Item {
    rel: PathBuf,
    mode: u32,
    kind: Kind,
}

/// Depth-first, children in byte order of their names, parents before children (backhand
/// needs a node's parent to exist when it is pushed).
fn scan(
    root: &Path,
    rel_dir: &Path,
    opts: &SquashfsOptions,
    items: &mut Vec<Item>,
) -> Result<(), RootfsError> {
    let dir = root.join(rel_dir);
    let mut names = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
        names.push(entry.map_err(io_err(&dir))?.file_name());
    }
    names.sort();
    for name in names {
        let rel = rel_dir.join(&name);
        let path = root.join(&rel);
        let meta = fs::symlink_metadata(&path).map_err(io_err(&path))?;
        if opts.xattrs == Xattrs::Error {
            check_xattrs(&path, &rel)?;
        }
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File {
                dev_ino: (meta.nlink() > 1).then(|| (meta.dev(), meta.ino())),
                size: meta.len(),
            }
        } else if ft.is_symlink() {
            Kind::Symlink(fs::read_link(&path).map_err(io_err(&path))?)
        } else if ft.is_char_device() || ft.is_block_device() {
            let dev = squashfs_dev(meta.rdev()).ok_or_else(|| RootfsError::DeviceNumber {
                path: rel.clone(),
                major: major(meta.rdev()),
                minor: minor(meta.rdev()),
            })?;
            if ft.is_char_device() {
                Kind::Char(dev)
            } else {
                Kind::Block(dev)
            }
        } else if ft.is_fifo() {
            Kind::Fifo
        } else if ft.is_socket() {
            Kind::Socket
        } else {
            return Err(RootfsError::Io {
                path: rel,
                source: io::Error::new(io::ErrorKind::Unsupported, "unknown file type"),
            });
        };
        let is_dir = matches!(kind, Kind::Dir);
        items.push(Item {
            rel: rel.clone(),
            mode: meta.mode(),
            kind,
        });
        if is_dir {
            scan(root, &rel, opts, items)?;
        }
    }
    Ok(())
}

fn check_xattrs(path: &Path, rel: &Path) -> Result<(), RootfsError> {
    // `xattr::list` does not follow symlinks, so a link's own attributes are checked.
    let names: Vec<String> = match xattr::list(path) {
        Ok(names) => names.map(|n| n.to_string_lossy().into_owned()).collect(),
        // Filesystems without xattr support cannot have any.
        Err(e) if e.kind() == io::ErrorKind::Unsupported || e.raw_os_error() == Some(95) => {
            Vec::new()
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    if names.is_empty() {
        Ok(())
    } else {
        Err(RootfsError::Xattrs {
            path: rel.to_owned(),
            names,
        })
    }
}

/// glibc's `major()` of a `dev_t`.
fn major(rdev: u64) -> u64 {
    ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff)
}

/// glibc's `minor()` of a `dev_t`.
fn minor(rdev: u64) -> u64 {
    (rdev & 0xff) | ((rdev >> 12) & !0xff)
}

/// squashfs stores devices as Linux `new_encode_dev` (the kernel decodes with
/// `new_decode_dev`): 12-bit major, 20-bit minor.
fn squashfs_dev(rdev: u64) -> Option<u32> {
    let (major, minor) = (major(rdev), minor(rdev));
    if major > 0xfff || minor > 0xf_ffff {
        return None;
    }
    u32::try_from((minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_use_new_encode_dev() {
        // glibc's makedev(), the inverse of major()/minor().
        let mk = |maj: u64, min: u64| {
            ((maj & 0xfff) << 8) | ((maj & !0xfff) << 32) | (min & 0xff) | ((min & !0xff) << 12)
        };
        assert_eq!(squashfs_dev(mk(1, 3)), Some(0x103));
        assert_eq!(squashfs_dev(mk(259, 0x12345)), Some(0x1231_0345));
        assert_eq!(squashfs_dev(mk(0x1000, 0)), None);
        assert_eq!((major(mk(254, 7)), minor(mk(254, 7))), (254, 7));
    }

    #[test]
    fn bad_options_are_errors_not_panics() {
        let bad_block = SquashfsOptions {
            block_size: 3000,
            ..SquashfsOptions::default()
        };
        assert!(matches!(
            compressor(&bad_block),
            Err(RootfsError::InvalidOption(_))
        ));
        let bad_level = SquashfsOptions {
            compression: Compression::Zstd { level: 0 },
            ..SquashfsOptions::default()
        };
        assert!(matches!(
            compressor(&bad_level),
            Err(RootfsError::InvalidOption(_))
        ));
    }
}
