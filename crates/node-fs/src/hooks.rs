//! The setup hooks: executables run in file-name order once per version on a freshly reset
//! `/etc`, each under a timeout — the image's own (`/usr/lib/slate/setup.d`) and the user's
//! (`/var/lib/slate/etc-setup-hooks`, on /var so they outlive every reset). The whole run is
//! planned before the first hook starts: a user's directory or entry that leads out of /var
//! refuses the run, none started. The first failure stops the run; only when all succeed is
//! the version recorded as done.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use slate_host::CommandEnd;
use slate_sequencer::CancelToken;

use crate::etc::{io_error, read_record, write_record, EtcError, HOOKS_RECORD};

/// One directory of hooks.
#[derive(Debug, Clone, Copy)]
pub struct HookDir<'a> {
    /// The directory (absent: no hooks from it).
    pub path: &'a Path,
    /// When set, the directory and every entry must resolve (symlinks followed) inside it.
    pub confine: Option<&'a Path>,
    /// Prefixed to its hooks' names in the log (`""` for the image's, `etc-setup-hooks/` for
    /// the user's).
    pub label: &'a str,
}

impl<'a> HookDir<'a> {
    /// The image's hooks, `/usr/lib/slate/setup.d`: part of the signed image, symlinks followed.
    pub fn image(path: &'a Path) -> Self {
        Self {
            path,
            confine: None,
            label: "",
        }
    }

    /// The user's hooks, `/var/lib/slate/etc-setup-hooks`, confined to /var.
    pub fn user(path: &'a Path, confine: &'a Path) -> Self {
        Self {
            path,
            confine: Some(confine),
            label: "etc-setup-hooks/",
        }
    }
}

/// What to run, and where its success is recorded.
#[derive(Debug, Clone, Copy)]
pub struct HookRun<'a> {
    /// The hooks' directories, in the order that breaks a tie between equal file names.
    pub dirs: &'a [HookDir<'a>],
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

/// An entry of a hook directory, as planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The entry's file name.
    pub name: String,
    /// Its directory's index in [`HookRun::dirs`].
    pub dir: usize,
    /// What runs (a user's symlink resolved).
    pub path: PathBuf,
    /// Why it is skipped, when it is.
    pub skip: Option<&'static str>,
}

/// The run's order: by file name (bytes), and between equal names by directory — the image's
/// hook before the user's of the same name. Pure.
pub fn order(mut found: Vec<Found>) -> Vec<Found> {
    found.sort_by(|a, b| (a.name.as_bytes(), a.dir).cmp(&(b.name.as_bytes(), b.dir)));
    found
}

/// Whether the setup hooks have yet to succeed for `version` on the current upper.
pub fn hooks_due(state_etc_dir: &Path, version: &str) -> Result<bool, EtcError> {
    Ok(read_record(&state_etc_dir.join(HOOKS_RECORD))?.as_deref() != Some(version))
}

/// `path` with every symlink resolved, which must lie inside `confine` (itself resolved).
/// A dangling link is refused as well: nothing it names can be checked.
fn confined(path: &Path, confine: &Path) -> Result<PathBuf, EtcError> {
    let outside = |resolved: PathBuf| EtcError::HookOutside {
        path: path.to_path_buf(),
        resolved,
        confine: confine.to_path_buf(),
    };
    let confine_real = fs::canonicalize(confine).map_err(io_error("resolve", confine))?;
    match fs::canonicalize(path) {
        Ok(real) if real.starts_with(&confine_real) => Ok(real),
        Ok(real) => Err(outside(real)),
        Err(_) => Err(outside(fs::read_link(path).unwrap_or_default())),
    }
}

/// Every entry of `run`'s directories in run order, each judged; an error (none run) when a
/// confined directory or entry leads outside.
pub fn plan(run: &HookRun<'_>) -> Result<Vec<Found>, EtcError> {
    let mut found = Vec::new();
    for (index, dir) in run.dirs.iter().enumerate() {
        let listed = match fs::symlink_metadata(dir.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("inspect", dir.path)(e)),
            Ok(_) => match dir.confine {
                Some(confine) => confined(dir.path, confine)?,
                None => dir.path.to_path_buf(),
            },
        };
        let entries = fs::read_dir(&listed).map_err(io_error("list", dir.path))?;
        for entry in entries {
            let name = entry.map_err(io_error("list", dir.path))?.file_name();
            let link = dir.path.join(&name);
            let path = match dir.confine {
                Some(confine) => confined(&link, confine)?,
                None => link,
            };
            // Following a symlink: a link to an executable is a hook.
            let skip = match fs::metadata(&path) {
                Ok(meta) if !meta.is_file() => Some("not a regular file"),
                Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Some("not executable"),
                Ok(_) => None,
                Err(_) => Some("not readable"),
            };
            found.push(Found {
                name: name.to_string_lossy().into_owned(),
                dir: index,
                path,
                skip,
            });
        }
    }
    Ok(order(found))
}

