//! Health checks: what must hold at stage Running before machined commits the boot.
//!
//! The image carries its checks in `/etc/slate/node.toml` (written by the imager from the
//! profile's `[health]`; no file, no checks). Each check is retried until it passes or the
//! overall timeout expires; checks run one after the other, in the order the profile lists
//! them, against one deadline. A failure goes down the fatal path like any other boot failure:
//! recorded in META, the pending upgrade reverted, reboot.

use std::fmt;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use slate_profile::{HealthCheck, NodeConfig};
use slate_sequencer::error_chain;

use crate::base::node::Node;

/// The node's runtime configuration (health checks, watchdog).
pub use slate_profile::image_contract::NODE_CONFIG;

/// Pause between two attempts of a failing check.
const RETRY_INTERVAL: Duration = Duration::from_millis(250);
/// The longest a single TCP connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Read the node configuration; an absent file means no checks and no watchdog.
pub fn load_config(path: &Path) -> anyhow::Result<NodeConfig> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(NodeConfig::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    NodeConfig::parse(&text).with_context(|| format!("the node configuration {}", path.display()))
}

/// A check that did not pass before the deadline.
#[derive(Debug)]
pub struct HealthFailure {
    /// The check, as `HealthCheck`'s Display shows it (`tcp 127.0.0.1:9`).
    pub check: String,
    /// Why its last attempt failed.
    pub reason: String,
    pub attempts: u32,
    pub elapsed: Duration,
}

impl fmt::Display for HealthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "health check `{}` failed: {} ({} attempt{} in {:.1}s)",
            self.check,
            self.reason,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.elapsed.as_secs_f64()
        )
    }
}

impl std::error::Error for HealthFailure {}

/// Every check passed: how many, and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passed {
    pub checks: usize,
    pub elapsed: Duration,
}

/// Run the image's health checks (none configured: nothing to do), logging to the journal.
pub fn check(node: &Node, config: &NodeConfig) -> Result<(), HealthFailure> {
    let Some(health) = &config.health else {
        return Ok(());
    };
    let journal = &node.journal;
    let timeout = Duration::from_secs(u64::from(health.timeout_secs));
    journal.info(format_args!(
        "health: {} check(s), {}s to pass",
        health.checks.len(),
        health.timeout_secs
    ));
    let service_ready = |name: &str| {
        node.services
            .get()
            .and_then(|services| services.is_ready(name))
    };
    match run_checks(&health.checks, timeout, &service_ready, &|line: &str| {
        journal.info(format_args!("health: {line}"))
    }) {
        Ok(passed) => {
            journal.counters.health(
                health
                    .checks
                    .iter()
                    .map(|c| (c.to_string(), true))
                    .collect(),
            );
            journal.info(format_args!(
                "health: {n}/{n} checks passed in {:.1}s",
                passed.elapsed.as_secs_f64(),
                n = passed.checks
            ));
            Ok(())
        }
        Err(failure) => {
            // The checks run in order: those before the failed one passed, the rest did not run.
            let ran = health.checks.iter().map(ToString::to_string);
            let passed = ran.take_while(|c| *c != failure.check);
            let mut results: Vec<(String, bool)> = passed.map(|c| (c, true)).collect();
            results.push((failure.check.clone(), false));
            journal.counters.health(results);
            journal.error(format_args!("{failure}"));
            Err(failure)
        }
    }
}

/// Run `checks` in order, each retried until it passes or `timeout` (for all of them) expires.
pub fn run_checks(
    checks: &[HealthCheck],
    timeout: Duration,
    service_ready: &dyn Fn(&str) -> Option<bool>,
    log: &dyn Fn(&str),
) -> Result<Passed, HealthFailure> {
    let started = Instant::now();
    let deadline = started + timeout;
    for check in checks {
        let check_started = Instant::now();
        let mut attempts = 0;
        // Why the last attempt that finished failed: more telling than a last attempt cut
        // short by the deadline.
        let mut finished_reason: Option<String> = None;
        loop {
            attempts += 1;
            match attempt(check, deadline, service_ready) {
                Ok(()) => {
                    log(&format!(
                        "`{check}` passed ({attempts} attempt{}, {:.1}s)",
                        if attempts == 1 { "" } else { "s" },
                        check_started.elapsed().as_secs_f64()
                    ));
                    break;
                }
                Err(Attempt::CutShort(reason)) if finished_reason.is_some() => {
                    let earlier = finished_reason.take().unwrap_or_default();
                    return Err(HealthFailure {
                        check: check.to_string(),
                        reason: format!("{earlier} (the last attempt was {reason})"),
                        attempts,
                        elapsed: check_started.elapsed(),
                    });
                }
                Err(Attempt::CutShort(reason) | Attempt::Failed(reason)) => {
                    let now = Instant::now();
                    if now + RETRY_INTERVAL >= deadline {
                        return Err(HealthFailure {
                            check: check.to_string(),
                            reason,
                            attempts,
                            elapsed: check_started.elapsed(),
                        });
                    }
                    finished_reason = Some(reason.clone());
                    if attempts == 1 {
                        log(&format!("`{check}` not yet: {reason}; retrying"));
                    }
                    std::thread::sleep(RETRY_INTERVAL);
                }
            }
        }
    }
    Ok(Passed {
        checks: checks.len(),
        elapsed: started.elapsed(),
    })
}

