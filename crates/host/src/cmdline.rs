//! The kernel command line: reading it, and finding `key=value` parameters in it.

use std::path::Path;
use std::time::Duration;

use crate::error::{HostError, Result};

const PROC_CMDLINE: &str = "/proc/cmdline";

/// The kernel command line, from `/proc/cmdline` (so `/proc` must be mounted), trimmed.
pub fn kernel_cmdline() -> Result<String> {
    std::fs::read_to_string(PROC_CMDLINE)
        .map(|s| s.trim().to_string())
        .map_err(|source| HostError::Read {
            path: Path::new(PROC_CMDLINE).to_path_buf(),
            source,
        })
}

/// The value of parameter `key` on a kernel command line, read the way the kernel reads it.
///
/// - Parameters are separated by whitespace; double quotes protect whitespace, either around
///   the value (`key="a b"`) or around the whole parameter (`"key=a b"`), and are removed.
/// - `-` and `_` are the same character in names, as in the kernel (`panic_on_oops`).
/// - The last occurrence wins, as for the kernel's own `init=` and `panic=`.
/// - A bare `key` (no `=`) yields `Some("")`: present, without a value.
/// - Parsing stops at a lone `--`: what follows belongs to init, not to the kernel.
pub fn cmdline_value<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    let mut found = None;
    for token in tokens(cmdline) {
        if token == "--" {
            break;
        }
        let token = unquote(token);
        let (name, value) = token.split_once('=').unwrap_or((token, ""));
        if names_equal(name, key) {
            found = Some(unquote(value));
        }
    }
    found
}

/// What to do after a failure that stops the boot, as the kernel's `panic=` says it for a
/// kernel panic: slate's init and machined follow the same parameter for their own fatal
/// errors, so one setting governs every way a boot can end badly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// `panic=0`: stay halted, to be inspected (the watchdog, if armed, still resets).
    Halt,
    /// Reboot after this long (`panic=N`, N seconds; `panic=-N`, at once), so that the
    /// firmware's boot counting can pick a fallback.
    Reboot(Duration),
}

/// [`AfterFailure`] from `panic=` on `cmdline` (the last one, as the kernel reads it);
/// `default` when there is none or its value is not a whole number.
pub fn after_failure(cmdline: &str, default: Duration) -> AfterFailure {
    match cmdline_value(cmdline, "panic").map(str::parse::<i64>) {
        Some(Ok(0)) => AfterFailure::Halt,
        Some(Ok(seconds)) if seconds < 0 => AfterFailure::Reboot(Duration::ZERO),
        Some(Ok(seconds)) => AfterFailure::Reboot(Duration::from_secs(seconds.unsigned_abs())),
        _ => AfterFailure::Reboot(default),
    }
}

/// Splits at whitespace outside double quotes.
fn tokens(cmdline: &str) -> impl Iterator<Item = &str> {
    let mut rest = cmdline;
    std::iter::from_fn(move || {
        rest = rest.trim_start();
        if rest.is_empty() {
            return None;
        }
        let mut in_quotes = false;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                if c == '"' {
                    in_quotes = !in_quotes;
                }
                c.is_whitespace() && !in_quotes
            })
            .map_or(rest.len(), |(i, _)| i);
        let (token, tail) = rest.split_at(end);
        rest = tail;
        Some(token)
    })
}

/// Removes one leading quote and, if present, the matching trailing one.
fn unquote(s: &str) -> &str {
    match s.strip_prefix('"') {
        Some(inner) => inner.strip_suffix('"').unwrap_or(inner),
        None => s,
    }
}

