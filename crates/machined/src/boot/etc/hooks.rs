//! The image's setup hooks: executables in `/usr/lib/slate/setup.d`, run in lexical order once
//! per version on a freshly reset `/etc`, each under a timeout. The first failure fails the
//! boot; only when all succeed is the version recorded as done.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use slate_host::CommandEnd;
use slate_sequencer::CancelToken;

use super::{io_error, read_record, write_record, EtcError, HOOKS_RECORD};

/// What to run, and where its success is recorded.
#[derive(Debug, Clone, Copy)]
pub struct HookRun<'a> {
    /// The hooks' directory (absent: no hooks).
    pub dir: &'a Path,
    /// Each hook's limit; a hook still running then is killed and fails.
    pub timeout: Duration,
    /// Where `hooks.done` is written.
    pub state_etc_dir: &'a Path,
    /// The booted version, recorded in `hooks.done` and given to hooks as `SLATE_VERSION`.
    pub version: &'a str,
}

/// The hooks that ran (name, time taken) and those skipped (name, why), in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookReport {
    pub ran: Vec<(String, Duration)>,
    pub skipped: Vec<(String, &'static str)>,
}

/// Whether the setup hooks have yet to succeed for `version` on the current upper.
pub fn hooks_due(state_etc_dir: &Path, version: &str) -> Result<bool, EtcError> {
    Ok(read_record(&state_etc_dir.join(HOOKS_RECORD))?.as_deref() != Some(version))
}

