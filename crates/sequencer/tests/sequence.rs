//! Acceptance tests of the runner: phase ordering, task concurrency, failure, cancellation,
//! conditional and deferred phases.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use slate_sequencer::{
    CancelToken, Disposition, MemoryLogger, NullLogger, PhaseListBuilder, RebootMode,
    SequenceError, SequenceKind, Task, TaskError,
};

/// A task that records its start and end instants under `label`, sleeping `busy` in between.
fn timed<'a>(
    label: &'static str,
    busy: Duration,
    log: &'a Mutex<Vec<(&'static str, Instant, Instant)>>,
) -> Task<'a> {
    Task::new(label, move |_| {
        let start = Instant::now();
        std::thread::sleep(busy);
        log.lock().unwrap().push((label, start, Instant::now()));
        Ok(())
    })
}

/// Every task and every phase that ran ends with a span: its start, its duration, and whether
/// it ended without an error; a phase after a failure never runs, so has none.
#[test]
fn tasks_and_phases_are_timed() {
    let ms = Duration::from_millis;
    let log = Mutex::new(Vec::new());
    let logger = MemoryLogger::new();
    let sequence = PhaseListBuilder::new()
        .append("one", [timed("a", ms(30), &log), timed("b", ms(5), &log)])
        .append("two", [Task::new("fails", |_| Err(TaskError::msg("no")))])
        .append("three", [timed("c", ms(1), &log)])
        .into_sequence(SequenceKind::Boot);
    let before = Instant::now();
    assert!(sequence.run(&CancelToken::new(), &logger).is_err());
    let spans = logger.spans();
    let names: Vec<(&str, Option<&str>, bool)> = spans
        .iter()
        .map(|s| (s.phase.as_str(), s.task.as_deref(), s.ok))
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names[..2].contains(&("one", Some("a"), true)));
    assert!(names[..2].contains(&("one", Some("b"), true)));
    assert_eq!(
        names[2..],
        [
            ("one", None, true),
            ("two", Some("fails"), false),
            ("two", None, false)
        ]
    );
    let a = spans
        .iter()
        .find(|s| s.task.as_deref() == Some("a"))
        .unwrap();
    let one = &spans[2];
    assert!(a.took >= ms(30) && one.took >= a.took, "{a:?} {one:?}");
    assert!(a.started >= before && one.started >= before);
    assert!(spans.iter().all(|s| s.sequence == SequenceKind::Boot));
}

#[test]
fn phases_run_serially() {
    let log = Mutex::new(Vec::new());
    let ms = Duration::from_millis;
    let sequence = PhaseListBuilder::new()
        .append("one", [timed("a", ms(40), &log), timed("b", ms(60), &log)])
        .append("two", [timed("c", ms(1), &log), timed("d", ms(1), &log)])
        .into_sequence(SequenceKind::Boot);
    sequence.run(&CancelToken::new(), &NullLogger).unwrap();

    let log = log.into_inner().unwrap();
    assert_eq!(log.len(), 4);
    let phase_one_end = log
        .iter()
        .filter(|(label, ..)| matches!(*label, "a" | "b"))
        .map(|&(_, _, end)| end)
        .max()
        .unwrap();
    let phase_two_start = log
        .iter()
        .filter(|(label, ..)| matches!(*label, "c" | "d"))
        .map(|&(_, start, _)| start)
        .min()
        .unwrap();
    assert!(
        phase_two_start >= phase_one_end,
        "phase two started {:?} before phase one ended",
        phase_one_end - phase_two_start
    );
}

/// A two-party rendezvous with a timeout: like `Barrier::new(2)`, but a task run alone fails
/// after the timeout instead of hanging the test.
#[derive(Default)]
struct Rendezvous {
    arrived: Mutex<usize>,
    all_here: Condvar,
}

impl Rendezvous {
    fn wait(&self, parties: usize, timeout: Duration) -> Result<(), TaskError> {
        let mut arrived = self.arrived.lock().unwrap();
        *arrived += 1;
        self.all_here.notify_all();
        let (arrived, result) = self
            .all_here
            .wait_timeout_while(arrived, timeout, |arrived| *arrived < parties)
            .unwrap();
        if result.timed_out() {
            return Err(TaskError::msg(format!(
                "only {} of {parties} tasks were running at once",
                *arrived
            )));
        }
        Ok(())
    }
}

