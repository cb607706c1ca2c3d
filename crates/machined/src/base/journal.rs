//! machined's own log: every line goes to the kernel log (the console) and into an in-memory
//! journal that the API can replay and follow.
//!
//! The journal is bounded in bytes, not only in lines (issue 19: 2,123 lines of 400 KB each,
//! under a 5,000-line cap, ran the node out of memory): a line is cut to [`MAX_LINE`] bytes
//! as it is formatted (a longer one is never built whole), its control characters escaped so
//! that no text drives the console, and the ring keeps at most [`KEEP`] lines and
//! [`KEEP_BYTES`] bytes, dropping the oldest.

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use slate_host::KmsgLogger;

/// Lines kept for late readers; older ones are dropped.
const KEEP: usize = 5000;
/// Bytes of lines kept for late readers; older lines are dropped.
pub const KEEP_BYTES: usize = 1 << 20;
/// The longest line, in bytes: longer ones are cut, with a marker naming their length.
pub const MAX_LINE: usize = 4096;

#[derive(Debug)]
struct Lines {
    /// Sequence number of `lines[0]`.
    first: u64,
    lines: VecDeque<String>,
    /// The bytes of `lines`.
    bytes: usize,
}

/// An append-only, bounded log with followers.
#[derive(Debug)]
pub struct Journal {
    kmsg: KmsgLogger,
    lines: Mutex<Lines>,
    grown: Condvar,
    /// The boot's milestones and the sequencer's spans (`slate status --boot-times`).
    pub boot: crate::base::boot_times::BootRecord,
    /// What `/metrics` counts: sequences, the last upgrade's phases, health, watchdog.
    pub counters: crate::base::metrics::Counters,
}

impl Journal {
    /// The bytes of the lines kept for late readers (at most [`KEEP_BYTES`]).
    pub fn held_bytes(&self) -> usize {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// One more of each (family, outcome) of the outcome counters ([`Counters::count`]); a
    /// count that could not be kept across boots is logged.
    ///
    /// [`Counters::count`]: crate::base::metrics::Counters::count
    pub fn count(&self, counted: &[(&str, &str)]) {
        self.not_kept(self.counters.count(counted));
    }

    /// Logs a count that could not be written to STATE (it stays in memory and goes with the
    /// next one).
    pub fn not_kept(&self, kept: Result<bool, String>) {
        if let Err(err) = kept {
            self.error(format_args!(
                "a counter for /metrics is not kept across boots: {err}"
            ));
        }
    }

    /// Lines dropped from the kept tail since machined started (the oldest, past the bound).
    pub fn dropped(&self) -> u64 {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).first
    }
}

/// Formats into at most [`MAX_LINE`] bytes, escaping control characters (but newlines, which
/// the kernel log splits on, and tabs), and counts what it did not keep.
struct Bounded {
    line: String,
    total: usize,
    cut: bool,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.total += s.len();
        if self.cut {
            return Ok(());
        }
        for c in s.chars() {
            let before = self.line.len();
            if c.is_control() && c != '\n' && c != '\t' {
                let _ = write!(self.line, "{}", c.escape_unicode());
            } else {
                self.line.push(c);
            }
            if self.line.len() > MAX_LINE {
                self.line.truncate(before);
                self.cut = true;
                break;
            }
        }
        Ok(())
    }
}

/// `line` formatted, escaped and cut to [`MAX_LINE`] bytes (plus the marker of a cut line).
fn bounded(line: impl fmt::Display) -> String {
    let mut out = Bounded {
        line: String::new(),
        total: 0,
        cut: false,
    };
    let _ = write!(out, "{line}");
    if out.cut {
        let _ = write!(out.line, "…(cut: {} bytes)", out.total);
    }
    out.line
}

impl Journal {
    pub fn new(kmsg: KmsgLogger) -> Self {
        Self {
            kmsg,
            lines: Mutex::new(Lines {
                first: 0,
                lines: VecDeque::new(),
                bytes: 0,
            }),
            grown: Condvar::new(),
            boot: crate::base::boot_times::BootRecord::default(),
            counters: crate::base::metrics::Counters::default(),
        }
    }

    pub fn info(&self, line: impl fmt::Display) {
        let line = bounded(line);
        self.kmsg.info(&line);
        self.push(line);
    }