/// Why an attempt did not pass.
enum Attempt {
    /// It finished and failed.
    Failed(String),
    /// The deadline came first.
    CutShort(String),
}

/// One attempt of one check.
fn attempt(
    check: &HealthCheck,
    deadline: Instant,
    service_ready: &dyn Fn(&str) -> Option<bool>,
) -> Result<(), Attempt> {
    match check {
        HealthCheck::File(path) => match std::fs::metadata(path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(Attempt::Failed(format!(
                "{} does not exist",
                path.display()
            ))),
            Err(e) => Err(Attempt::Failed(format!(
                "{}: {}",
                path.display(),
                describe(&e)
            ))),
        },
        HealthCheck::Tcp(addr) => connect(*addr, deadline),
        HealthCheck::Command(argv) => run(argv, deadline),
        HealthCheck::Service(name) => match service_ready(name) {
            Some(true) => Ok(()),
            Some(false) => Err(Attempt::Failed(format!("service {name} is not ready"))),
            None => Err(Attempt::Failed(format!("this node runs no service {name}"))),
        },
    }
}

fn connect(addr: SocketAddr, deadline: Instant) -> Result<(), Attempt> {
    let budget = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(10), CONNECT_TIMEOUT);
    TcpStream::connect_timeout(&addr, budget)
        .map(drop)
        .map_err(|e| Attempt::Failed(describe(&e)))
}

/// Run the command under the reaper's lock (so PID 1's reaper cannot steal its exit status).
/// A command still running at the deadline fails the check; it is left to the fatal path's
/// teardown, which kills every process.
fn run(argv: &[String], deadline: Instant) -> Result<(), Attempt> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Attempt::Failed("no program".into()))?;
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("health-command".into())
        .spawn(move || {
            let result = slate_host::run_command(&mut command);
            let _ = tx.send(result.map(drop).map_err(|e| error_chain(&e)));
        })
        .map_err(|e| Attempt::Failed(format!("starting a thread for the command: {e}")))?;
    let budget = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(budget) {
        Ok(result) => result.map_err(Attempt::Failed),
        Err(_) => Err(Attempt::CutShort(format!(
            "still running at the deadline (after {:.1}s)",
            budget.as_secs_f64()
        ))),
    }
}

