//! One service's thread: wait to be wanted and for what it depends on, start the program in
//! its cgroup, watch it become ready, wait for it to end or to be stopped, and start it again
//! as its policy and backoff say.

use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_host::{Cgroup, ProcessExit, SupervisedChild};
use slate_services::order::service_dependencies;
use slate_services::{Backoff, Exit, ServiceSpec};

use super::{ready, Service, State, Supervisor};

/// How often a running service is looked at (its exit, a stop asked of it).
const POLL: Duration = Duration::from_millis(50);
/// How long what is left of a cgroup gets to die after its kill.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Between two tries of a readiness check.
const READY_INTERVAL: Duration = Duration::from_millis(250);

/// `spec`'s cgroup under `parent`, its limits written.
pub(super) fn service_cgroup(parent: &Cgroup, spec: &ServiceSpec) -> Result<Cgroup, String> {
    let cgroup = parent.child(&spec.name).map_err(|e| e.to_string())?;
    let limits = &spec.limits;
    let writes = [
        ("memory.max", limits.memory_max.map(|v| v.to_string())),
        ("cpu.weight", limits.cpu_weight.map(|v| v.to_string())),
        ("pids.max", limits.pids_max.map(|v| v.to_string())),
    ];
    for (file, value) in writes {
        if let Some(value) = value {
            cgroup
                .write(file, &value)
                .map_err(|e| format!("{file} = {value}: {e}"))?;
        }
    }
    Ok(cgroup)
}

fn exit_of(exit: ProcessExit) -> Exit {
    match exit {
        ProcessExit::Code(code) => Exit::Code(code),
        ProcessExit::Signal(signal) => Exit::Signal(signal),
    }
}

/// The service's life, for as long as machined runs.
pub(super) fn run(sup: &Supervisor, me: &Arc<Service>) {
    let name = &me.spec.name;
    let backoff = Backoff::new(me.spec.restart_delay_ms, me.spec.restart_delay_max_ms);
    let mut failures = 0u32;
    loop {
        if me.status().retired {
            return;
        }
        if !wait_wanted(me) || !wait_dependencies(sup, me) {
            continue;
        }
        let mut child = match spawn(me) {
            Ok(child) => child,
            Err(why) => {
                sup.journal
                    .error(format_args!("service {name}: cannot start: {why}"));
                let mut status = me.status();
                status.last_exit = Some(why);
                status.wanted = false;
                me.set_state(&mut status, State::Failed);
                continue;
            }
        };
        let pid = child.pid();
        sup.journal
            .info(format_args!("service {name}: started, pid {pid}"));
        {
            let mut status = me.status();
            status.pid = u32::try_from(pid).ok();
            status.ready = me.spec.ready.is_none();
            status.restart_at = None;
            me.set_state(&mut status, State::Running);
        }
        forward_output(sup, me, &mut child);
        watch_readiness(sup, me, pid);
        let started = Instant::now();
        let (exit, stopped) = wait_end(sup, me, &mut child);
        if let Some(cgroup) = &me.cgroup {
            // Whatever it started dies with it: nothing of a service outlives it.
            if !cgroup.kill_all(KILL_WAIT).unwrap_or(false) {
                sup.journal.error(format_args!(
                    "service {name}: processes left in {} after its kill",
                    cgroup.path().display()
                ));
            }
        }
        let mut status = me.status();
        status.pid = None;
        status.ready = false;
        status.last_exit = exit.map(|e| e.to_string());
        let ended = exit.map_or_else(|| "its end unknown".to_owned(), |e| e.to_string());
        if stopped {
            status.stop_now = false;
            sup.journal
                .info(format_args!("service {name}: stopped ({ended})"));
            me.set_state(&mut status, State::Stopped);
            continue;
        }
        let restarts = status.wanted && exit.is_some_and(|e| me.spec.restart.restarts(e));
        if !restarts {
            sup.journal.info(format_args!(
                "service {name}: exited ({ended}); not restarted"
            ));
            status.wanted = false;
            me.set_state(&mut status, State::Exited);
            continue;
        }
        failures = Backoff::failures_after(failures, started.elapsed());
        let delay = backoff.delay(failures);
        sup.journal.info(format_args!(
            "service {name}: exited ({ended}); restart {} in {} ms",
            status.restarts + 1,
            delay.as_millis()
        ));
        status.restarts += 1;
        status.restart_at = Some(Instant::now() + delay);
        me.set_state(&mut status, State::Backoff);
        let until = Instant::now() + delay;
        while status.wanted {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            status = me.wait(status, left);
        }
    }
}

/// Blocks until the service is wanted; false if it was found not wanted (its state is then
/// `stopped` unless it ended by itself) and was retired meanwhile.
fn wait_wanted(me: &Service) -> bool {
    let mut status = me.status();
    if !status.wanted {
        if !status.state.is_down() {
            me.set_state(&mut status, State::Stopped);
        }
        while !status.wanted {
            if status.retired {
                return false;
            }
            status = me.wait(status, Duration::from_secs(3600));
        }
    }
    me.set_state(&mut status, State::Waiting);
    true
}