/// Run the hooks of `run.dirs` in [`order`]. Entries that are not regular executable files are
/// skipped (logged). Each hook's output lines are logged prefixed with its name, and one line
/// tells how it ended. The first failure (an exit status other than 0, a signal, the timeout)
/// stops the run with an error naming the hook, and `hooks.done` is not written, so the next
/// boot of this version resets /etc again and runs the hooks again; after the last success it
/// is.
pub fn run_setup_hooks(
    run: &HookRun<'_>,
    log: impl Fn(&str),
    cancel: &CancelToken,
) -> Result<HookReport, EtcError> {
    let mut report = HookReport::default();
    let planned = match plan(run) {
        Ok(planned) => planned,
        Err(err) => {
            log(&err.to_string());
            return Err(err);
        }
    };
    if planned.is_empty() {
        let dirs: Vec<String> = run
            .dirs
            .iter()
            .map(|d| d.path.display().to_string())
            .collect();
        log(&format!("no setup hooks (in {})", dirs.join(", ")));
    }
    for hook in planned {
        let name = format!("{}{}", run.dirs[hook.dir].label, hook.name);
        if let Some(why) = hook.skip {
            log(&format!("setup hook {name} skipped: {why}"));
            report.skipped.push((name, why));
            continue;
        }
        if cancel.is_cancelled() {
            return Err(EtcError::Cancelled);
        }
        log(&format!("setup hook {name} started"));
        let started = Instant::now();
        match run_one(run, &hook.path, &name, &log, cancel) {
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
        hooks: PathBuf,
        state: PathBuf,
        /// Where the test hooks append their names.
        trace: PathBuf,
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
            let dirs = [HookDir::image(&self.hooks)];
            let run = HookRun {
                dirs: &dirs,
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
        assert!(lines[0].starts_with("no setup hooks (in "), "{lines:?}");
        assert_eq!(f.done().as_deref(), Some("2.0.0\n"));
    }
}

/// The image's and the user's directories together: order, ties, and what leads out of /var.
#[cfg(test)]
mod user_tests {
    use std::os::unix::fs::symlink;
    use std::sync::Mutex;

    use super::*;

    struct Tree {
        _tmp: tempfile::TempDir,
        image: PathBuf,
        var: PathBuf,
        user: PathBuf,
        state: PathBuf,
        outside: PathBuf,
        trace: PathBuf,
    }

    impl Tree {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().to_path_buf();
            let image = root.join("usr/lib/slate/setup.d");
            let var = root.join("var");
            let user = var.join("lib/slate/etc-setup-hooks");
            let (state, outside) = (root.join("state"), root.join("outside"));
            for dir in [&image, &user, &state, &outside] {
                fs::create_dir_all(dir).unwrap();
            }
            let trace = root.join("trace");
            Self {
                _tmp: tmp,
                image,
                var,
                user,
                state,
                outside,
                trace,
            }
        }

        fn hook(&self, dir: &Path, name: &str, mode: u32, body: &str) {
            let path = dir.join(name);
            let tag = dir.file_name().unwrap().to_string_lossy();
            let script = format!(
                "#!/bin/sh\necho {tag}/{name} >> '{}'\n{body}\n",
                self.trace.display()
            );
            fs::write(&path, script).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        }

        fn run(&self) -> (Result<HookReport, EtcError>, Vec<String>) {
            let dirs = [
                HookDir::image(&self.image),
                HookDir::user(&self.user, &self.var),
            ];
            let run = HookRun {
                dirs: &dirs,
                timeout: Duration::from_secs(30),
                state_etc_dir: &self.state,
                version: "2.0.0",
            };
            let lines = Mutex::new(Vec::new());
            let result = run_setup_hooks(
                &run,
                |l| lines.lock().unwrap().push(l.to_owned()),
                &CancelToken::new(),
            );
            (result, lines.into_inner().unwrap())
        }

        fn trace(&self) -> Vec<String> {
            fs::read_to_string(&self.trace)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    fn found(name: &str, dir: usize) -> Found {
        Found {
            name: name.to_owned(),
            dir,
            path: PathBuf::from(name),
            skip: None,
        }
    }

    #[test]
    fn order_is_by_name_then_the_images_hook_first() {
        let ordered = order(vec![
            found("20-b", 1),
            found("10-a", 1),
            found("10-a", 0),
            found("05-z", 1),
            found("Z", 0),
        ]);
        let seen: Vec<(&str, usize)> = ordered.iter().map(|f| (f.name.as_str(), f.dir)).collect();
        // Byte order: digits before upper case.
        assert_eq!(
            seen,
            [("05-z", 1), ("10-a", 0), ("10-a", 1), ("20-b", 1), ("Z", 0)]
        );
    }

    #[test]
    fn both_directories_run_merged_by_name_and_non_executables_are_skipped() {
        let t = Tree::new();
        t.hook(&t.image, "10-image", 0o755, "");
        t.hook(&t.user, "05-user", 0o755, "echo from the user");
        t.hook(&t.user, "10-image", 0o755, "");
        t.hook(&t.user, "30-notes", 0o644, "");
        // A link inside /var to an executable inside /var is a hook.
        t.hook(&t.var, "real", 0o755, "");
        symlink(t.var.join("real"), t.user.join("40-link")).unwrap();
        let (result, lines) = t.run();
        let report = result.unwrap();
        assert_eq!(
            t.trace(),
            [
                "etc-setup-hooks/05-user",
                "setup.d/10-image",
                "etc-setup-hooks/10-image",
                "var/real"
            ]
        );
        assert_eq!(
            report.skipped,
            [("etc-setup-hooks/30-notes".to_owned(), "not executable")]
        );
        assert!(lines.contains(&"etc-setup-hooks/05-user: from the user".to_owned()));
        assert!(lines
            .contains(&"setup hook etc-setup-hooks/30-notes skipped: not executable".to_owned()));
        assert_eq!(
            lines.last().unwrap(),
            "setup hooks done for 2.0.0: 4 ran, 1 skipped"
        );
        assert!(!hooks_due(&t.state, "2.0.0").unwrap());
    }

    #[test]
    fn a_user_hook_linking_out_of_var_refuses_the_run_before_any_hook() {
        let t = Tree::new();
        t.hook(&t.image, "10-image", 0o755, "");
        t.hook(&t.outside, "evil", 0o755, "");
        symlink(t.outside.join("evil"), t.user.join("50-evil")).unwrap();
        let (result, lines) = t.run();
        let err = result.unwrap_err().to_string();
        assert!(err.starts_with("setup hooks refused, none ran: "), "{err}");
        assert!(err.contains("50-evil resolves to"), "{err}");
        assert!(
            err.ends_with(&format!("outside {}", t.var.display())),
            "{err}"
        );
        assert_eq!(lines, [err]);
        assert!(t.trace().is_empty(), "a hook ran: {:?}", t.trace());
        assert!(hooks_due(&t.state, "2.0.0").unwrap());

        // A dangling link is refused too: what it names cannot be checked.
        fs::remove_file(t.user.join("50-evil")).unwrap();
        symlink("/nonexistent/hook", t.user.join("50-dangling")).unwrap();
        let err = t.run().0.unwrap_err().to_string();
        assert!(
            err.contains("50-dangling resolves to /nonexistent/hook"),
            "{err}"
        );
    }

    #[test]
    fn a_user_hook_directory_that_is_a_symlink_out_of_var_is_refused() {
        let t = Tree::new();
        t.hook(&t.image, "10-image", 0o755, "");
        t.hook(&t.outside, "20-outside", 0o755, "");
        fs::remove_dir(&t.user).unwrap();
        symlink(&t.outside, &t.user).unwrap();
        let err = t.run().0.unwrap_err().to_string();
        assert!(err.contains("etc-setup-hooks resolves to"), "{err}");
        assert!(t.trace().is_empty());
        // A directory link that stays inside /var is followed.
        fs::remove_file(&t.user).unwrap();
        let inside = t.var.join("hooks-elsewhere");
        fs::create_dir(&inside).unwrap();
        t.hook(&inside, "20-inside", 0o755, "");
        symlink(&inside, &t.user).unwrap();
        t.run().0.unwrap();
        assert_eq!(t.trace(), ["setup.d/10-image", "hooks-elsewhere/20-inside"]);
    }

    #[test]
    fn a_hung_user_hook_is_killed_and_nothing_is_recorded() {
        let t = Tree::new();
        t.hook(&t.user, "10-hang", 0o755, "sleep 30");
        t.hook(&t.user, "20-after", 0o755, "");
        let dirs = [HookDir::user(&t.user, &t.var)];
        let run = HookRun {
            dirs: &dirs,
            timeout: Duration::from_millis(300),
            state_etc_dir: &t.state,
            version: "2.0.0",
        };
        let err = run_setup_hooks(&run, |_| {}, &CancelToken::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "setup hook etc-setup-hooks/10-hang failed: timed out after 0.3 s (killed)"
        );
        assert_eq!(t.trace(), ["etc-setup-hooks/10-hang"]);
        assert!(hooks_due(&t.state, "2.0.0").unwrap());
    }
}
