//! Tasks: named units of work, and what they see while running.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::cancel::CancelToken;
use crate::error::RebootMode;
use crate::log::{error_chain, Logger};

/// A task's position in its phase, displayed as `k/n` (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// 1-based position.
    pub index: usize,
    /// Number of tasks in the phase.
    pub total: usize,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.total)
    }
}

/// How a task ends other than successfully.
///
/// Not itself a [`std::error::Error`], so that any error converts into it with `?` (like
/// `anyhow::Error`); the runner turns it into a [`SequenceError`](crate::SequenceError).
#[derive(Debug)]
pub enum TaskError {
    /// The node must go down: the sequence stops and the request unwinds to the top-level
    /// handler as [`SequenceError::Reboot`](crate::SequenceError::Reboot).
    Reboot(RebootMode),
    /// The task stopped because its cancellation token fired.
    Cancelled,
    /// The task failed.
    Failed(Box<dyn Error + Send + Sync + 'static>),
}

impl TaskError {
    /// A failure described by a message alone.
    pub fn msg(message: impl Into<String>) -> Self {
        TaskError::Failed(Box::new(Message(message.into())))
    }
}

impl<E: Error + Send + Sync + 'static> From<E> for TaskError {
    fn from(error: E) -> Self {
        TaskError::Failed(Box::new(error))
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Reboot(mode) => write!(f, "reboot requested (mode {mode})"),
            TaskError::Cancelled => f.write_str("cancelled"),
            TaskError::Failed(error) => f.write_str(&error_chain(error.as_ref())),
        }
    }
}

/// The error behind [`TaskError::msg`].
#[derive(Debug)]
pub(crate) struct Message(pub(crate) String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Message {}

/// What a running task sees: its identity, the phase's cancellation token and a logger that
/// prefixes its lines with `task NAME (k/n): `.
pub struct TaskContext<'c> {
    name: &'c str,
    phase: &'c str,
    progress: Progress,
    cancel: &'c CancelToken,
    logger: &'c dyn Logger,
}

impl<'c> TaskContext<'c> {
    /// A context for running a task outside a sequence (machined's unit tests of its tasks);
    /// the runner builds its own.
    pub fn new(
        name: &'c str,
        phase: &'c str,
        progress: Progress,
        cancel: &'c CancelToken,
        logger: &'c dyn Logger,
    ) -> Self {
        Self {
            name,
            phase,
            progress,
            cancel,
            logger,
        }
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// The name of the phase the task runs in.
    pub fn phase(&self) -> &str {
        self.phase
    }

    /// The task's `k/n` position in its phase.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Cancelled when the sequence is taken over or a sibling task fails.
    pub fn cancel_token(&self) -> &CancelToken {
        self.cancel
    }

    /// Whether the task should stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// `Err(TaskError::Cancelled)` once cancelled, for `ctx.check_cancelled()?` between steps.
    pub fn check_cancelled(&self) -> Result<(), TaskError> {
        if self.is_cancelled() {
            Err(TaskError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Sleeps for `duration` unless cancelled first (then `Err(TaskError::Cancelled)`), so a
    /// task that polls something never delays a takeover by its poll interval.
    pub fn sleep(&self, duration: Duration) -> Result<(), TaskError> {
        if self.cancel.wait_timeout(duration) {
            Err(TaskError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Logs `task NAME (k/n): MESSAGE`.
    pub fn log(&self, message: &str) {
        self.logger.log(&format!(
            "task {} ({}): {message}",
            self.name, self.progress
        ));
    }
}

impl fmt::Debug for TaskContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("name", &self.name)
            .field("phase", &self.phase)
            .field("progress", &self.progress)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// The body of a task. It may borrow anything that outlives the sequence (`'a`): tasks run on
/// scoped threads, so machined's runtime state can be lent to them without `Arc`.
pub type TaskFn<'a> = Box<dyn FnOnce(&TaskContext<'_>) -> Result<(), TaskError> + Send + 'a>;

/// A named unit of work. Tasks of one phase run concurrently, each on its own thread.
pub struct Task<'a> {
    name: String,
    body: TaskFn<'a>,
}

impl<'a> Task<'a> {
    /// A task called `name` (camelCase by convention: `mountState`) running `body`.
    pub fn new(
        name: impl Into<String>,
        body: impl FnOnce(&TaskContext<'_>) -> Result<(), TaskError> + Send + 'a,
    ) -> Self {
        Self {
            name: name.into(),
            body: Box::new(body),
        }
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs the body on the current thread.
    pub fn run(self, context: &TaskContext<'_>) -> Result<(), TaskError> {
        (self.body)(context)
    }

    pub(crate) fn into_parts(self) -> (String, TaskFn<'a>) {
        (self.name, self.body)
    }
}

impl fmt::Debug for Task<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::MemoryLogger;

    #[test]
    fn context_logs_with_name_and_progress() {
        let logger = MemoryLogger::new();
        let token = CancelToken::new();
        let progress = Progress { index: 2, total: 3 };
        let ctx = TaskContext::new("mountState", "mount", progress, &token, &logger);
        let task = Task::new("mountState", |ctx| {
            ctx.log("mounted");
            ctx.check_cancelled()
        });
        task.run(&ctx).unwrap();
        assert_eq!(logger.lines(), ["task mountState (2/3): mounted"]);
        token.cancel();
        assert!(matches!(ctx.check_cancelled(), Err(TaskError::Cancelled)));
        assert!(matches!(
            ctx.sleep(Duration::from_secs(30)),
            Err(TaskError::Cancelled)
        ));
    }

    #[test]
    fn any_error_converts_with_question_mark() {
        fn parse() -> Result<(), TaskError> {
            let _: u32 = "x".parse()?;
            Ok(())
        }
        assert!(matches!(parse(), Err(TaskError::Failed(_))));
        assert_eq!(TaskError::msg("boom").to_string(), "boom");
    }
}
