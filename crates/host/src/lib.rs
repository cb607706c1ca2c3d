//! The edge between slate and the Linux kernel: mounts, loop devices, kernel modules,
//! `switch_root`, `exec`, reboot and the kernel log.
//!
//! This is the only crate in the workspace that makes system calls. Everything goes through
//! `nix`'s safe wrappers where they exist; the loop-device ioctls, which neither `nix` nor
//! `libc` describe, are the only `unsafe` code (see `loopdev.rs`). Every error names the
//! operation and the path it was applied to, so a failed boot reads as a sentence on the console.

mod cmdline;
mod error;
mod kmsg;
mod loopdev;
mod mount;
mod system;

pub use cmdline::{cmdline_value, kernel_cmdline};
pub use error::{HostError, Result};
pub use kmsg::{disable_kmsg_ratelimit, KmsgLogger, Level};
pub use loopdev::{attach_loop_read_only, detach_loop};
pub use mount::{
    is_mount_point, mount, mount_overlay_read_only, mount_pseudo_filesystems, move_mount,
    overlay_lowerdir_option, switch_root, unmount, MsFlags,
};
pub use system::{
    ensure_console_stdio, exec, is_pid1, kernel_release, load_module, poweroff, reboot, ModuleLoad,
};
