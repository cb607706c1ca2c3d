//! Task `setupHooks` in a Boot sequence: how a hook's failure reaches the fatal path.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use slate_node_fs::etc::prepare_upper;
use slate_node_fs::hooks::{HookDir, HookRun};

use super::hooks_when_due;

/// Task `setupHooks` in a Boot sequence over `hooks`, and the journal it wrote.
fn setup_task(
    state: &Path,
    hooks: &Path,
    version: &str,
) -> (Result<(), slate_sequencer::SequenceError>, Vec<String>) {
    use slate_sequencer::{CancelToken, MemoryLogger, PhaseListBuilder, SequenceKind, Task};
    let dirs = [HookDir::image(hooks)];
    let run = HookRun {
        dirs: &dirs,
        timeout: Duration::from_secs(30),
        state_etc_dir: state,
        version,
    };
    let logger = MemoryLogger::new();
    let result = PhaseListBuilder::new()
        .append(
            "setup",
            [Task::new("setupHooks", |ctx| hooks_when_due(ctx, &run))],
        )
        .into_sequence(SequenceKind::Boot)
        .run(&CancelToken::new(), &logger);
    (result, logger.lines())
}

#[test]
fn a_failing_hook_fails_the_boot_task_with_its_name_and_runs_again_next_boot() {
    let tmp = tempfile::tempdir().unwrap();
    let (state, hooks) = (tmp.path().join("etc"), tmp.path().join("setup.d"));
    fs::create_dir(&hooks).unwrap();
    prepare_upper(&state, "2.0.0", &[]).unwrap();
    let hook = hooks.join("50-fail");
    fs::write(&hook, "#!/bin/sh\necho no network config\nexit 1\n").unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    let (result, lines) = setup_task(&state, &hooks, "2.0.0");
    // What the fatal path records in META LastBootFailure, and `slate status` shows.
    assert_eq!(
        slate_sequencer::error_chain(&result.unwrap_err()),
        "boot sequence: phase setup: task setupHooks failed: \
         setup hook 50-fail failed: exit status 1"
    );
    assert!(
        lines.contains(&"task setupHooks (1/1): 50-fail: no network config".to_owned()),
        "{lines:?}"
    );
    assert!(lines
        .contains(&"task setupHooks (1/1): setup hook 50-fail failed: exit status 1".to_owned()));
    // Fixed, the next boot of the same version runs it again; the one after does not.
    fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    setup_task(&state, &hooks, "2.0.0").0.unwrap();
    let (result, lines) = setup_task(&state, &hooks, "2.0.0");
    result.unwrap();
    let task_lines: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("task setupHooks (1/1): "))
        .collect();
    assert_eq!(
        task_lines,
        ["task setupHooks (1/1): setup hooks already ran for 2.0.0"]
    );
}
