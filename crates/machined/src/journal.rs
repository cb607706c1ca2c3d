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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    fn journal() -> Journal {
        Journal::new(KmsgLogger::stderr("test"))
    }

    #[test]
    fn lines_are_replayed_in_order_with_the_next_sequence_number() {
        let j = journal();
        j.info("one");
        j.info(format_args!("two {}", 2));
        assert_eq!(
            j.read_from(0, None),
            (vec!["one".into(), "two 2".into()], 2)
        );
        assert_eq!(j.read_from(1, None), (vec!["two 2".into()], 2));
        // A reader that is up to date gets nothing and keeps its place.
        assert_eq!(j.read_from(2, None), (Vec::<String>::new(), 2));
    }

    #[test]
    fn errors_are_marked_in_the_journal() {
        let j = journal();
        j.error("revert failed: no META");
        slate_sequencer::Logger::log(&j, "from a task");
        assert_eq!(
            j.read_from(0, None).0,
            ["error: revert failed: no META", "from a task"]
        );
    }

    #[test]
    fn the_oldest_lines_are_dropped_beyond_the_bound() {
        let j = journal();
        for i in 0..KEEP + 10 {
            j.info(i);
        }
        let (lines, next) = j.read_from(0, None);
        assert_eq!(next, (KEEP + 10) as u64);
        assert_eq!(lines.len(), KEEP);
        // A reader that fell behind resumes at the oldest line kept.
        assert_eq!(lines.first().map(String::as_str), Some("10"));
        assert_eq!(
            lines.last().map(String::as_str),
            Some(&*(KEEP + 9).to_string())
        );
        // Sequence numbers stay absolute.
        assert_eq!(
            j.read_from(KEEP as u64 + 9, None).0,
            [(KEEP + 9).to_string()]
        );
    }

    #[test]
    fn a_follower_waits_for_the_next_line() {
        let j = Arc::new(journal());
        j.info("old");
        let writer = {
            let j = j.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                j.info("new");
            })
        };
        let (lines, next) = j.read_from(1, Some(Duration::from_secs(10)));
        writer.join().unwrap();
        assert_eq!((lines, next), (vec!["new".to_string()], 2));
    }

    #[test]
    fn a_follower_gives_up_after_its_wait() {
        let j = journal();
        j.info("only");
        let started = Instant::now();
        let (lines, next) = j.read_from(1, Some(Duration::from_millis(50)));
        assert!(lines.is_empty());
        assert_eq!(next, 1);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
