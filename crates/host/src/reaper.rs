//! PID 1's one lock over its children, and what the reaper keeps for supervised ones.
//!
//! As PID 1, machined inherits every orphan and must reap them, but a reaper calling
//! `waitpid(-1)` would also steal the exit status of the commands machined runs itself. A
//! command is therefore spawned and waited for under [`CHILDREN`] (`process.rs`), and the
//! reaper sweeps only between commands. A service cannot hold the lock for its life, so it is
//! registered instead (`supervised.rs`): the reaper keeps a registered pid's exit status here
//! for its supervisor.

use std::collections::HashMap;
use std::sync::Mutex;

use nix::sys::wait::WaitStatus;

pub(crate) static CHILDREN: Mutex<()> = Mutex::new(());

/// How a supervised process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessExit {
    Code(i32),
    Signal(i32),
}

/// Registered pids, and the exit status the reaper took for each (until its supervisor reads
/// it).
static SUPERVISED: Mutex<Option<HashMap<i32, Option<ProcessExit>>>> = Mutex::new(None);

pub(crate) fn registry<T>(f: impl FnOnce(&mut HashMap<i32, Option<ProcessExit>>) -> T) -> T {
    let mut guard = SUPERVISED.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

pub(crate) fn exit_of(status: WaitStatus) -> Option<ProcessExit> {
    match status {
        WaitStatus::Exited(_, code) => Some(ProcessExit::Code(code)),
        WaitStatus::Signaled(_, signal, _) => Some(ProcessExit::Signal(signal as i32)),
        _ => None,
    }
}

/// Called by the reaper for each child it reaped: keeps a registered pid's status. Answers
/// whether `pid` was registered.
pub(crate) fn reaped(status: WaitStatus) -> bool {
    let Some(pid) = status.pid() else {
        return false;
    };
    let Some(exit) = exit_of(status) else {
        return false;
    };
    registry(|map| match map.get_mut(&pid.as_raw()) {
        Some(slot) => {
            *slot = Some(exit);
            true
        }
        None => false,
    })
}