/// Waits until every service `me` depends on is ready; false if `me` stopped being wanted.
fn wait_dependencies(sup: &Supervisor, me: &Service) -> bool {
    let deps: Vec<&str> = service_dependencies(&me.spec).collect();
    loop {
        let mut status = me.status();
        if !status.wanted {
            status.stop_now = false;
            me.set_state(&mut status, State::Stopped);
            return false;
        }
        let waiting = deps
            .iter()
            .find(|d| !sup.find(d).is_some_and(|s| s.status().ready));
        if waiting.is_none() {
            return true;
        }
        drop(me.wait(status, Duration::from_millis(100)));
    }
}

fn spawn(me: &Service) -> Result<SupervisedChild, String> {
    let spec = &me.spec;
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env_clear()
        .envs(&spec.environment)
        .current_dir(spec.working_directory.as_deref().unwrap_or("/".as_ref()))
        .uid(spec.user)
        .gid(spec.group);
    slate_host::spawn_supervised(&mut cmd, me.cgroup.as_ref())
        .map_err(|e| slate_sequencer::error_chain(&e))
}

/// The program's stdout and stderr into the journal, line by line, as `NAME: line`.
fn forward_output(sup: &Supervisor, me: &Service, child: &mut SupervisedChild) {
    let pipes: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child.stdout.take().map(|p| Box::new(p) as _),
        child.stderr.take().map(|p| Box::new(p) as _),
    ];
    for pipe in pipes.into_iter().flatten() {
        let (journal, name) = (sup.journal.clone(), me.spec.name.clone());
        slate_host::spawn_line_reader(pipe, move |line| {
            journal.program_output(format_args!("{name}: {line}"));
            true
        });
    }
}

/// Tries the readiness check beside the run (`pid`'s), marking the service ready when it
/// passes; a check that never passes within `ready_timeout_secs` is logged, and the service
/// keeps running not ready (a health check that needs it fails the boot's commit).
fn watch_readiness(sup: &Supervisor, me: &Arc<Service>, pid: i32) {
    let Some(check) = me.spec.ready.clone() else {
        sup.journal
            .info(format_args!("service {}: ready (it runs)", me.spec.name));
        ready::note_ready(sup);
        return;
    };
    let timeout = Duration::from_secs(u64::from(me.spec.ready_timeout_secs));
    let this_run = move |status: &super::Status| {
        status.state == State::Running && status.pid == u32::try_from(pid).ok()
    };
    let journal = sup.journal.clone();
    let supervisor = sup.me.clone();
    let service = me.clone();
    std::thread::spawn(move || {
        let gone = || !this_run(&service.status());
        let ready = ready::wait_ready(&check, timeout, READY_INTERVAL, &gone);
        let mut status = service.status();
        if !this_run(&status) {
            return;
        }
        if ready {
            status.ready = true;
            service.changed.notify_all();
            journal.info(format_args!(
                "service {}: ready ({check})",
                service.spec.name
            ));
            drop(status);
            if let Some(sup) = supervisor.upgrade() {
                ready::note_ready(&sup);
            }
        } else {
            journal.error(format_args!(
                "service {}: not ready after {} s ({check})",
                service.spec.name,
                timeout.as_secs()
            ));
        }
    });
}

/// Waits for the program to end, or stops it when asked: its stop signal to every process in
/// its cgroup (its session without one), its grace period, then the kill. Answers how it ended
/// and whether it was stopped.
fn wait_end(sup: &Supervisor, me: &Service, child: &mut SupervisedChild) -> (Option<Exit>, bool) {
    loop {
        if let Some(exit) = child.wait_timeout(POLL) {
            let stopped = me.status().stop_now;
            return (Some(exit_of(exit)), stopped);
        }
        let mut status = me.status();
        if !status.stop_now {
            continue;
        }
        me.set_state(&mut status, State::Stopping);
        drop(status);
        let signal = me.spec.stop_signal.number();
        signal_all(me, child.pid(), signal);
        let grace = Duration::from_secs(u64::from(me.spec.stop_grace_secs));
        if let Some(exit) = child.wait_timeout(grace) {
            return (Some(exit_of(exit)), true);
        }
        sup.journal.info(format_args!(
            "service {}: still running {} s after signal {signal}; killed",
            me.spec.name,
            grace.as_secs()
        ));
        match &me.cgroup {
            Some(cgroup) => {
                let _ = cgroup.kill_all(KILL_WAIT);
            }
            None => signal_all(me, child.pid(), 9),
        }
        return (child.wait_timeout(KILL_WAIT).map(exit_of), true);
    }
}

/// `signal` to every process of the service: its cgroup's, or its session's (its pid is the
/// session's and the process group's id).
fn signal_all(me: &Service, pid: i32, signal: i32) {
    match &me.cgroup {
        Some(cgroup) => {
            let _ = cgroup.signal(signal);
        }
        None => slate_host::signal_process_group(pid, signal),
    }
}
