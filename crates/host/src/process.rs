//! Child processes of PID 1, and the zombie reaper.
//!
//! As PID 1, machined inherits every orphan and must reap them, but a reaper calling
//! `waitpid(-1)` would also steal the exit status of the commands machined itself runs. Both
//! therefore take one lock: a command is spawned and waited for under it, and the reaper sweeps
//! only between commands.

use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::{HostError, Result};

static CHILDREN: Mutex<()> = Mutex::new(());

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

/// Reap every exited child that is not being waited for by [`run_command`], once.
/// Returns how many were reaped.
pub fn reap_zombies() -> usize {
    let _guard = CHILDREN.lock().unwrap_or_else(|p| p.into_inner());
    let mut reaped = 0;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) | Err(_) => return reaped,
            Ok(_) => reaped += 1,
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
}
