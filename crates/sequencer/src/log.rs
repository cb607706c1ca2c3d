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

    /// A phase or a task ended: when it started and how long it took (a boot breakdown is
    /// made of these). Ignored unless the logger keeps them.
    fn span(&self, span: &Span) {
        let _ = span;
    }
}

/// One finished phase (`task` `None`) or task of a sequence, timed by the monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub sequence: crate::SequenceKind,
    pub phase: String,
    pub task: Option<String>,
    pub started: std::time::Instant,
    pub took: std::time::Duration,
    /// Ended without an error (a requested reboot is not one).
    pub ok: bool,
}

impl<L: Logger + ?Sized> Logger for &L {
    fn log(&self, line: &str) {
        (**self).log(line);
    }
    fn span(&self, span: &Span) {
        (**self).span(span);
    }
}

impl<L: Logger + ?Sized> Logger for Arc<L> {
    fn log(&self, line: &str) {
        (**self).log(line);
    }
    fn span(&self, span: &Span) {
        (**self).span(span);
    }
}

impl<L: Logger + ?Sized> Logger for Box<L> {
    fn log(&self, line: &str) {
        (**self).log(line);
    }
    fn span(&self, span: &Span) {
        (**self).span(span);
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
    spans: Mutex<Vec<Span>>,
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

    /// A copy of the spans recorded so far, in the order they ended.
    pub fn spans(&self) -> Vec<Span> {
        self.spans
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

    fn span(&self, span: &Span) {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(span.clone());
    }
}

/// `error: cause: cause…` — the whole chain on one line, because a kmsg line is all an operator
/// gets when a node fails at boot. The one formatter for error chains in machined, the
/// sequencer and the API client, so every chain in the console reads the same (the VM tests
/// grep these lines).
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layers(texts: &[&'static str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |source, &text| {
                Some(Layer {
                    text,
                    source: source.map(Box::new),
                })
            })
            .expect("at least one layer")
    }

    #[test]
    fn a_lone_error_is_its_message() {
        assert_eq!(error_chain(&layers(&["disk full"])), "disk full");
    }

    #[test]
    fn causes_follow_outermost_first_separated_by_colons() {
        let error = layers(&["reading META", "opening /dev/vda2", "permission denied"]);
        assert_eq!(
            error_chain(&error),
            "reading META: opening /dev/vda2: permission denied"
        );
    }

    #[test]
    fn boxed_send_sync_errors_format_the_same() {
        let boxed: Box<dyn Error + Send + Sync> = Box::new(layers(&["a", "b"]));
        assert_eq!(error_chain(boxed.as_ref()), "a: b");
    }
}
