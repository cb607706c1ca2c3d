//! The one way machined makes a sequencer task: with the fault injection the tests use.

use std::time::Duration;

use slate_sequencer::{Task, TaskContext, TaskError};

use crate::base::node::Node;

/// A task, failing on purpose when the kernel command line names it in
/// `slate.debug.fail-task=`, or never finishing when it names it in `slate.debug.hang-task=`
/// (how tests make a boot fail or hang at a chosen point).
pub(crate) fn task<'a>(
    node: &'a Node,
    name: &'static str,
    body: impl FnOnce(&TaskContext<'_>) -> Result<(), TaskError> + Send + 'a,
) -> Task<'a> {
    Task::new(name, move |ctx| {
        if node.config.fail_task.as_deref() == Some(name) {
            return Err(TaskError::msg(format!(
                "fault injected by slate.debug.fail-task={name}"
            )));
        }
        if hang_task().as_deref() == Some(name) {
            ctx.log(&format!(
                "fault injected by slate.debug.hang-task={name}: this task never ends"
            ));
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        body(ctx)
    })
}

/// `slate.debug.hang-task=NAME`, read once from the kernel command line.
fn hang_task() -> Option<String> {
    static HANG: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HANG.get_or_init(|| {
        let cmdline = slate_host::kernel_cmdline().ok()?;
        slate_host::cmdline_value(&cmdline, "slate.debug.hang-task").map(str::to_string)
    })
    .clone()
}

pub(crate) fn failed(message: impl std::fmt::Display) -> TaskError {
    TaskError::msg(message.to_string())
}