fn names_equal(a: &str, b: &str) -> bool {
    let norm = |c: char| if c == '-' { '_' } else { c };
    a.len() == b.len() && a.chars().map(norm).eq(b.chars().map(norm))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "BOOT_IMAGE=/vmlinuz console=ttyS0 quiet panic=10 slate.init=/sbin/init";

    #[test]
    fn finds_plain_values() {
        assert_eq!(cmdline_value(LINE, "console"), Some("ttyS0"));
        assert_eq!(cmdline_value(LINE, "panic"), Some("10"));
        assert_eq!(cmdline_value(LINE, "slate.init"), Some("/sbin/init"));
        assert_eq!(cmdline_value(LINE, "BOOT_IMAGE"), Some("/vmlinuz"));
    }

    #[test]
    fn absent_keys_and_prefixes_do_not_match() {
        assert_eq!(cmdline_value(LINE, "init"), None);
        assert_eq!(cmdline_value(LINE, "slate"), None);
        assert_eq!(cmdline_value(LINE, "pani"), None);
        assert_eq!(cmdline_value("", "panic"), None);
        assert_eq!(cmdline_value("   ", "panic"), None);
    }

    #[test]
    fn bare_flags_are_present_without_value() {
        assert_eq!(cmdline_value(LINE, "quiet"), Some(""));
        assert_eq!(cmdline_value("ro rw", "rw"), Some(""));
    }

    #[test]
    fn last_occurrence_wins() {
        assert_eq!(cmdline_value("panic=1 panic=0", "panic"), Some("0"));
        assert_eq!(
            cmdline_value("console=tty0 console=ttyS0,115200", "console"),
            Some("ttyS0,115200")
        );
    }

    #[test]
    fn values_may_contain_equals_signs() {
        assert_eq!(
            cmdline_value("root=PARTUUID=abcd", "root"),
            Some("PARTUUID=abcd")
        );
    }

    #[test]
    fn quotes_protect_whitespace_and_are_removed() {
        let line = "a=1 slate.init=\"/bin/sh -x\" \"b=two words\" c=\"unterminated";
        assert_eq!(cmdline_value(line, "slate.init"), Some("/bin/sh -x"));
        assert_eq!(cmdline_value(line, "b"), Some("two words"));
        assert_eq!(cmdline_value(line, "a"), Some("1"));
        assert_eq!(cmdline_value(line, "c"), Some("unterminated"));
    }

    #[test]
    fn dashes_and_underscores_are_the_same() {
        assert_eq!(cmdline_value("panic_on_oops=1", "panic-on-oops"), Some("1"));
        assert_eq!(cmdline_value("slate-init=/x", "slate_init"), Some("/x"));
    }

    #[test]
    fn parameters_after_double_dash_belong_to_init() {
        assert_eq!(
            cmdline_value("panic=5 -- panic=0 single", "panic"),
            Some("5")
        );
        assert_eq!(cmdline_value("quiet -- single", "single"), None);
    }

    #[test]
    fn any_whitespace_separates() {
        assert_eq!(cmdline_value("a=1\tb=2\nc=3\n", "c"), Some("3"));
        assert_eq!(cmdline_value("a=1\tb=2\nc=3\n", "b"), Some("2"));
    }

    #[test]
    fn after_failure_follows_panic_as_the_kernel_does() {
        let default = Duration::from_secs(10);
        let after = |cmdline| after_failure(cmdline, default);
        assert_eq!(after("console=ttyS0 panic=0"), AfterFailure::Halt);
        assert_eq!(
            after("panic=3"),
            AfterFailure::Reboot(Duration::from_secs(3))
        );
        assert_eq!(after("panic=-1"), AfterFailure::Reboot(Duration::ZERO));
        // The last one counts; a value that is not a number, or none, leaves the default.
        assert_eq!(
            after("panic=0 panic=5"),
            AfterFailure::Reboot(Duration::from_secs(5))
        );
        assert_eq!(after("panic=10 panic=0"), AfterFailure::Halt);
        assert_eq!(after("panic=soon"), AfterFailure::Reboot(default));
        assert_eq!(after("panic"), AfterFailure::Reboot(default));
        assert_eq!(after("quiet"), AfterFailure::Reboot(default));
        // After `--`, parameters are init's, not the kernel's.
        assert_eq!(after("quiet -- panic=0"), AfterFailure::Reboot(default));
    }
}
