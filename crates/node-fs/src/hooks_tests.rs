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
        let result = run_setup_hooks(&run, |l| lines.lock().unwrap().push(l.to_owned()), cancel);
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
