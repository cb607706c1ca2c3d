//! Btrfs subvolumes through the kernel's ioctls (`<linux/btrfs.h>`): snapshot, create and
//! delete a subvolume, the pool's UUID, and which directories are subvolumes. Not btrfs-progs:
//! a slate node's root is busybox without it, and four ioctls are less to trust and ship than
//! a second user-space tool whose output would have to be parsed (ARCHITECTURE.md).

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::statfs::{statfs, BTRFS_SUPER_MAGIC};

use crate::error::{HostError, Result};

/// The inode number of every subvolume's root directory (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOLUME_ROOT_INO: u64 = 256;
/// `BTRFS_SUBVOL_NAME_MAX` + 1: the name field of `struct btrfs_ioctl_vol_args_v2`.
const NAME_FIELD: usize = 4040;

/// The raw ioctls; `nix` generates their wrappers as `unsafe fn`s (the argument type is known
/// only to the kernel). Each is called with a `#[repr(C)]` copy of the kernel's struct.
mod sys {
    #![allow(unsafe_code)]

    use std::fs::File;
    use std::os::fd::AsRawFd as _;

    use nix::{ioctl_read, ioctl_write_ptr};

    /// `struct btrfs_ioctl_vol_args_v2` (4096 bytes): `fd`, `transid`, `flags`, a 32-byte
    /// union (`size`/`qgroup_inherit`/unused), `name`.
    #[repr(C)]
    pub struct VolArgsV2 {
        pub fd: i64,
        pub transid: u64,
        pub flags: u64,
        pub unused: [u64; 4],
        pub name: [u8; super::NAME_FIELD],
    }

    /// `struct btrfs_ioctl_fs_info_args` (1024 bytes).
    #[repr(C)]
    pub struct FsInfoArgs {
        pub max_id: u64,
        pub num_devices: u64,
        pub fsid: [u8; 16],
        pub nodesize: u32,
        pub sectorsize: u32,
        pub clone_alignment: u32,
        pub csum_type: u16,
        pub csum_size: u16,
        pub flags: u64,
        pub generation: u64,
        pub metadata_uuid: [u8; 16],
        pub reserved: [u8; 944],
    }

    const _: () = assert!(size_of::<VolArgsV2>() == 4096);
    const _: () = assert!(size_of::<FsInfoArgs>() == 1024);

    ioctl_write_ptr!(snap_create_v2, 0x94, 23, VolArgsV2);
    ioctl_write_ptr!(subvol_create_v2, 0x94, 24, VolArgsV2);
    ioctl_read!(fs_info, 0x94, 31, FsInfoArgs);
    ioctl_write_ptr!(snap_destroy_v2, 0x94, 63, VolArgsV2);

    pub fn snapshot(dir: &File, args: &VolArgsV2) -> nix::Result<()> {
        // SAFETY: `dir` is an open directory; `args` is a live, fully initialised
        // `btrfs_ioctl_vol_args_v2` the kernel only reads (its name NUL-terminated by the caller).
        unsafe { snap_create_v2(dir.as_raw_fd(), args) }.map(drop)
    }

    pub fn create(dir: &File, args: &VolArgsV2) -> nix::Result<()> {
        // SAFETY: as in `snapshot`; the kernel reads `args` only.
        unsafe { subvol_create_v2(dir.as_raw_fd(), args) }.map(drop)
    }

    pub fn destroy(dir: &File, args: &VolArgsV2) -> nix::Result<()> {
        // SAFETY: as in `snapshot`; with `flags` 0 the kernel reads `name` only.
        unsafe { snap_destroy_v2(dir.as_raw_fd(), args) }.map(drop)
    }

    pub fn info(file: &File, out: &mut FsInfoArgs) -> nix::Result<()> {
        // SAFETY: `out` is a valid, exclusively borrowed `btrfs_ioctl_fs_info_args` the
        // kernel fills in; `file` is open on the file system.
        unsafe { fs_info(file.as_raw_fd(), out) }.map(drop)
    }
}

fn vol_args(name: &OsStr, path: &Path) -> Result<Box<sys::VolArgsV2>> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= NAME_FIELD || bytes.contains(&b'/') || bytes.contains(&0)
    {
        return Err(HostError::Btrfs {
            op: "invalid subvolume name for",
            path: path.join(name),
            source: Errno::EINVAL,
        });
    }
    let mut args = Box::new(sys::VolArgsV2 {
        fd: 0,
        transid: 0,
        flags: 0,
        unused: [0; 4],
        name: [0; NAME_FIELD],
    });
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

