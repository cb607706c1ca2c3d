//! Logging to the kernel ring buffer (`/dev/kmsg`), the one log that exists before any
//! userspace logger does and that the serial console shows during boot.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;

use crate::error::{HostError, Result};

const KMSG: &str = "/dev/kmsg";
const DEVKMSG_SYSCTL: &str = "/proc/sys/kernel/printk_devkmsg";

/// Severity of a log line; the kernel's syslog levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error = 3,
    Warning = 4,
    /// Boot progress is logged at "notice" rather than "info": the default console log level
    /// (and `loglevel=6`) still shows it on the serial console, where an operator of a machine
    /// that never comes up can read it.
    Info = 5,
}

/// Writes lines `[slate] [ROLE] message` to `/dev/kmsg`, or to stderr when the kernel log
/// cannot be opened (no devtmpfs yet, or not running on a real boot).
#[derive(Debug)]
pub struct KmsgLogger {
    role: String,
    kmsg: Option<File>,
}

impl KmsgLogger {
    /// Opens `/dev/kmsg` for `role` (`initramfs`, `machined`, ...); falls back to stderr.
    pub fn open(role: &str) -> Self {
        // Write-only and close-on-exec (std's default): the program we exec must not inherit it.
        let kmsg = OpenOptions::new().write(true).open(KMSG).ok();
        Self {
            role: role.to_string(),
            kmsg,
        }
    }

    /// A logger that only writes to stderr: for tests and for running outside a boot.
    pub fn stderr(role: &str) -> Self {
        Self {
            role: role.to_string(),
            kmsg: None,
        }
    }

    /// Whether lines reach the kernel log (as opposed to stderr).
    pub fn is_kmsg(&self) -> bool {
        self.kmsg.is_some()
    }

    pub fn info(&self, message: impl fmt::Display) {
        self.log(Level::Info, message);
    }

    pub fn warn(&self, message: impl fmt::Display) {
        self.log(Level::Warning, message);
    }

    pub fn error(&self, message: impl fmt::Display) {
        self.log(Level::Error, message);
    }

    /// Logs `message`, one kernel log record per line (a record with embedded newlines would
    /// print as one garbled line).
    pub fn log(&self, level: Level, message: impl fmt::Display) {
        let text = message.to_string();
        for line in text.lines() {
            let line = format!("[slate] [{}] {line}", self.role);
            let written = self.kmsg.as_ref().is_some_and(|mut kmsg| {
                // One write(2) is one record; the `<N>` prefix sets its level and is consumed.
                kmsg.write(format!("<{}>{line}\n", level as u8).as_bytes())
                    .is_ok()
            });
            if !written {
                eprintln!("{line}");
            }
        }
    }
}

/// Lifts the kernel's rate limit on `/dev/kmsg` writes (by default 10 lines per 5 s from
/// userspace, which would drop most of a boot's progress lines). Needs `/proc`.
pub fn disable_kmsg_ratelimit() -> Result<()> {
    std::fs::write(DEVKMSG_SYSCTL, "on\n").map_err(|source| HostError::Write {
        path: Path::new(DEVKMSG_SYSCTL).to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_logger_does_not_touch_kmsg() {
        let log = KmsgLogger::stderr("test");
        assert!(!log.is_kmsg());
        log.info("a line\nand another");
    }
}
