//! Long-running children of PID 1: machined's services. Unlike a command (`process.rs`), a
//! service cannot hold the reaper's lock for its life, so it is registered instead: the
//! reaper keeps the exit status of a registered pid for its supervisor, and the supervisor
//! asks for its own child first (`waitpid(pid)` under the lock), whichever comes first.

use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::cgroup::Cgroup;
use crate::reaper::{exit_of, registry, CHILDREN};
use crate::{HostError, ProcessExit, Result};

/// A service's process: its pid, and its output pipes until they are taken.
#[derive(Debug)]
pub struct SupervisedChild {
    pid: i32,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    exited: Option<ProcessExit>,
}

/// Starts `cmd` (stdin empty, stdout and stderr piped, a session of its own) inside `cgroup`:
/// the child moves itself there before it runs the program, so even its first fork is inside.
pub fn spawn_supervised(cmd: &mut Command, cgroup: Option<&Cgroup>) -> Result<SupervisedChild> {
    #![allow(unsafe_code)]
    let program = cmd.get_program().to_string_lossy().into_owned();
    let procs = cgroup.map(Cgroup::procs_for_writing).transpose()?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let procs_fd = procs.as_ref().map(|f| f.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec and calls only write(2),
    // setsid(2), sigprocmask(2) and signal(2), all async-signal-safe, on a descriptor opened
    // before the fork (kept open by `procs` until spawn returns); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // machined blocks the signals it reads from a signalfd, and a blocked or ignored
            // signal survives exec: a service would never see its stop signal.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for signal in [
                libc::SIGHUP,
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGPIPE,
                libc::SIGTERM,
                libc::SIGUSR1,
                libc::SIGUSR2,
                libc::SIGPWR,
            ] {
                libc::signal(signal, libc::SIG_DFL);
            }
            if let Some(fd) = procs_fd {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Registered under the reaper's lock: it cannot reap the child before it is known.
    let _guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = cmd
        .spawn()
        .map_err(|source| HostError::Spawn { program, source })?;
    drop(procs);
    let pid = child.id() as i32;
    registry(|map| map.insert(pid, None));
    Ok(SupervisedChild {
        pid,
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        exited: None,
    })
}

impl SupervisedChild {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The exit, if the process ended.
    pub fn try_wait(&mut self) -> Option<ProcessExit> {
        if self.exited.is_some() {
            return self.exited;
        }
        let _guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
        let ours = match waitpid(Pid::from_raw(self.pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(status) => exit_of(status),
            // Reaped by the reaper already: its status is in the registry.
            Err(_) => None,
        };
        let exit = ours.or_else(|| registry(|map| map.get(&self.pid).copied().flatten()));
        if exit.is_some() {
            registry(|map| map.remove(&self.pid));
            self.exited = exit;
        }
        exit
    }

    /// Waits up to `wait` for the process to end.
    pub fn wait_timeout(&mut self, wait: Duration) -> Option<ProcessExit> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(exit) = self.try_wait() {
                return Some(exit);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
    }
}

/// Signal number `signal` to the process group `pgid` (a supervised child leads its own);
/// an unknown number or a group already gone is ignored.
pub fn signal_process_group(pgid: i32, signal: i32) {
    if let Ok(signal) = nix::sys::signal::Signal::try_from(signal) {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), signal);
    }
}