/// Run the hooks of `run.dir` in lexical order of their names. Entries that are not regular
/// executable files are skipped (logged). Each hook's output lines are logged prefixed with its
/// name, and one line tells how it ended. The first failure (an exit status other than 0, a
/// signal, the timeout) stops the run with an error naming the hook, and `hooks.done` is not
/// written, so the next boot of this version runs the hooks again; after the last success it is.
pub fn run_setup_hooks(
    run: &HookRun<'_>,
    log: impl Fn(&str),
    cancel: &CancelToken,
) -> Result<HookReport, EtcError> {
    let mut report = HookReport::default();
    let entries = match fs::read_dir(run.dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            log(&format!("no setup hooks ({} is absent)", run.dir.display()));
            write_record(run.state_etc_dir, HOOKS_RECORD, run.version)?;
            return Ok(report);
        }
        Err(e) => return Err(io_error("list", run.dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        names.push(entry.map_err(io_error("list", run.dir))?.file_name());
    }
    names.sort();
    for name in names {
        let path = run.dir.join(&name);
        let name = name.to_string_lossy().into_owned();
        // Following a symlink: a link to an executable is a hook.
        let skip = match fs::metadata(&path) {
            Ok(meta) if !meta.is_file() => Some("not a regular file"),
            Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Some("not executable"),
            Ok(_) => None,
            Err(_) => Some("not readable"),
        };
        if let Some(why) = skip {
            log(&format!("setup hook {name} skipped: {why}"));
            report.skipped.push((name, why));
            continue;
        }
        if cancel.is_cancelled() {
            return Err(EtcError::Cancelled);
        }
        log(&format!("setup hook {name} started"));
        let started = Instant::now();
        match run_one(run, &path, &name, &log, cancel) {
            Ok(()) => {
                let took = started.elapsed();
                log(&format!(
                    "setup hook {name} ok ({:.1} s)",
                    took.as_secs_f64()
                ));
                report.ran.push((name, took));
            }
            Err(EtcError::Cancelled) => {
                log(&format!("setup hook {name} cancelled"));
                return Err(EtcError::Cancelled);
            }
            Err(err) => {
                log(&err.to_string());
                return Err(err);
            }
        }
    }
    write_record(run.state_etc_dir, HOOKS_RECORD, run.version)?;
    log(&format!(
        "setup hooks done for {}: {} ran, {} skipped",
        run.version,
        report.ran.len(),
        report.skipped.len()
    ));
    Ok(report)
}

/// Run one hook: `/` as working directory, stdin empty, a fixed environment.
fn run_one(
    run: &HookRun<'_>,
    path: &Path,
    name: &str,
    log: &impl Fn(&str),
    cancel: &CancelToken,
) -> Result<(), EtcError> {
    let mut command = Command::new(path);
    command
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root")
        .env("SLATE_VERSION", run.version);
    let failed = |reason: String| EtcError::HookFailed {
        name: name.to_owned(),
        reason,
    };
    let end = slate_host::run_command_logged(
        &mut command,
        run.timeout,
        &|| cancel.is_cancelled(),
        &mut |line| log(&format!("{name}: {line}")),
    )
    .map_err(|e| failed(slate_sequencer::error_chain(&e)))?;
    match end {
        CommandEnd::Exited(status) if status.success() => Ok(()),
        CommandEnd::Exited(status) => Err(failed(describe_status(status))),
        CommandEnd::TimedOut => Err(failed(format!(
            "timed out after {:.1} s (killed)",
            run.timeout.as_secs_f64()
        ))),
        CommandEnd::Cancelled => Err(EtcError::Cancelled),
    }
}

/// `exit status N`, or `killed by signal N`.
fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    struct Fixture {
        _tmp: tempfile::TempDir,
        hooks: std::path::PathBuf,
        state: std::path::PathBuf,
        /// Where the test hooks append their names.
        trace: std::path::PathBuf,
    }

    impl Fixture {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let (hooks, state) = (tmp.path().join("setup.d"), tmp.path().join("etc"));
            fs::create_dir(&hooks).unwrap();
            fs::create_dir(&state).unwrap();
            let trace = tmp.path().join("trace");
            Self {
                _tmp: tmp,
                hooks,
                state,
                trace,
            }
        }

        /// A hook that appends its name to the trace, then runs `body`.
        fn hook(&self, name: &str, mode: u32, body: &str) {
            let path = self.hooks.join(name);
            let script = format!(
                "#!/bin/sh\necho {name} >> '{}'\n{body}\n",
                self.trace.display()
            );
            fs::write(&path, script).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        }

        fn run(
            &self,
            timeout: Duration,
            cancel: &CancelToken,
        ) -> (Result<HookReport, EtcError>, Vec<String>) {
            let lines = Mutex::new(Vec::new());
            let run = HookRun {
                dir: &self.hooks,
                timeout,
                state_etc_dir: &self.state,
                version: "2.0.0",
            };
            let result =
                run_setup_hooks(&run, |l| lines.lock().unwrap().push(l.to_owned()), cancel);
            (result, lines.into_inner().unwrap())
        }

        fn trace(&self) -> Vec<String> {
            fs::read_to_string(&self.trace)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect()
        }

        fn done(&self) -> Option<String> {
            fs::read_to_string(self.state.join(HOOKS_RECORD)).ok()
        }
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn hooks_run_in_lexical_order_and_the_rest_is_skipped() {
        let f = Fixture::new();
        f.hook(
            "20-second",
            0o755,
            "echo \"out of $SLATE_VERSION\"; echo oops >&2",
        );
        f.hook("10-first", 0o755, "");
        f.hook("15-readme", 0o644, "");
        fs::create_dir(f.hooks.join("17-dir")).unwrap();
        assert!(hooks_due(&f.state, "2.0.0").unwrap());
        let (result, lines) = f.run(LONG, &CancelToken::new());
        let report = result.unwrap();
        assert_eq!(f.trace(), ["10-first", "20-second"]);
        let ran: Vec<&str> = report.ran.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(ran, ["10-first", "20-second"]);
        assert_eq!(
            report.skipped,
            [
                ("15-readme".to_owned(), "not executable"),
                ("17-dir".to_owned(), "not a regular file")
            ]
        );
        let expect_prefix = [
            "setup hook 10-first started",
            "setup hook 10-first ok (",
            "setup hook 15-readme skipped: not executable",
            "setup hook 17-dir skipped: not a regular file",
            "setup hook 20-second started",
        ];
        for (line, prefix) in lines.iter().zip(expect_prefix) {
            assert!(line.starts_with(prefix), "{line:?} vs {prefix:?}");
        }
        assert!(
            lines.contains(&"20-second: out of 2.0.0".to_owned()),
            "{lines:?}"
        );
        assert!(lines.contains(&"20-second: oops".to_owned()), "{lines:?}");
        assert!(lines[lines.len() - 2].starts_with("setup hook 20-second ok ("));
        assert!(lines[lines.len() - 2].ends_with(" s)"));
        assert_eq!(
            lines.last().unwrap(),
            "setup hooks done for 2.0.0: 2 ran, 2 skipped"
        );
        assert_eq!(f.done().as_deref(), Some("2.0.0\n"));
        assert!(!hooks_due(&f.state, "2.0.0").unwrap());
        assert!(hooks_due(&f.state, "3.0.0").unwrap());
    }

    #[test]
    fn the_first_failure_stops_the_run_names_the_hook_and_records_nothing() {
        let f = Fixture::new();
        f.hook("10-ok", 0o755, "");
        f.hook("20-bad", 0o755, "echo broken; exit 3");
        f.hook("30-never", 0o755, "");
        let (result, lines) = f.run(LONG, &CancelToken::new());
        let err = result.unwrap_err();
        assert_eq!(err.to_string(), "setup hook 20-bad failed: exit status 3");
        assert_eq!(f.trace(), ["10-ok", "20-bad"]);
        assert!(lines.contains(&"20-bad: broken".to_owned()), "{lines:?}");
        assert_eq!(
            lines.last().unwrap(),
            "setup hook 20-bad failed: exit status 3"
        );
        assert_eq!(f.done(), None);
        assert!(hooks_due(&f.state, "2.0.0").unwrap());
    }

    #[test]
    fn a_hook_past_its_timeout_is_killed_and_fails() {
        let f = Fixture::new();
        f.hook("10-slow", 0o755, "echo waiting; sleep 30");
        f.hook("20-never", 0o755, "");
        let started = Instant::now();
        let (result, lines) = f.run(Duration::from_millis(300), &CancelToken::new());
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(
            result.unwrap_err().to_string(),
            "setup hook 10-slow failed: timed out after 0.3 s (killed)"
        );
        assert!(lines.contains(&"10-slow: waiting".to_owned()), "{lines:?}");
        assert_eq!(f.trace(), ["10-slow"]);
        assert_eq!(f.done(), None);
    }

    #[test]
    fn a_hook_killed_by_a_signal_fails() {
        let f = Fixture::new();
        f.hook("10-dies", 0o755, "kill -9 $$");
        let (result, _) = f.run(LONG, &CancelToken::new());
        assert_eq!(
            result.unwrap_err().to_string(),
            "setup hook 10-dies failed: killed by signal 9"
        );
    }

    #[test]
    fn cancelling_stops_a_running_hook() {
        let f = Fixture::new();
        f.hook("10-slow", 0o755, "sleep 30");
        let cancel = CancelToken::new();
        let canceller = {
            let cancel = cancel.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                cancel.cancel();
            })
        };
        let started = Instant::now();
        let (result, _) = f.run(LONG, &cancel);
        canceller.join().unwrap();
        assert!(matches!(result, Err(EtcError::Cancelled)), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(f.done(), None);
    }

    #[test]
    fn no_hooks_directory_means_nothing_to_run() {
        let f = Fixture::new();
        fs::remove_dir(&f.hooks).unwrap();
        let (result, lines) = f.run(LONG, &CancelToken::new());
        assert_eq!(result.unwrap(), HookReport::default());
        assert!(lines[0].starts_with("no setup hooks ("), "{lines:?}");
        assert_eq!(f.done().as_deref(), Some("2.0.0\n"));
    }
}
