//! Child processes of PID 1, and the zombie reaper.
//!
//! As PID 1, machined inherits every orphan and must reap them, but a reaper calling
//! `waitpid(-1)` would also steal the exit status of the commands machined itself runs. Both
//! therefore take one lock: a command is spawned and waited for under it, and the reaper sweeps
//! only between commands.

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::reaper::CHILDREN;
use crate::{HostError, Result};

/// A child spawned under the reaper's lock, which it holds until it is dropped: PID 1's reaper
/// cannot take its exit status, however long it runs. Derefs to the [`Child`] to wait for.
/// Commands started elsewhere in the process wait meanwhile, as they do for each other.
#[derive(Debug)]
pub struct GuardedChild {
    child: std::process::Child,
    _reaper_held: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for GuardedChild {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.child
    }
}

impl std::ops::DerefMut for GuardedChild {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.child
    }
}

/// `cmd.spawn()` under the reaper's lock (see [`GuardedChild`]).
pub(crate) fn spawn_guarded(cmd: &mut Command) -> std::io::Result<GuardedChild> {
    let guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
    Ok(GuardedChild {
        child: cmd.spawn()?,
        _reaper_held: guard,
    })
}

/// Run `cmd` to completion and return its output; a non-zero exit is an error carrying the
/// command's stderr and stdout.
pub fn run_command(cmd: &mut Command) -> Result<Output> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let _guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
    let out = cmd.output().map_err(|source| HostError::Spawn {
        program: program.clone(),
        source,
    })?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !stdout.trim().is_empty() {
            text.push_str(" | ");
            text.push_str(stdout.trim());
        }
        return Err(HostError::CommandFailed {
            program,
            status: out.status.to_string(),
            output: text,
        });
    }
    Ok(out)
}

/// How a command run by [`run_command_logged`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandEnd {
    /// It exited by itself (or was killed by someone else).
    Exited(ExitStatus),
    /// It was still running at its deadline: it was killed, with its process group.
    TimedOut,
    /// `cancelled` said stop: it was killed, with its process group.
    Cancelled,
}

/// Longest line handed to `on_line`; a longer one arrives in pieces.
const MAX_LINE: usize = 4096;
/// How long output is still collected once the command is gone (a process outside its group
/// may hold the pipes open forever).
const DRAIN: Duration = Duration::from_secs(1);

/// Run `cmd` in a process group of its own, stdin empty, handing each line it prints (stdout
/// and stderr, as they come) to `on_line`, until it exits, `timeout` passes or `cancelled`
/// returns true. Whatever is left of its process group when it ends is killed (one-shot jobs
/// do not leave daemons behind, as a systemd oneshot service does not). Like [`run_command`] it
/// runs under the reaper's lock, so its exit status cannot be stolen.
pub fn run_command_logged(
    cmd: &mut Command,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
    on_line: &mut dyn FnMut(&str),
) -> Result<CommandEnd> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let _guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = spawn_retrying_busy(cmd).map_err(|source| HostError::Spawn {
        program: program.clone(),
        source,
    })?;
    let started = Instant::now();
    let (tx, lines) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        forward_lines(out, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(err, tx);
    }
    let pid = Pid::from_raw(child.id() as i32);
    let kill_group = || {
        let _ = killpg(pid, Signal::SIGKILL);
    };
    let wait_error = |source| HostError::Spawn {
        program: program.clone(),
        source,
    };
    let end = loop {
        match lines.recv_timeout(Duration::from_millis(20)) {
            Ok(line) => on_line(&line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(20)),
        }
        // WNOWAIT: an exited child stays a zombie, so its pid (the group's id) cannot be reused
        // before the group is killed below.
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) => break None,
            Err(errno) => return Err(wait_error(errno.into())),
        }
        if cancelled() {
            break Some(CommandEnd::Cancelled);
        }
        if started.elapsed() >= timeout {
            break Some(CommandEnd::TimedOut);
        }
    };
    kill_group();
    let status = child.wait().map_err(wait_error)?;
    let drain_until = Instant::now() + DRAIN;
    while let Some(left) = drain_until.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => on_line(&line),
            Err(_) => break,
        }
    }
    Ok(end.unwrap_or(CommandEnd::Exited(status)))
}

/// `spawn`, retried while the program is "text file busy": another thread's fork may briefly
/// hold a copy of the descriptor a script was just written through.
fn spawn_retrying_busy(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(Errno::ETXTBSY as i32) && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// A thread sending `pipe`'s lines (lossy UTF-8, without the newline) to `tx` until EOF.
fn forward_lines(pipe: impl Read + Send + 'static, tx: mpsc::Sender<String>) {
    spawn_line_reader(pipe, move |line| tx.send(line).is_ok());
}

/// A thread handing each line of `pipe` (lossy UTF-8, without the newline; a line longer than
/// 4 KiB in pieces) to `on_line` until EOF or until `on_line` answers false. Memory stays at
/// one piece however much the other end writes.
pub fn spawn_line_reader(
    mut pipe: impl Read + Send + 'static,
    mut on_line: impl FnMut(String) -> bool + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        let mut send = |bytes: &[u8]| on_line(String::from_utf8_lossy(bytes).into_owned());
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                if !send(&line[..end]) {
                    return;
                }
            }
            while pending.len() >= MAX_LINE {
                let piece: Vec<u8> = pending.drain(..MAX_LINE).collect();
                if !send(&piece) {
                    return;
                }
            }
        }
        if !pending.is_empty() {
            send(&pending);
        }
    })
}

/// Reap every exited child that is not being waited for by [`run_command`], once.
/// Returns how many were reaped.
pub fn reap_zombies() -> usize {
    let _guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
    let mut reaped = 0;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) | Err(_) => return reaped,
            Ok(status) => {
                crate::reaper::reaped(status);
                reaped += 1;
            }
        }
    }
}

