//! Running a command inside another root: `/proc`, `/sys` and `/dev` bound into it (what a
//! package manager needs), the command started under `chroot(2)`, the binds undone when the
//! guard drops (lazily, so a stray process cannot keep the snapshot busy for deletion).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::{umount2, MntFlags, MsFlags};

use crate::error::{HostError, Result};

/// The API file systems bound into the root, undone in reverse order on drop.
#[derive(Debug)]
pub struct ApiMounts {
    mounted: Vec<PathBuf>,
}

impl ApiMounts {
    /// Recursively binds the host's `/proc`, `/sys` and `/dev` onto `root/proc` etc. (each
    /// created when missing).
    pub fn bind(root: &Path) -> Result<ApiMounts> {
        let mut guard = ApiMounts {
            mounted: Vec::new(),
        };
        for dir in ["proc", "sys", "dev"] {
            let target = root.join(dir);
            std::fs::create_dir_all(&target).map_err(|source| HostError::CreateDir {
                path: target.clone(),
                source,
            })?;
            crate::mount::mount(
                Path::new("/").join(dir),
                &target,
                "none",
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None,
            )?;
            // Unmounts in the child must not reach the host's /dev or /proc.
            nix::mount::mount(
                None::<&str>,
                &target,
                None::<&str>,
                MsFlags::MS_SLAVE | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|source| HostError::Mount {
                what: "(make slave)".into(),
                target: target.clone(),
                fstype: String::new(),
                data: String::new(),
                source,
            })?;
            guard.mounted.push(target);
        }
        Ok(guard)
    }

    /// Undoes the binds now (also done on drop), reporting the first failure.
    pub fn release(mut self) -> Result<()> {
        self.undo()
    }

    fn undo(&mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(target) = self.mounted.pop() {
            if let Err(source) = umount2(&target, MntFlags::MNT_DETACH) {
                if first.is_ok() {
                    first = Err(HostError::Unmount { target, source });
                }
            }
        }
        first
    }
}

impl Drop for ApiMounts {
    fn drop(&mut self) {
        let _ = self.undo();
    }
}

/// Starts `/bin/sh -c command` with `root` as its root directory and working directory, a
/// plain `PATH`, and the caller's stdout and stderr; under the reaper's lock until the child is
/// dropped, so that machined's reaper (as PID 1) cannot take its exit status.
pub fn spawn_chrooted(root: &Path, command: &str) -> Result<crate::GuardedChild> {
    #![allow(unsafe_code)]
    use std::os::unix::process::CommandExt as _;

    let root_owned = root.to_path_buf();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls chroot(2) and
    // chdir(2), both async-signal-safe; it allocates nothing (the path was converted before).
    let c_root = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(
        root_owned.as_os_str(),
    ))
    .map_err(|_| HostError::NulInArgument {
        arg: root_owned.display().to_string(),
    })?;
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(c_root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    crate::process::spawn_guarded(&mut cmd).map_err(|source| HostError::Spawn {
        program: format!("/bin/sh -c {command:?} in {}", root.display()),
        source,
    })
}
