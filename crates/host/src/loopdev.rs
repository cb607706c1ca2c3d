//! Loop devices: exposing an image file (the root squashfs, an extension) as a read-only block
//! device that a filesystem can be mounted from; and, for the imager and the installer, a
//! writable window of an image or disk (a Btrfs pool being built or configured).

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::error::{HostError, Result};

const LOOP_CONTROL: &str = "/dev/loop-control";
/// How long to wait for a device node that devtmpfs has not created yet (right after the
/// `loop` module is loaded, `/dev/loop-control` and `/dev/loopN` appear asynchronously).
const NODE_WAIT: Duration = Duration::from_secs(3);
/// How often to ask for another free device when a concurrent `losetup` takes ours first.
const ATTACH_ATTEMPTS: u32 = 16;

/// The raw ioctls. `nix` generates their wrappers as `unsafe fn`s (an ioctl's argument type is
/// only known to the kernel); this module is the crate's only unsafe code, and it exposes safe
/// functions over owned `File`s.
mod sys {
    #![allow(unsafe_code)]

    use std::fs::File;
    use std::os::fd::AsRawFd as _;

    use nix::{ioctl_none_bad, ioctl_write_int_bad, ioctl_write_ptr_bad};

    /// `LO_FLAGS_READ_ONLY` from `<linux/loop.h>`.
    pub const LO_FLAGS_READ_ONLY: u32 = 1;
    /// `LO_NAME_SIZE` from `<linux/loop.h>`.
    pub const LO_NAME_SIZE: usize = 64;

    /// `struct loop_info64` from `<linux/loop.h>`.
    #[repr(C)]
    #[derive(Debug)]
    pub struct LoopInfo64 {
        pub lo_device: u64,
        pub lo_inode: u64,
        pub lo_rdevice: u64,
        pub lo_offset: u64,
        pub lo_sizelimit: u64,
        pub lo_number: u32,
        pub lo_encrypt_type: u32,
        pub lo_encrypt_key_size: u32,
        pub lo_flags: u32,
        pub lo_file_name: [u8; LO_NAME_SIZE],
        pub lo_crypt_name: [u8; LO_NAME_SIZE],
        pub lo_encrypt_key: [u8; 32],
        pub lo_init: [u64; 2],
    }

    /// `struct loop_config` from `<linux/loop.h>` (Linux 5.8+).
    #[repr(C)]
    #[derive(Debug)]
    pub struct LoopConfig {
        pub fd: u32,
        pub block_size: u32,
        pub info: LoopInfo64,
        pub reserved: [u64; 8],
    }

    // The kernel ABI sizes; a mismatch would make LOOP_CONFIGURE read garbage.
    const _: () = assert!(size_of::<LoopInfo64>() == 232);
    const _: () = assert!(size_of::<LoopConfig>() == 304);

    ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
    ioctl_write_int_bad!(loop_set_fd, 0x4C00);
    ioctl_none_bad!(loop_clr_fd, 0x4C01);
    ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);

    /// `LOOP_CTL_GET_FREE`: the number of a free loop device (created if none is free).
    pub fn get_free(control: &File) -> nix::Result<u32> {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument; `control` is an open fd for the
        // duration of the call. The kernel returns a non-negative device number on success.
        let n = unsafe { loop_ctl_get_free(control.as_raw_fd()) }?;
        Ok(n.unsigned_abs())
    }

    /// `LOOP_CONFIGURE`: attach and set flags in one step (no window where the device is
    /// attached but still writable).
    pub fn configure(device: &File, config: &LoopConfig) -> nix::Result<()> {
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `LoopConfig` mirrors
        // (size asserted above); the pointer is valid for the duration of the call and the
        // kernel does not keep it. `device` is an open loop device fd.
        unsafe { loop_configure(device.as_raw_fd(), config) }.map(drop)
    }

    /// `LOOP_SET_FD`: attach `backing` (older kernels without LOOP_CONFIGURE).
    pub fn set_fd(device: &File, backing: &File) -> nix::Result<()> {
        // SAFETY: LOOP_SET_FD takes a file descriptor by value; both fds are open for the
        // duration of the call, and the kernel takes its own reference to the backing file.
        unsafe { loop_set_fd(device.as_raw_fd(), backing.as_raw_fd()) }.map(drop)
    }

    /// `LOOP_CLR_FD`: detach (deferred by the kernel until the last user closes the device).
    pub fn clear_fd(device: &File) -> nix::Result<()> {
        // SAFETY: LOOP_CLR_FD takes no argument; `device` is an open fd for the call.
        unsafe { loop_clr_fd(device.as_raw_fd()) }.map(drop)
    }
}

/// Attaches `image` to a free loop device, read-only, and returns the device path
/// (`/dev/loopN`). The backing file is opened read-only and the device is flagged
/// `LO_FLAGS_READ_ONLY`, so nothing mounted from it can write to the image.
pub fn attach_loop_read_only(image: &Path) -> Result<PathBuf> {
    let backing = File::open(image).map_err(|source| HostError::Open {
        path: image.to_path_buf(),
        source,
    })?;
    attach_free(image, &backing, Window::READ_ONLY)
}

