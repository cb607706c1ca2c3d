//! The drain command with real processes: its environment and output, a failure's status and
//! last lines, the timeout that kills its whole process group; and the task's one rule — only a
//! live upgrade is refused by a failed command.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_machine_config::Drain;
use slate_sequencer::{CancelToken, MemoryLogger, Progress};

use super::*;

fn journal() -> Arc<Journal> {
    Arc::new(Journal::new(slate_host::KmsgLogger::stderr("test")))
}

fn sh(script: &str, timeout_secs: u32) -> Drain {
    Drain {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        timeout_secs,
    }
}

fn lines(journal: &Journal) -> Vec<String> {
    journal.read_from(0, None).0
}

#[test]
fn a_successful_command_sees_why_the_node_drains_and_its_output_is_journaled() {
    let journal = journal();
    let drain = sh(
        "echo \"cordoned $SLATE_NODE_NAME for $SLATE_DRAIN_REASON to $SLATE_TARGET_VERSION\"; \
         echo \"path $PATH home=${HOME:-unset}\" >&2",
        10,
    );
    let env = [
        ("SLATE_DRAIN_REASON", "upgrade"),
        ("SLATE_NODE_NAME", "node1"),
        ("SLATE_TARGET_VERSION", "2.0.0"),
    ];
    let took = run_command(&journal, &drain, &env).unwrap();
    assert!(took < Duration::from_secs(10));
    let lines = lines(&journal);
    assert!(
        lines.contains(&"drain: cordoned node1 for upgrade to 2.0.0".to_owned()),
        "{lines:?}"
    );
    // A clean environment: machined's own is not handed on.
    assert!(
        lines.contains(&"drain: path /usr/sbin:/usr/bin:/sbin:/bin home=unset".to_owned()),
        "{lines:?}"
    );
}

#[test]
fn a_failure_names_its_status_and_keeps_only_its_last_lines() {
    let journal = journal();
    let drain = sh(
        "i=0; while [ $i -lt 100 ]; do echo \"line $i\"; i=$((i+1)); done; \
         echo 'cannot evict pod web-1'; exit 3",
        10,
    );
    let failure = run_command(&journal, &drain, &[]).unwrap_err();
    assert_eq!(failure.what, "it exited with status 3");
    assert_eq!(failure.tail.len(), TAIL_LINES);
    assert_eq!(failure.tail.last().unwrap(), "cannot evict pod web-1");
    assert!(!failure.tail.contains(&"line 50".to_owned()));
    let text = failure.to_string();
    assert!(
        text.starts_with("it exited with status 3; its last output: line 8"),
        "{text}"
    );
    // Every line is in the journal all the same.
    assert_eq!(
        lines(&journal)
            .iter()
            .filter(|l| l.starts_with("drain: line "))
            .count(),
        100
    );
}

#[test]
fn a_command_past_its_timeout_is_killed_with_its_process_group() {
    let journal = journal();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let drain = sh(
        &format!(
            "sleep 60 & echo $! > {}; echo waiting; wait",
            pidfile.display()
        ),
        1,
    );
    let started = Instant::now();
    let failure = run_command(&journal, &drain, &[]).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{failure}");
    assert_eq!(
        failure.what,
        "it did not finish within its 1 s and was killed"
    );
    assert_eq!(failure.tail, ["waiting"]);
    // Its background child went with it: the group was killed, not only the shell.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}/status")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .contains("State:\tZ")
    {
        assert!(
            Instant::now() < deadline,
            "the group's sleep {pid} survived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_program_that_cannot_start_is_a_failure_that_says_so() {
    let drain = Drain {
        command: vec!["/nonexistent/cordon".into()],
        timeout_secs: 5,
    };
    let failure = run_command(&journal(), &drain, &[]).unwrap_err();
    assert!(failure.what.contains("/nonexistent/cordon"), "{failure}");
    assert!(failure.to_string().ends_with("(it printed nothing)"));
}

const CONFIG: &str = include_str!("../../../machine-config/tests/fixtures/node-v1-own-ca.toml");

/// Runs the drain task for `reason` on a node whose configuration drains with `script`.
fn drain_task(script: &str, reason: &DrainReason) -> (Result<(), TaskError>, Vec<String>) {
    let (node, _requests) = Node::for_tests("");
    let text = format!("{CONFIG}\n[drain]\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\n");
    node.machine
        .set(slate_machine_config::parse(&text).unwrap());
    let (logger, token) = (MemoryLogger::new(), CancelToken::new());
    let progress = Progress { index: 1, total: 1 };
    let ctx = TaskContext::new("drainNode", "drain", progress, &token, &logger);
    let result = task(&ctx, &node, reason);
    let mut lines = logger.lines();
    lines.extend(lines_of(&node));
    (result, lines)
}

fn lines_of(node: &Node) -> Vec<String> {
    lines(&node.journal)
}

#[test]
fn only_a_live_upgrade_is_refused_by_a_failed_drain_command() {
    let failing = "echo \"refusing $SLATE_DRAIN_REASON of $SLATE_NODE_NAME\"; exit 2";
    let upgrade = DrainReason::Upgrade { to: "2.0.0".into() };
    let (result, lines) = drain_task(failing, &upgrade);
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("the drain command failed: it exited with status 2; its last output: refusing upgrade of node1")
            && err.contains("The upgrade is refused before anything was written")
            && err.contains("--stage"),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("running the drain command /bin/sh -c")),
        "{lines:?}"
    );
    for reason in [
        DrainReason::Reboot,
        DrainReason::Shutdown,
        DrainReason::Reset,
        DrainReason::StagedUpgrade { to: "2.0.0".into() },
    ] {
        let (result, lines) = drain_task(failing, &reason);
        assert!(result.is_ok(), "{reason:?}");
        let refusing = format!("drain: refusing {} of node1", reason.name());
        assert!(lines.contains(&refusing), "{reason:?}: {lines:?}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("error: the drain command failed")
                    && l.ends_with(&format!("the node goes on ({})", reason.why()))),
            "{reason:?}: {lines:?}"
        );
    }
    let (result, lines) = drain_task("echo cordoned", &upgrade);
    assert!(result.is_ok());
    assert!(lines.contains(&"drain: cordoned".to_owned()), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("the drain command succeeded in")),
        "{lines:?}"
    );
}