fn open_dir(path: &Path) -> Result<File> {
    File::open(path).map_err(|source| HostError::Open {
        path: path.to_path_buf(),
        source,
    })
}

fn errno(op: &'static str, path: PathBuf) -> impl FnOnce(Errno) -> HostError {
    move |source| HostError::Btrfs { op, path, source }
}

/// Whether `path` is on a Btrfs file system.
pub fn is_btrfs(path: &Path) -> Result<bool> {
    let fs = statfs(path).map_err(errno("statfs", path.to_path_buf()))?;
    Ok(fs.filesystem_type() == BTRFS_SUPER_MAGIC)
}

/// Whether `path` is the root directory of a Btrfs subvolume.
pub fn is_subvolume(path: &Path) -> Result<bool> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(meta.is_dir() && meta.ino() == SUBVOLUME_ROOT_INO && is_btrfs(path)?)
}

/// A writable copy-on-write snapshot of the subvolume `source`, as `dest_dir/name`.
pub fn snapshot_subvolume(source: &Path, dest_dir: &Path, name: &str) -> Result<()> {
    let src = open_dir(source)?;
    let dir = open_dir(dest_dir)?;
    let mut args = vol_args(OsStr::new(name), dest_dir)?;
    args.fd = i64::from(std::os::fd::AsRawFd::as_raw_fd(&src));
    sys::snapshot(&dir, &args).map_err(errno("snapshotting into", dest_dir.join(name)))
}

/// A new, empty subvolume `dir/name`.
pub fn create_subvolume(dir: &Path, name: &str) -> Result<()> {
    let d = open_dir(dir)?;
    sys::create(&d, &*vol_args(OsStr::new(name), dir)?)
        .map_err(errno("creating subvolume", dir.join(name)))
}

/// Deletes the subvolume `dir/name` (it must hold no other subvolume and nothing mounted).
pub fn delete_subvolume(dir: &Path, name: &str) -> Result<()> {
    let d = open_dir(dir)?;
    sys::destroy(&d, &*vol_args(OsStr::new(name), dir)?)
        .map_err(errno("deleting subvolume", dir.join(name)))
}

/// `BTRFS_FS_INFO_FLAG_METADATA_UUID`: ask `FS_INFO` for the metadata UUID too.
const FS_INFO_FLAG_METADATA_UUID: u64 = 1 << 2;

/// The pool's file system UUID as it is on disk (what `root=UUID=`, GRUB's `search --fs-uuid`
/// and blkid name), lower-case 8-4-4-4-12.
///
/// Since Linux 6.7 a single-device file system mounted while another with the same UUID is
/// mounted (a cloned image, a second copy of the same disk) gets a random in-memory "temporary"
/// fsid, which `FS_INFO` reports; the on-disk one is then the metadata UUID, and
/// `/sys/fs/btrfs/<fsid>/temp_fsid` says so. Writing the temporary one into a boot entry would
/// name a file system no boot loader can find.
pub fn pool_uuid(path: &Path) -> Result<String> {
    let f = open_dir(path)?;
    let mut info: Box<sys::FsInfoArgs> = Box::new(sys::FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        nodesize: 0,
        sectorsize: 0,
        clone_alignment: 0,
        csum_type: 0,
        csum_size: 0,
        flags: FS_INFO_FLAG_METADATA_UUID,
        generation: 0,
        metadata_uuid: [0; 16],
        reserved: [0; 944],
    });
    sys::info(&f, &mut info)
        .map_err(errno("reading the file system info of", path.to_path_buf()))?;
    let fsid = uuid_text(&info.fsid);
    let temp = std::fs::read_to_string(format!("/sys/fs/btrfs/{fsid}/temp_fsid"))
        .is_ok_and(|t| t.trim() == "1");
    if temp && info.flags & FS_INFO_FLAG_METADATA_UUID != 0 {
        return Ok(uuid_text(&info.metadata_uuid));
    }
    Ok(fsid)
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The subvolumes directly under `dir`, by name, sorted.
pub fn child_subvolumes(dir: &Path) -> Result<Vec<String>> {
    let read = std::fs::read_dir(dir).map_err(|source| HostError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for entry in read {
        let entry = entry.map_err(|source| HostError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) && is_subvolume(&entry.path())? {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}