#[test]
fn tasks_of_a_phase_overlap_in_time() {
    // Each task only returns once the other is running too: impossible unless they overlap.
    let rendezvous = Rendezvous::default();
    let task = |name: &'static str| {
        let rendezvous = &rendezvous;
        Task::new(name, move |_| rendezvous.wait(2, Duration::from_secs(10)))
    };
    let sequence = PhaseListBuilder::new()
        .append("together", [task("left"), task("right")])
        .into_sequence(SequenceKind::Boot);
    sequence.run(&CancelToken::new(), &NullLogger).unwrap();
    assert_eq!(*rendezvous.arrived.lock().unwrap(), 2);
}

#[test]
fn first_failure_aborts_and_names_phase_and_task() {
    let later_ran = AtomicBool::new(false);
    let sibling_finished = AtomicBool::new(false);
    let sibling_saw_cancel = AtomicBool::new(false);
    let sequence = PhaseListBuilder::new()
        .append("ok", [Task::new("fine", |_| Ok(()))])
        .append(
            "mount",
            [
                Task::new("mountState", |_| Err(TaskError::msg("no STATE partition"))),
                Task::new("slowSibling", |ctx| {
                    // Stopped early by the failure, but allowed to finish on its own terms.
                    if ctx.cancel_token().wait_timeout(Duration::from_secs(10)) {
                        sibling_saw_cancel.store(true, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    sibling_finished.store(true, Ordering::SeqCst);
                    Ok(())
                }),
            ],
        )
        .append(
            "later",
            [Task::new("never", |_| {
                later_ran.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Boot);
    let error = sequence.run(&CancelToken::new(), &NullLogger).unwrap_err();

    match &error {
        SequenceError::Fatal {
            sequence,
            phase,
            task,
            source,
        } => {
            assert_eq!(*sequence, SequenceKind::Boot);
            assert_eq!(phase, "mount");
            assert_eq!(task, "mountState");
            assert_eq!(source.to_string(), "no STATE partition");
        }
        other => panic!("expected Fatal, got {other:?}"),
    }
    assert_eq!(
        error.to_string(),
        "boot sequence: phase mount: task mountState failed"
    );
    assert_eq!(error.disposition(), Disposition::Fatal);
    assert!(!later_ran.load(Ordering::SeqCst), "a later phase ran");
    assert!(sibling_finished.load(Ordering::SeqCst), "sibling abandoned");
    assert!(
        sibling_saw_cancel.load(Ordering::SeqCst),
        "sibling not told"
    );
}

#[test]
fn cancellation_between_phases() {
    let token = CancelToken::new();
    let phase_two_ran = AtomicBool::new(false);
    let sequence = PhaseListBuilder::new()
        .append(
            "one",
            [Task::new("takenOver", |ctx| {
                // What a takeover does while this phase runs.
                token.cancel();
                assert!(
                    ctx.is_cancelled(),
                    "the task's token follows the sequence's"
                );
                Ok(())
            })],
        )
        .append(
            "two",
            [Task::new("never", |_| {
                phase_two_ran.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Boot);
    let error = sequence.run(&token, &NullLogger).unwrap_err();
    assert!(
        matches!(
            error,
            SequenceError::Cancelled {
                sequence: SequenceKind::Boot
            }
        ),
        "{error:?}"
    );
    assert!(error.is_swallowed());
    assert!(!phase_two_ran.load(Ordering::SeqCst));
}

#[test]
fn cancelled_before_start_runs_nothing() {
    let token = CancelToken::new();
    token.cancel();
    let ran = AtomicBool::new(false);
    let sequence = PhaseListBuilder::new()
        .append(
            "one",
            [Task::new("never", |_| {
                ran.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Reboot);
    assert!(matches!(
        sequence.run(&token, &NullLogger),
        Err(SequenceError::Cancelled { .. })
    ));
    assert!(!ran.load(Ordering::SeqCst));
}

#[test]
fn deferred_check_is_evaluated_when_the_phase_is_reached() {
    let installed = AtomicBool::new(false);
    let checks = AtomicUsize::new(0);
    let install_ran = AtomicBool::new(false);
    let never_ran = AtomicBool::new(false);
    let sequence = PhaseListBuilder::new()
        .append(
            "detect",
            [Task::new("detectInstall", |_| {
                installed.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .append_deferred(
            "upgradeOnly",
            || {
                checks.fetch_add(1, Ordering::SeqCst);
                installed.load(Ordering::SeqCst)
            },
            [Task::new("runs", |_| {
                install_ran.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .append_deferred(
            "skipped",
            || false,
            [Task::new("never", |_| {
                never_ran.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Install);
    // At build time the flag is false: a check evaluated now would skip the phase.
    assert_eq!(checks.load(Ordering::SeqCst), 0);
    let logger = MemoryLogger::new();
    sequence.run(&CancelToken::new(), &logger).unwrap();
    assert_eq!(checks.load(Ordering::SeqCst), 1);
    assert!(install_ran.load(Ordering::SeqCst));
    assert!(!never_ran.load(Ordering::SeqCst));
    assert!(logger
        .lines()
        .contains(&"phase skipped (3/3): skipped".to_owned()));
}

#[test]
fn append_when_skips_on_false() {
    let ran = Mutex::new(Vec::new());
    let task = |name: &'static str| {
        let ran = &ran;
        Task::new(name, move |_| {
            ran.lock().unwrap().push(name);
            Ok(())
        })
    };
    let phases = PhaseListBuilder::new()
        .append_when(false, "container", [task("container")])
        .append_when(true, "metal", [task("metal")])
        .append_list(PhaseListBuilder::new().append("tail", [task("tail")]))
        .build();
    let names: Vec<&str> = phases.iter().map(|phase| phase.name()).collect();
    assert_eq!(names, ["metal", "tail"]);
    slate_sequencer::Sequence::new(SequenceKind::Boot, phases)
        .run(&CancelToken::new(), &NullLogger)
        .unwrap();
    assert_eq!(*ran.lock().unwrap(), ["metal", "tail"]);
}

#[test]
fn tasks_log_progress_as_k_of_n() {
    let logger = MemoryLogger::new();
    let sequence = PhaseListBuilder::new()
        .append(
            "mount",
            [
                Task::new("mountBoot", |_| Ok(())),
                Task::new("mountState", |ctx| {
                    ctx.log("formatted");
                    Ok(())
                }),
                Task::new("mountEphemeral", |_| Ok(())),
            ],
        )
        .into_sequence(SequenceKind::Boot);
    sequence.run(&CancelToken::new(), &logger).unwrap();
    let lines = logger.lines();
    let has = |line: &str| lines.iter().any(|l| l == line);
    let has_prefix = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    assert!(has("boot sequence: 1 phase(s)"), "{lines:#?}");
    assert!(has("phase mount (1/1): 3 task(s)"), "{lines:#?}");
    assert!(has("task mountState (2/3) starting"), "{lines:#?}");
    assert!(has("task mountState (2/3): formatted"), "{lines:#?}");
    assert!(has_prefix("task mountState (2/3) done in "), "{lines:#?}");
    assert!(has_prefix("task mountBoot (1/3) done in "), "{lines:#?}");
    assert!(
        has_prefix("task mountEphemeral (3/3) done in "),
        "{lines:#?}"
    );
    assert!(has_prefix("boot sequence: done in "), "{lines:#?}");
}

#[test]
fn reboot_request_unwinds_as_typed_error() {
    let later_ran = AtomicBool::new(false);
    let sequence = PhaseListBuilder::new()
        .append(
            "install",
            [Task::new("reboot", |_| {
                Err(TaskError::Reboot(RebootMode::Powercycle))
            })],
        )
        .append(
            "after",
            [Task::new("never", |_| {
                later_ran.store(true, Ordering::SeqCst);
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Install);
    let error = sequence.run(&CancelToken::new(), &NullLogger).unwrap_err();
    assert!(matches!(
        error,
        SequenceError::Reboot {
            mode: RebootMode::Powercycle
        }
    ));
    assert!(!error.is_swallowed());
    assert_eq!(
        error.disposition(),
        Disposition::Reboot(RebootMode::Powercycle)
    );
    assert!(!later_ran.load(Ordering::SeqCst));
}

#[test]
fn panicking_task_is_a_fatal_error_not_an_unwind() {
    let sequence = PhaseListBuilder::new()
        .append(
            "bad",
            [Task::new("panics", |_| -> Result<(), TaskError> {
                panic!("index out of range")
            })],
        )
        .into_sequence(SequenceKind::Boot);
    match sequence.run(&CancelToken::new(), &NullLogger) {
        Err(SequenceError::Fatal { task, source, .. }) => {
            assert_eq!(task, "panics");
            assert_eq!(source.to_string(), "panicked: index out of range");
        }
        other => panic!("expected Fatal, got {other:?}"),
    }
}

#[test]
fn tasks_may_borrow_and_share_state() {
    let counter = Arc::new(AtomicUsize::new(0));
    let tasks = (0..8).map(|i| {
        let counter = &counter;
        Task::new(format!("t{i}"), move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    });
    PhaseListBuilder::new()
        .append("many", tasks)
        .into_sequence(SequenceKind::Boot)
        .run(&CancelToken::new(), &NullLogger)
        .unwrap();
    assert_eq!(counter.load(Ordering::SeqCst), 8);
}
