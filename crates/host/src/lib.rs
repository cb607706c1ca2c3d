//! The edge between slate and the Linux kernel: mounts, loop devices, kernel modules,
//! `switch_root`, `exec`, reboot, the kernel log and the scheduler's statistics of a thread.
//!
//! This is the only crate in the workspace that makes system calls. Everything goes through
//! `nix`'s safe wrappers where they exist; the loop-device and watchdog ioctls, which neither
//! `nix` nor `libc` describe, and `kexec_file_load`, which `nix` lacks, are the only `unsafe`
//! code (see `loopdev.rs`, `watchdog.rs`, `kexec.rs`, `btrfs.rs`, `random_seed.rs`, and
//! `chroot.rs`'s, `supervised.rs`'s and `inherit.rs`'s `pre_exec`).
//! Every error names the operation and the path it was applied to, so a failed boot reads as a
//! sentence on the console.

mod block;
mod boot_clock;
mod btrfs;
mod cgroup;
mod chroot;
mod cmdline;
mod dhcp_transport;
mod efivars;
mod error;
mod ext;
mod inherit;
mod kexec;
mod kmsg;
mod kmsg_read;
mod loopdev;
mod mount;
mod net;
mod process;
mod random_seed;
mod reaper;
mod signals;
mod supervised;
mod system;
mod teardown;
mod thread_clocks;
mod watchdog;

pub use block::{
    device_is_luks, disk_of_partition, filesystem_identity, filesystem_signature,
    find_filesystem_by_uuid, find_partition_by_label, is_blank, uevent_value, BlockPartition,
    FsIdentity, IDENTITY_HEAD_LEN,
};
pub use boot_clock::{
    parse_milestones, record_milestone, record_milestone_at, since_boot, INIT_MILESTONES,
};
pub use btrfs::{
    child_subvolumes, create_subvolume, delete_subvolume, is_btrfs, is_subvolume, pool_uuid,
    snapshot_subvolume,
};
pub use cgroup::{cgroup2_mount_point, is_cgroup2, mount_cgroup2, Cgroup, CGROUP_ROOT};
pub use chroot::{spawn_chrooted, ApiMounts};
pub use cmdline::{after_failure, cmdline_value, kernel_cmdline, AfterFailure};
pub use dhcp_transport::DhcpTransport;
pub use efivars::{
    global_var_names, global_var_path, loader_var_path, mount_efivarfs, read_global,
    read_global_u8, read_loader_string, remove_loader_var, remove_var_file, write_loader_string,
    write_var_file, EFI_GLOBAL_GUID, LOADER_GUID,
};
pub use error::{HostError, Result};
pub use ext::{
    add_ext_journal, check_ext, device_ext_check_due, device_ext_has_journal, ext_check_due,
    ext_has_journal, format_ext, CheckDue, FsckOutcome,
};
pub use inherit::inherit_fd;
pub use kexec::{
    kexec_load, kexec_loaded, kexec_reboot, kexec_unload, lockdown, refusal_hint,
    selected_lockdown, LOCKDOWN_PATH,
};
pub use kmsg::{disable_kmsg_ratelimit, KmsgLogger, Level};
pub use kmsg_read::{format_kmsg_record, kernel_log, KernelLog};
pub use loopdev::{attach_loop_read_only, attach_loop_window, detach_loop};
pub use mount::{
    is_mount_point, mount, mount_overlay, mount_overlay_read_only, mount_pseudo_filesystems,
    move_mount, overlay_lowerdir_option, overlay_writable_options, switch_root, unmount, MsFlags,
};
pub use net::{add_default_route, hardware_address, ipv4_addresses, set_ipv4_address, set_link_up};
pub use process::{
    process_cpu_time, reap_zombies, resident_kib, run_command, run_command_logged,
    spawn_line_reader, spawn_reaper, CommandEnd, GuardedChild,
};
pub use random_seed::{consume_random_seed, save_random_seed, SeedOutcome, RANDOM_SEED_LEN};
pub use reaper::ProcessExit;
pub use signals::{disable_ctrl_alt_del, Signal, SignalReader};
pub use supervised::{signal_process_group, spawn_supervised, SupervisedChild};
pub use system::{
    ensure_console_stdio, exec, is_pid1, kernel_release, load_module, poweroff, reboot,
    unusable_here, ModuleLoad,
};
pub use teardown::{kill_all_processes, mount_points_for_teardown, sync_with_budget, unmount_all};
pub use thread_clocks::{parse_schedstat, ThreadClocks};
pub use watchdog::Watchdog;
