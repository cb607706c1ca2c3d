//! One descriptor handed to one child: machined keeps its descriptors close-on-exec, so that
//! the services it starts inherit none of them, and clears the flag on the one a child is meant
//! to get only in that child, between fork and exec (the sealed UKI for the installer, issue 43).

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// Let the child `cmd` starts inherit `fd`, under the same number, which is returned for the
/// child to be told. The caller keeps `fd` open until the child is spawned.
pub fn inherit_fd(cmd: &mut Command, fd: &OwnedFd) -> i32 {
    #![allow(unsafe_code)]
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only fcntl(2), which
    // is async-signal-safe, on a descriptor the parent holds open across the fork (the caller
    // keeps `fd` until the spawn returns); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child sees the descriptor under the number returned; without it, it does not.
    #[test]
    fn the_child_inherits_the_one_descriptor() {
        let fd: OwnedFd = std::fs::File::open("/proc/self/status").unwrap().into();
        let probe = |inherit: bool| {
            let mut cmd = Command::new("sh");
            let raw = if inherit {
                inherit_fd(&mut cmd, &fd)
            } else {
                fd.as_raw_fd()
            };
            let out = cmd
                .arg("-c")
                .arg(format!("head -c 5 <&{raw} 2>/dev/null || echo closed"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(probe(true), "Name:");
        assert_eq!(probe(false).trim(), "closed");
    }
}
