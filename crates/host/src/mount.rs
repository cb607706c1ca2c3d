//! Mounting: a thin `mount(2)` wrapper with error context, moves, the pseudo filesystems of an
//! early boot, and the initramfs way of switching to the real root.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::MntFlags;
pub use nix::mount::MsFlags;
use nix::unistd::{chdir, chroot};

use crate::error::{HostError, Result};

/// Mounts `source` (a device, or a name like `proc`) of type `fstype` on `target`.
pub fn mount(
    source: impl AsRef<OsStr>,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    let source = source.as_ref();
    nix::mount::mount(Some(source), target, Some(fstype), flags, data).map_err(|errno| {
        HostError::Mount {
            what: source.to_string_lossy().into_owned(),
            target: target.to_path_buf(),
            fstype: fstype.to_string(),
            data: data.unwrap_or_default().to_string(),
            source: errno,
        }
    })
}

/// How long [`unmount`] retries a busy filesystem.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Unmounts `target` (no lazy detach: a busy filesystem is an error worth seeing). `EBUSY` is
/// retried for up to 2 s first: a child another thread forked holds copies of this process's
/// descriptors (one to a file just written there, say) until it execs, so a busy answer right
/// after the last file was closed can be gone a moment later. The test suite met exactly that.
pub fn unmount(target: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + BUSY_RETRY;
    loop {
        match nix::mount::umount2(target, MntFlags::empty()) {
            Err(Errno::EBUSY) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => {
                return result.map_err(|source| HostError::Unmount {
                    target: target.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// Moves the mount at `from` (with everything mounted beneath it) to `to` (`MS_MOVE`).
pub fn move_mount(from: &Path, to: &Path) -> Result<()> {
    nix::mount::mount(Some(from), to, None::<&str>, MsFlags::MS_MOVE, None::<&str>).map_err(
        |source| HostError::MoveMount {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            source,
        },
    )
}

/// The `lowerdir=` option of an overlay of `lowers`, topmost first (overlayfs reads the list
/// left to right as top to bottom). Without an upper layer overlayfs needs at least two.
pub fn overlay_lowerdir_option(lowers: &[&Path]) -> Result<String> {
    let invalid = |reason: String| Err(HostError::InvalidOverlay { reason });
    if lowers.len() < 2 {
        return invalid(format!(
            "a read-only overlay needs at least two layers, got {}",
            lowers.len()
        ));
    }
    let dirs = lowers
        .iter()
        .map(|dir| overlay_dir("layer", dir))
        .collect::<Result<Vec<_>>>()?;
    Ok(format!("lowerdir={}", dirs.join(":")))
}

/// `dir` as it may appear in an overlay option string.
fn overlay_dir<'p>(role: &str, dir: &'p Path) -> Result<&'p str> {
    let invalid = |reason: String| Err(HostError::InvalidOverlay { reason });
    let Some(text) = dir.to_str() else {
        return invalid(format!("{role} {} is not UTF-8", dir.display()));
    };
    // These separate layers and options in the option string; refuse rather than escape.
    if text.contains([':', ',', '\\']) {
        return invalid(format!("{role} {text} contains ':', ',' or a backslash"));
    }
    Ok(text)
}

/// The options of a writable overlay: `lower` below, changes in `upper`, overlayfs' scratch
/// space in `work` (an empty directory on the same filesystem as `upper`).
pub fn overlay_writable_options(lower: &Path, upper: &Path, work: &Path) -> Result<String> {
    Ok(format!(
        "lowerdir={},upperdir={},workdir={}",
        overlay_dir("layer", lower)?,
        overlay_dir("upper", upper)?,
        overlay_dir("workdir", work)?,
    ))
}

/// Mounts a writable overlay of `lower` with `upper` and `work` on `target`, without setuid
/// programs or device nodes. `lower` may be `target` itself: the kernel resolves the layers
/// before the overlay covers the path (how a read-only root gets a writable `/etc`).
pub fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    let options = overlay_writable_options(lower, upper, work)?;
    mount(
        "overlay",
        target,
        "overlay",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(&options),
    )
}

/// Mounts a read-only overlay of `lowers` (topmost first, no upper layer) on `target`.
pub fn mount_overlay_read_only(lowers: &[&Path], target: &Path) -> Result<()> {
    let options = overlay_lowerdir_option(lowers)?;
    mount(
        "overlay",
        target,
        "overlay",
        MsFlags::MS_RDONLY,
        Some(&options),
    )
}

/// Whether something is mounted at `path`: its device differs from its parent's, or it is the
/// root of the namespace. (Bind mounts of the same filesystem are not detected; early boot has
/// none.)
pub fn is_mount_point(path: &Path) -> Result<bool> {
    let stat = |p: &Path| {
        std::fs::metadata(p).map_err(|source| HostError::Read {
            path: p.to_path_buf(),
            source,
        })
    };
    let here = stat(path)?;
    let parent = stat(&path.join(".."))?;
    Ok(here.dev() != parent.dev() || here.ino() == parent.ino())
}

/// Mounts `proc` on `/proc`, `sysfs` on `/sys` and `devtmpfs` on `/dev`, creating the
/// directories if needed. Already-mounted ones are left alone, so calling this twice, or after
/// a kernel that auto-mounts devtmpfs, is fine.
pub fn mount_pseudo_filesystems() -> Result<()> {
    let hardened = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let table: [(&str, &str, MsFlags, Option<&str>); 3] = [
        ("proc", "/proc", hardened, None),
        ("sysfs", "/sys", hardened, None),
        // No MS_NODEV here, obviously; mode 0755 as udev and systemd set it.
        ("devtmpfs", "/dev", MsFlags::MS_NOSUID, Some("mode=0755")),
    ];
    for (fstype, target, flags, data) in table {
        let target = Path::new(target);
        create_dir(target)?;
        if is_mount_point(target)? {
            continue;
        }
        match mount(fstype, target, fstype, flags, data) {
            Err(HostError::Mount {
                source: Errno::EBUSY,
                ..
            }) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Makes the real root at `new_root` the root of the namespace, the initramfs way.
///
/// The initramfs is `rootfs`, which can never be unmounted, so `pivot_root(2)` refuses it;
/// instead the new root is moved over `/` and the process chroots into it (what util-linux's
/// and busybox's `switch_root` do). The old initramfs stays beneath, unreachable.
/// `/dev`, `/proc` and `/sys` must have been moved into `new_root` beforehand.
pub fn switch_root(new_root: &Path) -> Result<()> {
    let fail = |step| {
        move |source| HostError::SwitchRoot {
            step,
            new_root: new_root.to_path_buf(),
            source,
        }
    };
    chdir(new_root).map_err(fail("chdir into the new root"))?;
    nix::mount::mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(fail("move the new root onto /"))?;
    chroot(".").map_err(fail("chroot into the new root"))?;
    chdir("/").map_err(fail("chdir to / in the new root"))?;
    Ok(())
}

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| HostError::CreateDir {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filesystem busy for a moment (a file open in it, closed 200 ms later) is unmounted
    /// once it is free; one that stays busy is an `EBUSY` error after the retry time.
    #[test]
    fn a_briefly_busy_filesystem_is_unmounted_and_a_busy_one_refused() {
        if !slate_testkit::require_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mounted = |dir: &Path| {
            mount("tmpfs", dir, "tmpfs", MsFlags::empty(), Some("size=1m")).unwrap();
            std::fs::File::create(dir.join("held")).unwrap()
        };
        let held = mounted(dir.path());
        let closer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(held);
        });
        unmount(dir.path()).unwrap();
        closer.join().unwrap();
        assert!(!is_mount_point(dir.path()).unwrap());

        let held = mounted(dir.path());
        let started = std::time::Instant::now();
        let err = unmount(dir.path()).unwrap_err();
        assert!(started.elapsed() >= BUSY_RETRY);
        assert!(
            matches!(
                err,
                HostError::Unmount {
                    source: Errno::EBUSY,
                    ..
                }
            ),
            "{err:?}"
        );
        drop(held);
        unmount(dir.path()).unwrap();
    }

    #[test]
    fn root_is_a_mount_point_and_a_plain_directory_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(!is_mount_point(&sub).unwrap());
    }

    #[test]
    fn overlay_lowerdir_lists_layers_top_first() {
        let lowers = [
            Path::new("/run/l/ext-1"),
            Path::new("/run/l/ext-2"),
            Path::new("/run/l/rootfs"),
        ];
        assert_eq!(
            overlay_lowerdir_option(&lowers).unwrap(),
            "lowerdir=/run/l/ext-1:/run/l/ext-2:/run/l/rootfs"
        );
    }

    #[test]
    fn overlay_lowerdir_refuses_separators_and_single_layers() {
        assert!(overlay_lowerdir_option(&[Path::new("/a")]).is_err());
        assert!(overlay_lowerdir_option(&[Path::new("/a:b"), Path::new("/c")]).is_err());
        let sneaky = [Path::new("/a,upperdir=/x"), Path::new("/c")];
        let err = overlay_lowerdir_option(&sneaky).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid overlay: layer /a,upperdir=/x contains"),
            "{err}"
        );
    }

    #[test]
    fn a_writable_overlay_names_its_three_directories() {
        let (lower, upper, work) = (
            Path::new("/etc"),
            Path::new("/s/upper"),
            Path::new("/s/work"),
        );
        assert_eq!(
            overlay_writable_options(lower, upper, work).unwrap(),
            "lowerdir=/etc,upperdir=/s/upper,workdir=/s/work"
        );
        let err = overlay_writable_options(lower, Path::new("/s/u,lowerdir=/x"), work)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid overlay: upper /s/u,lowerdir=/x"),
            "{err}"
        );
    }

    #[test]
    fn an_overlay_over_its_own_lower_keeps_changes_in_the_upper() {
        if !slate_testkit::require_root() {
            return;
        }
        // On a tmpfs: the test directory may itself be an overlay, which cannot be an upper.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let etc = dir.path().join("etc");
        for d in [&state, &etc] {
            std::fs::create_dir(d).unwrap();
        }
        mount("tmpfs", &state, "tmpfs", MsFlags::empty(), Some("size=1m")).unwrap();
        let (upper, work) = (state.join("upper"), state.join("work"));
        std::fs::create_dir(&upper).unwrap();
        std::fs::create_dir(&work).unwrap();
        std::fs::write(etc.join("image"), "from the image\n").unwrap();
        let mounted = mount_overlay(&etc, &upper, &work, &etc);
        let checked = mounted.as_ref().map(|()| {
            std::fs::write(etc.join("added"), "at run time\n").unwrap();
            (
                std::fs::read_to_string(etc.join("image")).unwrap(),
                std::fs::read_to_string(upper.join("added")).unwrap(),
                is_mount_point(&etc).unwrap(),
            )
        });
        if mounted.is_ok() {
            unmount(&etc).unwrap();
        }
        unmount(&state).unwrap();
        let (image, added, is_mount) = checked.unwrap();
        assert_eq!(image, "from the image\n");
        assert_eq!(added, "at run time\n");
        assert!(is_mount);
        // Unmounted, the lower shows what it always held.
        assert!(!etc.join("added").exists());
    }

    #[test]
    fn mount_errors_name_the_operation() {
        let err = mount(
            "none",
            Path::new("/nonexistent/slate-test"),
            "tmpfs",
            MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tmpfs none on /nonexistent/slate-test"),
            "{text}"
        );
        assert!(text.contains("size=1m"), "{text}");
    }
}
