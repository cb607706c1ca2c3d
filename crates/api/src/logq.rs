//! The server's log, off the request path: lines go through a bounded queue to a thread of
//! their own, which hands them to the site (machined: its journal, which prints to the
//! console). A console at 115200 baud prints about 11 KB/s; logging on the executor stalled
//! every request behind it (issue 19). A full queue drops lines and counts them rather than
//! wait. Text a client chose (method, path) is escaped and cut by [`for_log`] first.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

/// Lines waiting for the logging thread; more are dropped (and counted).
pub const LOG_QUEUE: usize = 256;
/// The longest line the server logs, in bytes (before the site's own prefix).
pub const MAX_LOG_LINE: usize = 1024;
/// The most of one client-chosen field (method, path) a log line or an error message repeats.
pub const MAX_LOGGED_FIELD: usize = 256;

/// The sending side of the server's log. Cheap to clone.
#[derive(Clone)]
pub(crate) struct LogQueue {
    tx: SyncSender<String>,
    dropped: Arc<AtomicU64>,
    /// Every line ever dropped (the server's metrics).
    total: slate_metrics::IntCounter,
}

impl LogQueue {
    /// Starts the logging thread; it ends when every `LogQueue` of this server is dropped.
    /// `log` is the site's `log_api`, called on that thread one line at a time.
    pub(crate) fn start(
        log: Arc<dyn Fn(&str) + Send + Sync>,
        total: slate_metrics::IntCounter,
    ) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<String>(LOG_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        std::thread::Builder::new()
            .name("slate-api-log".into())
            .spawn(move || {
                for line in rx {
                    log(&line);
                    let lost = counted.swap(0, Ordering::Relaxed);
                    if lost > 0 {
                        log(&format!(
                            "api: {lost} log lines dropped: the log could not keep up"
                        ));
                    }
                }
            })?;
        Ok(LogQueue { tx, dropped, total })
    }

    /// Queues `line` (cut to [`MAX_LOG_LINE`]); never waits.
    pub(crate) fn push(&self, line: String) {
        let line = if line.len() > MAX_LOG_LINE {
            for_log(&line, MAX_LOG_LINE)
        } else {
            line
        };
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.total.inc();
            }
            // The logging thread is gone (it panicked in the site): nothing to log to.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// `text` as it may appear in a log line or an answer: every byte that is not printable ASCII
/// escaped (a client's control characters must not drive the console, nor a newline forge a
/// line), at most `max` bytes of it, and when cut a marker with the original length:
/// `AAAA…(400000 bytes)`.
pub(crate) fn for_log(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 24);
    for c in text.chars() {
        let before = out.len();
        if c == ' ' || c.is_ascii_graphic() {
            out.push(c);
        } else {
            let _ = write!(out, "{}", c.escape_default());
        }
        if out.len() > max {
            out.truncate(before);
            let _ = write!(out, "…({} bytes)", text.len());
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn client_text_is_escaped_and_cut_with_its_length() {
        assert_eq!(for_log("/v1/status", 256), "/v1/status");
        assert_eq!(
            for_log("a\nb\x1b[2Jc\u{202e}", 256),
            "a\\nb\\u{1b}[2Jc\\u{202e}"
        );
        let long = "A".repeat(400_000);
        let cut = for_log(&long, 256);
        assert!(cut.len() <= 256 + "…(400000 bytes)".len(), "{}", cut.len());
        assert!(cut.ends_with("AAA…(400000 bytes)"), "{cut}");
        // An escape is never split by the cut.
        let cut = for_log(&"\n".repeat(1000), 9);
        assert_eq!(cut, "\\n\\n\\n\\n…(1000 bytes)");
    }

    struct Slow(Mutex<Vec<String>>);

    #[test]
    fn a_slow_log_never_holds_the_caller_and_counts_what_it_dropped() {
        // A log as slow as a serial console.
        let site = Arc::new(Slow(Mutex::default()));
        let slow = site.clone();
        let total = slate_metrics::IntCounter::new("slate_test_total", "Dropped.").unwrap();
        let log = LogQueue::start(
            Arc::new(move |message: &str| {
                std::thread::sleep(Duration::from_millis(5));
                slow.0.lock().unwrap().push(message.to_owned());
            }),
            total.clone(),
        )
        .unwrap();
        let started = Instant::now();
        for i in 0..LOG_QUEUE * 4 {
            log.push(format!("line {i} {}", "x".repeat(10 * MAX_LOG_LINE)));
        }
        assert!(started.elapsed() < Duration::from_secs(1), "pushing waited");
        assert!(total.get() > 0, "the metric counts what was dropped");
        drop(log);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !site.0.lock().unwrap().iter().any(|l| l.contains("dropped")) {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(50));
        }
        let lines = site.0.lock().unwrap().clone();
        assert!(lines.len() <= LOG_QUEUE + 2, "{}", lines.len());
        assert!(lines.iter().all(|l| l.len() <= MAX_LOG_LINE + 20));
    }
}