/// Start a thread that reaps zombies every `interval` for the life of the process.
pub fn spawn_reaper(interval: Duration) {
    std::thread::Builder::new()
        .name("reaper".into())
        .spawn(move || loop {
            reap_zombies();
            std::thread::sleep(interval);
        })
        .expect("spawning the reaper thread");
}

/// This process's resident set in KiB (`VmRSS` of /proc/self/status).
pub fn resident_kib() -> Result<u64> {
    let path = std::path::Path::new("/proc/self/status");
    let text = std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.to_owned(),
        source,
    })?;
    resident_kib_of(&text).ok_or_else(|| HostError::Read {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no VmRSS line"),
    })
}

/// The CPU time this process has used so far, every thread, user and system
/// (`CLOCK_PROCESS_CPUTIME_ID`: nanoseconds, where /proc's utime and stime count 10 ms ticks).
pub fn process_cpu_time() -> Result<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).map_err(
        |source| HostError::Device {
            what: "CLOCK_PROCESS_CPUTIME_ID".into(),
            reason: source.to_string(),
        },
    )?;
    Ok(Duration::from(t))
}

/// `VmRSS:   1234 kB` of a /proc/PID/status text.
fn resident_kib_of(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_commands_report_their_output() {
        let err = run_command(Command::new("sh").args(["-c", "echo oops >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sh failed"), "{err}");
        assert!(err.contains("oops"), "{err}");
        let out = run_command(Command::new("sh").args(["-c", "echo fine"])).unwrap();
        assert_eq!(out.stdout, b"fine\n");
    }

    fn logged(script: &str, timeout: Duration) -> (Result<CommandEnd>, Vec<String>) {
        let mut lines = Vec::new();
        let end = run_command_logged(
            Command::new("sh").args(["-c", script]),
            timeout,
            &|| false,
            &mut |l| lines.push(l.to_owned()),
        );
        (end, lines)
    }

    #[test]
    fn a_logged_command_hands_over_its_lines_and_exit_status() {
        let (end, lines) = logged(
            "echo one; echo two >&2; printf three; exit 4",
            Duration::from_secs(30),
        );
        let CommandEnd::Exited(status) = end.unwrap() else {
            panic!("not exited");
        };
        assert_eq!(status.code(), Some(4));
        let mut sorted = lines.clone();
        sorted.sort();
        assert_eq!(sorted, ["one", "three", "two"], "{lines:?}");
    }

    #[test]
    fn a_logged_command_past_its_deadline_is_killed_with_its_group() {
        let started = Instant::now();
        // The background sleep holds the pipes: killing the group is what ends the wait.
        let (end, lines) = logged(
            "echo before; sleep 30 & sleep 30",
            Duration::from_millis(300),
        );
        assert_eq!(end.unwrap(), CommandEnd::TimedOut);
        assert_eq!(lines, ["before"]);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_logged_command_stops_when_cancelled() {
        let started = Instant::now();
        let end = run_command_logged(
            Command::new("sleep").arg("30"),
            Duration::from_secs(60),
            &|| started.elapsed() > Duration::from_millis(100),
            &mut |_| {},
        );
        assert_eq!(end.unwrap(), CommandEnd::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// The chrooted command of a snapshot upgrade failed with ECHILD on a node (the btrfs VM
    /// scenario, once in CI): machined's reaper had taken its status while the engine polled
    /// `try_wait`. A guarded child keeps its status through reaper sweeps.
    #[test]
    fn the_reaper_does_not_steal_a_guarded_childs_status() {
        let mut child = spawn_guarded(Command::new("sh").args(["-c", "exit 7"])).unwrap();
        let sweeper = std::thread::spawn(|| {
            // Blocks until the guard is dropped, as machined's reaper does.
            reap_zombies()
        });
        std::thread::sleep(Duration::from_millis(200));
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(7));
        drop(child);
        sweeper.join().unwrap();
    }

    #[test]
    fn the_reaper_does_not_steal_a_running_commands_status() {
        let handle = std::thread::spawn(|| {
            for _ in 0..50 {
                reap_zombies();
            }
        });
        for _ in 0..20 {
            run_command(&mut Command::new("true")).unwrap();
        }
        handle.join().unwrap();
    }

    #[test]
    fn the_resident_set_is_read_from_vmrss() {
        let status = "Name:\tmachined\nVmPeak:\t  20000 kB\nVmRSS:\t    8812 kB\nThreads:\t4\n";
        assert_eq!(resident_kib_of(status), Some(8812));
        assert_eq!(resident_kib_of("Name:\tx\n"), None);
        assert_eq!(resident_kib_of("VmRSS:\tlots kB\n"), None);
        assert!(resident_kib().unwrap() > 0);
    }

    /// A service printing a megabyte without a newline costs the reader one 4 KiB piece at a
    /// time, never the whole line.
    #[test]
    fn a_line_reader_hands_over_bounded_pieces() {
        let mut child = Command::new("sh")
            .args([
                "-c",
                "head -c 1048576 /dev/zero | tr '\\0' x; echo; echo last",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = spawn_line_reader(child.stdout.take().unwrap(), move |line| {
            tx.send(line.len()).is_ok()
        });
        reader.join().unwrap();
        child.wait().unwrap();
        let lengths: Vec<usize> = rx.try_iter().collect();
        assert!(
            lengths.iter().all(|&n| n <= MAX_LINE),
            "{:?}",
            lengths.iter().max()
        );
        assert_eq!(lengths.iter().sum::<usize>(), (1 << 20) + "last".len());
        assert_eq!(lengths.last(), Some(&4));
    }
}
