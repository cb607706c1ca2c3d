//! The drain phase every way down starts with (docs/node.md, "Draining"): the machine
//! configuration's drain command first — what cordons the node and evicts its work from its
//! cluster — then the node's services stopped in reverse start order. A live upgrade is refused
//! when the command fails (nothing written yet, the services still run); a reboot, rollback,
//! reset, shutdown or staged upgrade logs the failure and goes down all the same: a node must
//! be able to stop, and `--stage` is how a node that cannot drain live is upgraded.

use std::collections::VecDeque;
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slate_machine_config::Drain;
use slate_sequencer::{PhaseListBuilder, TaskContext, TaskError};

use crate::base::journal::Journal;
use crate::base::node::Node;
use crate::base::task::failed;

/// Why the node drains: told to the command (`SLATE_DRAIN_REASON`) and to the services' log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainReason {
    /// A live upgrade to this version: a failed command refuses it.
    Upgrade {
        to: String,
    },
    /// An upgrade recorded for the next boot, which installs it before services start.
    StagedUpgrade {
        to: String,
    },
    Reboot,
    Shutdown,
    Reset,
}

impl DrainReason {
    /// The value of `SLATE_DRAIN_REASON`.
    pub fn name(&self) -> &'static str {
        match self {
            DrainReason::Upgrade { .. } => "upgrade",
            DrainReason::StagedUpgrade { .. } => "staged-upgrade",
            DrainReason::Reboot => "reboot",
            DrainReason::Shutdown => "shutdown",
            DrainReason::Reset => "reset",
        }
    }

    /// What the services' stop lines say.
    fn why(&self) -> &'static str {
        match self {
            DrainReason::Upgrade { .. } => "an upgrade is installed",
            DrainReason::StagedUpgrade { .. } => "a staged upgrade reboots the node",
            DrainReason::Reboot => "the node reboots",
            DrainReason::Shutdown => "the node shuts down",
            DrainReason::Reset => "the node is reset",
        }
    }

    fn target_version(&self) -> Option<&str> {
        match self {
            DrainReason::Upgrade { to } | DrainReason::StagedUpgrade { to } => Some(to),
            _ => None,
        }
    }
}

/// The lines of a command's output kept for its error: the last ones, each cut short.
const TAIL_LINES: usize = 20;
const TAIL_LINE_BYTES: usize = 512;
/// Lines of its output also sent to the console; the rest only to the journal.
const CONSOLE_LINES: usize = 200;
/// How long a killed command's group is given to go, and its output to be read after it ended.
const AFTER_END: Duration = Duration::from_secs(2);

/// How a drain command ended, when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainFailure {
    /// What went wrong: its exit status, its timeout, or why it could not start.
    pub what: String,
    /// Its last lines of output (stdout and stderr), oldest first.
    pub tail: Vec<String>,
}

impl std::fmt::Display for DrainFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)?;
        if self.tail.is_empty() {
            f.write_str(" (it printed nothing)")
        } else {
            write!(f, "; its last output: {}", self.tail.join(" | "))
        }
    }
}

