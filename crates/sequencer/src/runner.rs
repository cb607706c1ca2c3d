//! Running a sequence: phases one after another, the tasks of a phase concurrently.

use std::any::Any;
use std::error::Error;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::cancel::CancelToken;
use crate::error::SequenceError;
use crate::log::{error_chain, Logger, Span};
use crate::phase::Sequence;
use crate::task::{Message, Progress, Task, TaskContext, TaskError};
use crate::SequenceKind;

impl Sequence<'_> {
    /// Runs the sequence to completion, or to its first failure or cancellation.
    ///
    /// - Phases run one after another; the tasks of a phase run concurrently, one thread each,
    ///   and the phase ends when all of them have returned.
    /// - `cancel` is checked before every phase: once it fires, no further phase starts and the
    ///   result is [`SequenceError::Cancelled`]. Tasks see it (through a per-phase child token)
    ///   and should stop early.
    /// - The first task to fail decides the outcome: its siblings' token is cancelled, they
    ///   are allowed to finish (never abandoned mid-write), and no later phase runs. A failure
    ///   becomes [`SequenceError::Fatal`] naming the phase and task, a reboot request
    ///   [`SequenceError::Reboot`], a cancelled task [`SequenceError::Cancelled`]. A panicking
    ///   task counts as a failure; the panic does not unwind into the caller (PID 1).
    /// - Deferred phase checks run when their phase is reached.
    pub fn run(self, cancel: &CancelToken, logger: &dyn Logger) -> Result<(), SequenceError> {
        let (kind, phases) = self.into_parts();
        let total = phases.len();
        let started = Instant::now();
        logger.log(&format!("{kind} sequence: {total} phase(s)"));
        for (index, phase) in phases.into_iter().enumerate() {
            let position = Progress {
                index: index + 1,
                total,
            };
            let (name, tasks, check) = phase.into_parts();
            if cancel.is_cancelled() {
                logger.log(&format!(
                    "{kind} sequence: cancelled before phase {name} ({position})"
                ));
                return Err(SequenceError::Cancelled { sequence: kind });
            }
            if let Some(check) = check {
                if !check() {
                    logger.log(&format!("phase {name} ({position}): skipped"));
                    continue;
                }
            }
            logger.log(&format!(
                "phase {name} ({position}): {} task(s)",
                tasks.len()
            ));
            let phase_started = Instant::now();
            let failure = run_phase(kind, &name, tasks, cancel, logger);
            logger.span(&Span {
                sequence: kind,
                phase: name.clone(),
                task: None,
                started: phase_started,
                took: phase_started.elapsed(),
                ok: failure
                    .as_ref()
                    .is_none_or(|(_, e)| matches!(e, TaskError::Reboot(_))),
            });
            if let Some((task, error)) = failure {
                logger.log(&format!("phase {name} ({position}): failed"));
                let error = match error {
                    TaskError::Reboot(mode) => SequenceError::Reboot { mode },
                    TaskError::Cancelled => SequenceError::Cancelled { sequence: kind },
                    TaskError::Failed(source) => SequenceError::Fatal {
                        sequence: kind,
                        phase: name,
                        task,
                        source,
                    },
                };
                logger.log(&format!("{kind} sequence: {}", error_chain(&error)));
                return Err(error);
            }
            logger.log(&format!(
                "phase {name} ({position}): done in {}",
                Millis(phase_started.elapsed())
            ));
        }
        logger.log(&format!(
            "{kind} sequence: done in {}",
            Millis(started.elapsed())
        ));
        Ok(())
    }
}

/// Runs one phase's tasks concurrently; returns the first failure (in time), if any.
fn run_phase<'a>(
    kind: SequenceKind,
    phase: &str,
    tasks: Vec<Task<'a>>,
    cancel: &CancelToken,
    logger: &dyn Logger,
) -> Option<(String, TaskError)> {
    let total = tasks.len();
    // A child token: a failing task stops its siblings without cancelling the sequence, which
    // would make a plain failure indistinguishable from a takeover.
    let phase_token = cancel.child();
    let first_failure: Mutex<Option<(String, TaskError)>> = Mutex::new(None);
    let record = |task: &str, error: TaskError| {
        {
            let mut slot = first_failure.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some((task.to_owned(), error));
            }
        }
        // After recording: a sibling returning Cancelled because of this never wins the slot.
        phase_token.cancel();
    };

    thread::scope(|scope| {
        let mut running = Vec::with_capacity(total);
        for (index, task) in tasks.into_iter().enumerate() {
            let progress = Progress {
                index: index + 1,
                total,
            };
            let (name, body) = task.into_parts();
            let thread_name: String = name.chars().filter(|&c| c != '\0').collect();
            let (record, phase_token) = (&record, &phase_token);
            let task_name = name.clone();
            let spawned = thread::Builder::new()
                .name(thread_name)
                .spawn_scoped(scope, move || {
                    let ctx = TaskContext::new(&task_name, phase, progress, phase_token, logger);
                    logger.log(&format!("task {task_name} ({progress}) starting"));
                    let started = Instant::now();
                    let result = panic::catch_unwind(AssertUnwindSafe(|| body(&ctx)))
                        .unwrap_or_else(|payload| Err(panicked(payload.as_ref())));
                    let took = started.elapsed();
                    logger.span(&Span {
                        sequence: kind,
                        phase: phase.to_owned(),
                        task: Some(task_name.clone()),
                        started,
                        took,
                        ok: matches!(result, Ok(()) | Err(TaskError::Reboot(_))),
                    });
                    let elapsed = Millis(took);
                    match result {
                        Ok(()) => {
                            logger.log(&format!("task {task_name} ({progress}) done in {elapsed}"))
                        }
                        Err(error) => {
                            logger.log(&format!(
                                "task {task_name} ({progress}) {} after {elapsed}: {error}",
                                outcome(&error)
                            ));
                            record(&task_name, error);
                        }
                    }
                });
            match spawned {
                Ok(handle) => running.push((name, handle)),
                Err(error) => {
                    // Out of threads: fail the phase, but still wait for what did start.
                    logger.log(&format!(
                        "task {name} ({progress}) could not start: {error}"
                    ));
                    record(&name, TaskError::Failed(Box::new(error)));
                    break;
                }
            }
        }
        for (name, handle) in running {
            // Only a panic outside the task body (a Logger implementation) gets here.
            if let Err(payload) = handle.join() {
                record(&name, panicked(payload.as_ref()));
            }
        }
    });
    first_failure
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
}

fn outcome(error: &TaskError) -> &'static str {
    match error {
        TaskError::Reboot(_) => "requested a reboot",
        TaskError::Cancelled => "cancelled",
        TaskError::Failed(_) => "failed",
    }
}

fn panicked(payload: &(dyn Any + Send)) -> TaskError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned());
    let error: Box<dyn Error + Send + Sync> = Box::new(Message(format!("panicked: {message}")));
    TaskError::Failed(error)
}

/// Durations in the log as whole milliseconds (`12ms`): enough for boot timing, short to read.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0.as_millis())
    }
}