/// An I/O error in a few words (`connection refused`), without the `(os error N)` suffix.
fn describe(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::ConnectionRefused => "connection refused".into(),
        ErrorKind::TimedOut | ErrorKind::WouldBlock => "timed out".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::Mutex;

    use super::*;

    fn run_collecting(
        checks: &[HealthCheck],
        timeout: Duration,
    ) -> (Result<Passed, HealthFailure>, Vec<String>) {
        let lines = Mutex::new(Vec::new());
        let result = run_checks(checks, timeout, &|_| None, &|l: &str| {
            lines.lock().unwrap().push(l.to_string())
        });
        (result, lines.into_inner().unwrap())
    }

    /// Commands run under PID 1's one child lock, so a test whose command outlives its
    /// deadline would hold up the others' commands: tests that run commands take turns.
    static COMMANDS: Mutex<()> = Mutex::new(());

    fn commands() -> std::sync::MutexGuard<'static, ()> {
        COMMANDS.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sh(script: &str) -> HealthCheck {
        HealthCheck::Command(vec!["/bin/sh".into(), "-c".into(), script.into()])
    }

    fn closed_port() -> SocketAddr {
        // Bound then released: nothing listens there (the kernel does not hand out a port it
        // just gave away straight away).
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    #[test]
    fn all_pass_against_real_files_commands_and_listeners() {
        let _turn = commands();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ready");
        std::fs::write(&file, "").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let checks = [
            HealthCheck::File(file),
            sh("exit 0"),
            HealthCheck::Tcp(listener.local_addr().unwrap()),
        ];
        let (result, lines) = run_collecting(&checks, Duration::from_secs(5));
        let passed = result.unwrap();
        assert_eq!(passed.checks, 3);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].starts_with("`tcp 127.0.0.1:"), "{lines:?}");
        assert!(
            lines.iter().all(|l| l.contains("passed (1 attempt,")),
            "{lines:?}"
        );
    }

    #[test]
    fn a_missing_file_fails_at_the_deadline_naming_it() {
        let started = Instant::now();
        let (result, lines) = run_collecting(
            &[HealthCheck::File("/nonexistent/slate-health".into())],
            Duration::from_millis(800),
        );
        let failure = result.unwrap_err();
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
        assert!(failure.attempts > 1);
        assert!(
            failure.to_string().starts_with(
                "health check `file /nonexistent/slate-health` failed: \
                 /nonexistent/slate-health does not exist ("
            ),
            "{failure}"
        );
        assert_eq!(
            lines.len(),
            1,
            "one 'not yet' line, not one per attempt: {lines:?}"
        );
    }

    #[test]
    fn a_refused_connection_is_reported_as_such() {
        let addr = closed_port();
        let (result, _) = run_collecting(&[HealthCheck::Tcp(addr)], Duration::from_millis(600));
        let failure = result.unwrap_err();
        assert_eq!(failure.check, format!("tcp {addr}"));
        assert_eq!(failure.reason, "connection refused");
        assert!(
            failure.to_string().starts_with(&format!(
                "health check `tcp {addr}` failed: connection refused"
            )),
            "{failure}"
        );
    }

    #[test]
    fn checks_are_retried_until_they_pass() {
        let _turn = commands();
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("later");
        let addr = closed_port();
        let flag2 = flag.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            std::fs::write(&flag2, "").unwrap();
            let listener = TcpListener::bind(addr).unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(listener);
        });
        // The file appears just before the listener: once the port answers, the file is there.
        let checks = [
            HealthCheck::Tcp(addr),
            sh(&format!("test -e '{}'", flag.display())),
        ];
        let (result, lines) = run_collecting(&checks, Duration::from_secs(10));
        let passed = result.unwrap_or_else(|f| panic!("{f}; {lines:?}"));
        assert!(passed.elapsed >= Duration::from_millis(600), "{passed:?}");
        assert!(
            lines[0].contains("not yet: connection refused"),
            "{lines:?}"
        );
        assert!(lines[1].contains("passed ("), "{lines:?}");
        assert!(!lines[1].contains("(1 attempt,"), "{lines:?}");
        assert!(lines[2].contains("passed (1 attempt,"), "{lines:?}");
        late.join().unwrap();
    }

    #[test]
    fn a_failing_command_reports_its_status_and_output() {
        let _turn = commands();
        let (result, _) = run_collecting(
            &[sh("echo not ready >&2; exit 3")],
            Duration::from_millis(600),
        );
        let failure = result.unwrap_err();
        assert!(failure.reason.contains("exit status: 3"), "{failure}");
        assert!(failure.reason.contains("not ready"), "{failure}");
        let (result, _) = run_collecting(
            &[HealthCheck::Command(vec!["/nonexistent/program".into()])],
            Duration::from_millis(300),
        );
        assert!(
            result
                .unwrap_err()
                .reason
                .contains("cannot run /nonexistent/program"),
            "a program that cannot start"
        );
    }

    #[test]
    fn a_command_still_running_at_the_deadline_fails() {
        let _turn = commands();
        let started = Instant::now();
        let (result, _) = run_collecting(&[sh("exec sleep 2")], Duration::from_millis(700));
        let failure = result.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "the deadline holds"
        );
        assert!(
            failure.reason.starts_with("still running at the deadline"),
            "{failure}"
        );
        assert_eq!(failure.attempts, 1);
        // A command that failed before a later attempt was cut short: its reason is kept.
        std::thread::sleep(Duration::from_millis(1500));
        let flag = tempfile::NamedTempFile::new().unwrap();
        let script = format!(
            "if [ -s '{0}' ]; then exec sleep 2; fi; echo x > '{0}'; echo first >&2; exit 1",
            flag.path().display()
        );
        let (result, _) = run_collecting(&[sh(&script)], Duration::from_millis(900));
        let failure = result.unwrap_err();
        assert!(
            failure.reason.contains("first")
                && failure
                    .reason
                    .contains("(the last attempt was still running at the deadline"),
            "{failure}"
        );
        std::thread::sleep(Duration::from_millis(2000));
    }

    #[test]
    fn the_first_failing_check_stops_the_rest() {
        let _turn = commands();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (result, lines) = run_collecting(
            &[
                HealthCheck::Tcp(listener.local_addr().unwrap()),
                HealthCheck::File("/nonexistent".into()),
                sh("exit 0"),
            ],
            Duration::from_millis(500),
        );
        assert_eq!(result.unwrap_err().check, "file /nonexistent");
        assert_eq!(lines.len(), 2, "{lines:?}");
    }

    #[test]
    fn the_config_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        assert_eq!(load_config(&path).unwrap(), NodeConfig::default(), "absent");

        let config = NodeConfig::parse(
            "[health]\ntimeout_secs = 5\n[[health.checks]]\ntcp = \"127.0.0.1:50000\"\n\
             [[health.checks]]\ncommand = [\"/bin/true\"]\n[watchdog]\ntimeout_secs = 20\n",
        )
        .unwrap();
        std::fs::write(&path, config.to_toml()).unwrap();
        assert_eq!(load_config(&path).unwrap(), config);

        std::fs::write(&path, "[health]\ntimeout_secs = \"soon\"\n").unwrap();
        let err = format!("{:#}", load_config(&path).unwrap_err());
        assert!(err.starts_with("the node configuration "), "{err}");
        assert!(err.contains("timeout_secs"), "{err}");
    }
}
