//! The logging seam: the sequencer formats lines, the caller decides where they go.

use std::error::Error;
use std::sync::{Arc, Mutex, PoisonError};

/// Where sequencer and task log lines go. machined implements it over /dev/kmsg; tests collect
/// lines in a [`MemoryLogger`].
///
/// Called concurrently from task threads, hence `Send + Sync`. A line carries no trailing
/// newline.
pub trait Logger: Send + Sync {
    /// Records one line.
    fn log(&self, line: &str);
}

impl<L: Logger + ?Sized> Logger for &L {
    fn log(&self, line: &str) {
        (**self).log(line);
    }
}

impl<L: Logger + ?Sized> Logger for Arc<L> {
    fn log(&self, line: &str) {
        (**self).log(line);
    }
}

impl<L: Logger + ?Sized> Logger for Box<L> {
    fn log(&self, line: &str) {
        (**self).log(line);
    }
}

/// Discards every line.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullLogger;

impl Logger for NullLogger {
    fn log(&self, _line: &str) {}
}

/// Keeps every line in memory, in the order they were logged.
#[derive(Debug, Default)]
pub struct MemoryLogger {
    lines: Mutex<Vec<String>>,
}

impl MemoryLogger {
    /// An empty logger.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the lines logged so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Logger for MemoryLogger {
    fn log(&self, line: &str) {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.to_owned());
    }
}

/// `error: cause: cause…` — the whole chain on one line, because a kmsg line is all an operator
/// gets when a node fails at boot.
pub(crate) fn error_chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
