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

pub use crate::etc::hooks_due;
use crate::etc::{io_error, write_record, EtcError, HOOKS_RECORD};

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
#[path = "hooks_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "hooks_user_tests.rs"]
mod user_tests;