/// Attaches bytes `offset .. offset + len` of `image` (a file or a whole disk; `len` 0: to its
/// end) to a free loop device, read-write unless `read_only`, and returns the device path: a
/// partition of a disk image mounted without a partition table scan. Needs `LOOP_CONFIGURE`
/// (Linux 5.8): older kernels have no way to set the window in the same step, and a device
/// briefly showing the whole disk is not something to mount.
pub fn attach_loop_window(image: &Path, offset: u64, len: u64, read_only: bool) -> Result<PathBuf> {
    let backing = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(image)
        .map_err(|source| HostError::Open {
            path: image.to_path_buf(),
            source,
        })?;
    attach_free(
        image,
        &backing,
        Window {
            offset,
            len,
            flags: if read_only {
                sys::LO_FLAGS_READ_ONLY
            } else {
                0
            },
        },
    )
}

/// Where in the backing file a loop device looks, and its flags.
#[derive(Debug, Clone, Copy)]
struct Window {
    offset: u64,
    /// 0: to the end of the backing file.
    len: u64,
    flags: u32,
}

impl Window {
    const READ_ONLY: Window = Window {
        offset: 0,
        len: 0,
        flags: sys::LO_FLAGS_READ_ONLY,
    };
}

fn attach_free(image: &Path, backing: &File, window: Window) -> Result<PathBuf> {
    let read_only = window.flags & sys::LO_FLAGS_READ_ONLY != 0;
    let control = open_waiting(Path::new(LOOP_CONTROL))?;
    for _ in 0..ATTACH_ATTEMPTS {
        let n = sys::get_free(&control).map_err(|source| HostError::Loop {
            op: "LOOP_CTL_GET_FREE".to_string(),
            device: PathBuf::from(LOOP_CONTROL),
            source,
        })?;
        let device = PathBuf::from(format!("/dev/loop{n}"));
        let opened = open_waiting(&device)?;
        match attach(&opened, backing, image, window) {
            Ok(()) => return Ok(device),
            // Another process attached this device between GET_FREE and our ioctl: ask again.
            Err(Errno::EBUSY) => continue,
            Err(source) => {
                return Err(HostError::Loop {
                    op: format!(
                        "attach {} {}",
                        image.display(),
                        if read_only {
                            format!("bytes {}+{} read-only", window.offset, window.len)
                        } else {
                            format!("bytes {}+{}", window.offset, window.len)
                        }
                    ),
                    device,
                    source,
                })
            }
        }
    }
    Err(HostError::NoFreeLoop {
        attempts: ATTACH_ATTEMPTS,
    })
}

/// Detaches the loop device at `device` (`LOOP_CLR_FD`). If a filesystem on it is still
/// mounted, the kernel detaches it when the last user goes away.
pub fn detach_loop(device: &Path) -> Result<()> {
    let opened = File::open(device).map_err(|source| HostError::Open {
        path: device.to_path_buf(),
        source,
    })?;
    sys::clear_fd(&opened).map_err(|source| HostError::Loop {
        op: "detach (LOOP_CLR_FD)".to_string(),
        device: device.to_path_buf(),
        source,
    })
}

fn attach(device: &File, backing: &File, image: &Path, window: Window) -> nix::Result<()> {
    let mut name = [0u8; sys::LO_NAME_SIZE];
    // Shown by `losetup -l`; truncated, and NUL-terminated by the zeroed last byte.
    let bytes = image.as_os_str().as_bytes();
    let len = bytes.len().min(sys::LO_NAME_SIZE - 1);
    name[..len].copy_from_slice(&bytes[..len]);
    let config = sys::LoopConfig {
        fd: backing.as_raw_fd().unsigned_abs(),
        block_size: 0,
        info: sys::LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: window.offset,
            lo_sizelimit: window.len,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: window.flags,
            lo_file_name: name,
            lo_crypt_name: [0; sys::LO_NAME_SIZE],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        },
        reserved: [0; 8],
    };
    match sys::configure(device, &config) {
        // Kernels before 5.8 do not know LOOP_CONFIGURE. LOOP_SET_FD with a backing file
        // opened read-only gives a read-only device there too (one opened read-write, a
        // writable one); a window cannot be set that way.
        Err(Errno::EINVAL | Errno::ENOTTY) if window.offset == 0 && window.len == 0 => {
            sys::set_fd(device, backing)
        }
        other => other,
    }
}

/// Opens a device node read-write, waiting up to `NODE_WAIT` for devtmpfs to create it.
fn open_waiting(path: &Path) -> Result<File> {
    let start = Instant::now();
    loop {
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => return Ok(file),
            Err(err) if err.kind() == ErrorKind::NotFound && start.elapsed() < NODE_WAIT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(err) if err.kind() == ErrorKind::NotFound => {
                return Err(HostError::LoopDeviceMissing {
                    device: path.to_path_buf(),
                    waited_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
                })
            }
            Err(source) => {
                return Err(HostError::Open {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}