/// Runs `drain.command` in a session of its own with a clean environment (`PATH`, the
/// `SLATE_*` variables of `env`), its output into the journal as `drain: LINE`; kills its
/// process group when it outlives `drain.timeout_secs`. Ok with how long it took.
pub fn run_command(
    journal: &Arc<Journal>,
    drain: &Drain,
    env: &[(&str, &str)],
) -> Result<Duration, DrainFailure> {
    let started = Instant::now();
    let failure = |what: String, tail: Vec<String>| DrainFailure { what, tail };
    let mut cmd = Command::new(&drain.command[0]);
    cmd.args(&drain.command[1..])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .current_dir("/");
    let mut child = slate_host::spawn_supervised(&mut cmd, None)
        .map_err(|e| failure(slate_sequencer::error_chain(&e), Vec::new()))?;
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let (done_tx, done_rx) = mpsc::channel();
    let printed = Arc::new(Mutex::new(0usize));
    let pipes: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child.stdout.take().map(|p| Box::new(p) as _),
        child.stderr.take().map(|p| Box::new(p) as _),
    ];
    let mut readers = 0;
    for pipe in pipes.into_iter().flatten() {
        readers += 1;
        let (journal, tail, printed, done) = (
            journal.clone(),
            tail.clone(),
            printed.clone(),
            done_tx.clone(),
        );
        std::thread::spawn(move || {
            slate_host::spawn_line_reader(pipe, move |line| {
                keep_line(&tail, &line);
                let mut count = printed.lock().unwrap_or_else(|p| p.into_inner());
                *count += 1;
                if *count <= CONSOLE_LINES {
                    journal.info(format_args!("drain: {line}"));
                } else {
                    journal.program_output(format_args!("drain: {line}"));
                }
                true
            })
            .join()
            .ok();
            let _ = done.send(());
        });
    }
    let timeout = Duration::from_secs(u64::from(drain.timeout_secs));
    let exit = child.wait_timeout(timeout);
    if exit.is_none() {
        // 9: SIGKILL.
        slate_host::signal_process_group(child.pid(), 9);
        child.wait_timeout(AFTER_END);
    }
    // Its output until its pipes close (a daemon it left behind may hold them: not waited for).
    let deadline = Instant::now() + AFTER_END;
    for _ in 0..readers {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    let tail: Vec<String> = tail
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    match exit {
        None => Err(failure(
            format!(
                "it did not finish within its {} s and was killed",
                drain.timeout_secs
            ),
            tail,
        )),
        Some(slate_host::ProcessExit::Code(0)) => Ok(started.elapsed()),
        Some(slate_host::ProcessExit::Code(code)) => {
            Err(failure(format!("it exited with status {code}"), tail))
        }
        Some(slate_host::ProcessExit::Signal(signal)) => {
            Err(failure(format!("it was killed by signal {signal}"), tail))
        }
    }
}

fn keep_line(tail: &Mutex<VecDeque<String>>, line: &str) {
    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
    if tail.len() == TAIL_LINES {
        tail.pop_front();
    }
    let mut end = line.len().min(TAIL_LINE_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    tail.push_back(line[..end].to_owned());
}

/// The drain phase every way down starts with: the drain command, the node's services stopped.
pub fn drain<'a>(
    node: &'a Node,
    builder: PhaseListBuilder<'a>,
    reason: DrainReason,
) -> PhaseListBuilder<'a> {
    builder.append(
        "drain",
        [crate::base::task::task(node, "drainNode", move |ctx| {
            task(ctx, node, &reason)
        })],
    )
}

/// The drain task: the command (when the machine configuration has one), then every service
/// stopped. Fails only for a live upgrade whose command failed, before any service stopped.
pub fn task(ctx: &TaskContext<'_>, node: &Node, reason: &DrainReason) -> Result<(), TaskError> {
    let config = node.machine.current();
    if let Some((drain, name)) = config.and_then(|c| Some((c.drain?, c.node.name))) {
        let mut env = vec![
            ("SLATE_DRAIN_REASON", reason.name()),
            ("SLATE_NODE_NAME", name.as_str()),
            ("SLATE_VERSION", node.version.as_str()),
        ];
        if let Some(to) = reason.target_version() {
            env.push(("SLATE_TARGET_VERSION", to));
        }
        ctx.log(&format!(
            "running the drain command {} ({}; at most {} s)",
            drain.command.join(" "),
            reason.name(),
            drain.timeout_secs
        ));
        match run_command(&node.journal, &drain, &env) {
            Ok(took) => ctx.log(&format!(
                "the drain command succeeded in {} ms",
                took.as_millis()
            )),
            Err(failure) if matches!(reason, DrainReason::Upgrade { .. }) => {
                return Err(failed(format!(
                    "the drain command failed: {failure}. The upgrade is refused before anything \
                     was written and the services keep running; `slate upgrade --stage` \
                     installs it at the next boot without a live drain"
                )));
            }
            Err(failure) => node.journal.error(format_args!(
                "the drain command failed: {failure}; the node goes on ({})",
                reason.why()
            )),
        }
    }
    crate::boot::services::drain(ctx, node, reason.why());
    Ok(())
}

#[cfg(test)]
#[path = "drain_tests.rs"]
mod tests;
