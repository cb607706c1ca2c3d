//! machined's own log: every line goes to the kernel log (the console) and into an in-memory
//! journal that the API can replay and follow.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use slate_host::KmsgLogger;

/// Lines kept for late readers; older ones are dropped.
const KEEP: usize = 5000;

#[derive(Debug)]
struct Lines {
    /// Sequence number of `lines[0]`.
    first: u64,
    lines: Vec<String>,
}

/// An append-only, bounded log with followers.
#[derive(Debug)]
pub struct Journal {
    kmsg: KmsgLogger,
    lines: Mutex<Lines>,
    grown: Condvar,
}

impl Journal {
    pub fn new(kmsg: KmsgLogger) -> Self {
        Self {
            kmsg,
            lines: Mutex::new(Lines {
                first: 0,
                lines: Vec::new(),
            }),
            grown: Condvar::new(),
        }
    }

    pub fn info(&self, line: impl std::fmt::Display) {
        let line = line.to_string();
        self.kmsg.info(&line);
        self.push(line);
    }

    pub fn error(&self, line: impl std::fmt::Display) {
        let line = line.to_string();
        self.kmsg.error(&line);
        self.push(format!("error: {line}"));
    }

    fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.lines.push(line);
        if lines.lines.len() > KEEP {
            let drop = lines.lines.len() - KEEP;
            lines.lines.drain(..drop);
            lines.first += drop as u64;
        }
        self.grown.notify_all();
    }

    /// Lines from sequence number `from` on, waiting up to `wait` for at least one; returns the
    /// lines and the next sequence number.
    pub fn read_from(&self, from: u64, wait: Option<Duration>) -> (Vec<String>, u64) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let end = |l: &Lines| l.first + l.lines.len() as u64;
        if let Some(wait) = wait {
            if end(&lines) <= from {
                lines = self
                    .grown
                    .wait_timeout_while(lines, wait, |l| end(l) <= from)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        let start = from.max(lines.first);
        let skip = (start - lines.first) as usize;
        let out = lines.lines.iter().skip(skip).cloned().collect();
        (out, end(&lines))
    }
}

impl slate_sequencer::Logger for Journal {
    fn log(&self, line: &str) {
        self.info(line);
    }
}
