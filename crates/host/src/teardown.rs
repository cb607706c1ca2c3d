//! What PID 1 does before a reboot or after a fatal error: stop every process, unmount, sync.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use nix::mount::MntFlags;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Signal every process but PID 1: SIGTERM, a grace period, then SIGKILL.
pub fn kill_all_processes(grace: Duration) {
    // kill(-1) reaches every process except the caller (PID 1) and kernel threads.
    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
    std::thread::sleep(grace);
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    crate::reap_zombies();
}

/// Mount points of the running system, deepest (last mounted) first, from /proc/self/mounts.
pub fn mount_points_for_teardown(mounts: &str) -> Vec<PathBuf> {
    let keep = ["/", "/proc", "/sys", "/dev"];
    let mut points: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| !keep.contains(&p.as_str()))
        .map(PathBuf::from)
        .collect();
    points.reverse();
    points
}

/// Unmount everything but the root and the pseudo filesystems; returns what could not be
/// unmounted (still busy), after a lazy detach.
pub fn unmount_all() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut busy = Vec::new();
    for point in mount_points_for_teardown(&mounts) {
        if nix::mount::umount2(&point, MntFlags::empty()).is_err() {
            let _ = nix::mount::umount2(&point, MntFlags::MNT_DETACH);
            busy.push(point);
        }
    }
    busy
}

/// `sync()`, giving up waiting after `budget` (a dying disk must not hang the reboot forever).
/// Returns whether the sync finished in time.
pub fn sync_with_budget(budget: Duration) -> bool {
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        nix::unistd::sync();
        let _ = done.send(());
    });
    wait.recv_timeout(budget).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teardown_unmounts_deepest_first_and_keeps_the_essentials() {
        let mounts =
            "rootfs / rootfs rw 0 0\nproc /proc proc rw 0 0\n/dev/vda3 /system/state ext4 rw 0 0\n\
                      /dev/vda4 /var ext4 rw 0 0\ntmpfs /var/run\\040x tmpfs rw 0 0\n";
        assert_eq!(
            mount_points_for_teardown(mounts),
            [
                PathBuf::from("/var/run x"),
                PathBuf::from("/var"),
                PathBuf::from("/system/state")
            ]
        );
    }

    #[test]
    fn sync_finishes_within_a_generous_budget() {
        assert!(sync_with_budget(Duration::from_secs(30)));
    }
}