    /// A line a service printed: kept for `slate logs` (bounded as every line), never sent to
    /// the kernel log, so a chatty program neither floods the console nor costs kmsg's lock.
    pub fn program_output(&self, line: impl fmt::Display) {
        self.push(bounded(line));
    }

    pub fn error(&self, line: impl fmt::Display) {
        let line = bounded(line);
        self.kmsg.error(&line);
        self.push(format!("error: {line}"));
    }

    fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.bytes += line.len();
        lines.lines.push_back(line);
        while lines.lines.len() > KEEP || (lines.bytes > KEEP_BYTES && lines.lines.len() > 1) {
            if let Some(old) = lines.lines.pop_front() {
                lines.bytes -= old.len();
                lines.first += 1;
            }
        }
        self.grown.notify_all();
    }

    /// Lines from sequence number `from` on, waiting up to `wait` for at least one; returns the
    /// lines and the next sequence number. (Tests read everything; the API reads in batches.)
    #[cfg(test)]
    pub fn read_from(&self, from: u64, wait: Option<Duration>) -> (Vec<String>, u64) {
        self.read_some(from, wait, usize::MAX)
    }

    /// [`Journal::read_from`], at most `max` lines at a time (a reader of the API holds no
    /// more than that copied out of the ring); the next sequence number follows the last line
    /// returned.
    pub fn read_some(&self, from: u64, wait: Option<Duration>, max: usize) -> (Vec<String>, u64) {
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
        let out: Vec<String> = lines.lines.iter().skip(skip).take(max).cloned().collect();
        let next = if out.len() == max {
            start + max as u64
        } else {
            end(&lines)
        };
        (out, next)
    }
}

impl slate_sequencer::Logger for Journal {
    fn log(&self, line: &str) {
        self.info(line);
    }

    fn span(&self, span: &slate_sequencer::Span) {
        self.boot.span(span);
        self.counters.span(span);
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

    /// issue 19: 2,123 lines of 400 KB (a reader's methods) under the 5,000-line cap took the
    /// node out of memory. Past that point the journal holds at most its byte bound, each
    /// line cut with its length named, and nothing of a cut line was ever built whole.
    #[test]
    fn a_flood_of_huge_lines_stays_within_the_byte_bound() {
        /// 400 KB of method, written in pieces as `format_args!` would.
        struct Method;
        impl fmt::Display for Method {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for _ in 0..100 {
                    f.write_str(&"A".repeat(4000))?;
                }
                Ok(())
            }
        }
        let j = journal();
        for i in 0..2200 {
            j.info(format_args!(
                "api: 10.0.2.2:4711 (reader) {Method} /nope -> 404 #{i}"
            ));
        }
        let (lines, next) = j.read_from(0, None);
        assert_eq!(next, 2200);
        let bytes: usize = lines.iter().map(String::len).sum();
        assert!(bytes <= KEEP_BYTES, "{bytes} bytes kept");
        assert!(
            lines.len() >= KEEP_BYTES / (MAX_LINE + 32) - 1,
            "{}",
            lines.len()
        );
        for line in &lines {
            assert!(line.len() <= MAX_LINE + 32, "{}", line.len());
            // 400,043 bytes and the line's number.
            let tail = &line[line.len() - 22..];
            assert!(
                tail.contains("…(cut: 40004") && tail.ends_with(" bytes)"),
                "{tail}"
            );
        }
        // The newest line is kept, cut; old lines went first.
        assert!(j.read_from(2199, None).0[0].starts_with("api: 10.0.2.2:4711 (reader) AAAA"));
    }

    #[test]
    fn control_characters_are_escaped_and_a_reader_takes_a_bounded_batch() {
        let j = journal();
        j.info("a\x1b[2Jb\rc\td\u{7}");
        assert_eq!(j.read_from(0, None).0, ["a\\u{1b}[2Jb\\u{d}c\td\\u{7}"]);
        for i in 1..10 {
            j.info(i);
        }
        assert_eq!(
            j.read_some(0, None, 4),
            (
                vec![
                    j.read_from(0, None).0[0].clone(),
                    "1".into(),
                    "2".into(),
                    "3".into()
                ],
                4
            )
        );
        assert_eq!(j.read_some(8, None, 4), (vec!["8".into(), "9".into()], 10));
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
