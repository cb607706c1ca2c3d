//! What a test needs from the machine it runs on, checked in one place (dev-dependency only).
//!
//! Conformance tests drive real tools (`mksquashfs`, `cpio`, `objdump`, `grub-editenv`, ...),
//! read files Debian packages install (the systemd stub) or need root (loop devices, mounts,
//! device nodes). On a developer's machine without them such a test may skip, saying so; in CI
//! it must never pass without having run. So every such check goes through [`require`]: when the
//! environment variable `CI` is set (CI services set `CI=true`) a missing prerequisite panics,
//! failing the test; otherwise it prints a `SKIPPED` line naming the test and returns `false`,
//! and the test returns early. A failure points at the test's line (`#[track_caller]`).
//!
//! ```no_run
//! #[test]
//! fn gnu_cpio_lists_what_we_wrote() {
//!     if !slate_testkit::require_tool("cpio") {
//!         return;
//!     }
//!     // ... run cpio ...
//! }
//! ```
//!
//! `scripts/install-deps` installs every tool and file the tests require.
//!
//! [`etcd`] starts a real etcd cluster on loopback (the FleetLock etcd tests and benchmark);
//! [`prometheus`] a real Prometheus, and runs `promtool check metrics` (the metrics tests).

pub mod esp;
pub mod etcd;
pub mod fleetlock;
pub mod prometheus;
pub mod secureboot;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The remedy for a missing tool or packaged file.
pub const INSTALL_DEPS: &str = "scripts/install-deps installs it";

/// `CI`'s value when this is a CI run: set to anything but empty, `0` or `false`.
pub fn ci() -> Option<String> {
    std::env::var("CI").ok().filter(|v| is_ci_value(v))
}

fn is_ci_value(value: &str) -> bool {
    !(value.is_empty() || value == "0" || value.eq_ignore_ascii_case("false"))
}

/// Whether the test may go on: `true` when `available`. Otherwise, under `CI`, panics with
/// "CI=true: {needed} is required ({remedy})"; elsewhere prints a skip notice naming the test
/// and returns `false`.
#[must_use = "the test must return when its prerequisite is missing"]
#[track_caller]
pub fn require(available: bool, needed: &str, remedy: &str) -> bool {
    available || unavailable(ci().as_deref(), needed, remedy)
}

#[track_caller]
fn unavailable(ci: Option<&str>, needed: &str, remedy: &str) -> bool {
    if let Some(value) = ci {
        panic!("CI={value}: {needed} is required ({remedy})");
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    eprintln!("SKIPPED {test}: {needed} is not available ({remedy})");
    false
}

/// The program `tool` can be run: an executable file on `PATH`, or at `tool` when it
/// contains a `/`.
#[must_use = "the test must return when its prerequisite is missing"]
#[track_caller]
pub fn require_tool(tool: &str) -> bool {
    require(
        find_tool(tool).is_some(),
        &format!("tool {tool}"),
        INSTALL_DEPS,
    )
}

/// The test runs as root (effective uid 0).
#[must_use = "the test must return when its prerequisite is missing"]
#[track_caller]
pub fn require_root() -> bool {
    require(effective_uid() == Some(0), "root", "run the tests as root")
}

/// `path` exists: a file a package installs or a device node; `remedy` says how to get it.
#[must_use = "the test must return when its prerequisite is missing"]
#[track_caller]
pub fn require_path(path: impl AsRef<Path>, remedy: &str) -> bool {
    let path = path.as_ref();
    require(path.exists(), &path.display().to_string(), remedy)
}

/// Runs `cmd args…` and returns its stdout, trimmed; panics (a test failure) with its stderr
/// when it cannot start or exits non-zero.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Where `tool` is: searched on `PATH` like `Command::new` does, or taken as a path when it
/// contains a `/`.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    if tool.contains('/') {
        return is_executable(Path::new(tool)).then(|| PathBuf::from(tool));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(tool))
        .find(|path| is_executable(path))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The effective uid, from `/proc/self/status` (`Uid: real effective saved fs`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        for on in ["true", "TRUE", "1", "yes"] {
            assert!(is_ci_value(on), "{on}");
        }
        for off in ["", "0", "false", "False"] {
            assert!(!is_ci_value(off), "{off:?}");
        }
    }

    #[test]
    #[should_panic(
        expected = "CI=true: tool no-such-tool is required (scripts/install-deps installs it)"
    )]
    fn missing_in_ci_fails() {
        unavailable(Some("true"), "tool no-such-tool", INSTALL_DEPS);
    }

    #[test]
    fn missing_elsewhere_skips() {
        assert!(!unavailable(None, "tool no-such-tool", INSTALL_DEPS));
        assert!(require(true, "anything", "never asked"));
    }

    #[test]
    fn tools_are_found_on_path() {
        assert!(find_tool("sh").is_some());
        assert!(find_tool("/bin/sh").is_some());
        assert!(find_tool("slate-testkit-no-such-tool").is_none());
        assert!(find_tool("/nonexistent/sh").is_none());
        // A directory or a plain file is no tool.
        assert!(find_tool("/").is_none());
        assert!(find_tool("/proc/self/status").is_none());
    }

    #[test]
    fn effective_uid_is_read() {
        assert!(effective_uid().is_some());
    }
}

/// xorshift64: the same "random" sequence on every run from the same (non-zero) seed, for
/// tests that want varied but reproducible data.
#[derive(Debug, Clone)]
pub struct Xorshift(pub u64);

impl Xorshift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `len` bytes, incompressible.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}
