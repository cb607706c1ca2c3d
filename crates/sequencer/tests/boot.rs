//! The boot path: Initialize → Install → Boot.

use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use slate_sequencer::{
    run_boot, BootOutcome, MemoryLogger, NullLogger, PhaseListBuilder, PriorityLock, RebootMode,
    Sequence, SequenceError, SequenceKind, Task, TaskError,
};

fn recording<'a>(kind: SequenceKind, order: &'a Mutex<Vec<SequenceKind>>) -> Sequence<'a> {
    PhaseListBuilder::new()
        .append(
            "only",
            [Task::new("record", move |_| {
                order.lock().unwrap().push(kind);
                Ok(())
            })],
        )
        .into_sequence(kind)
}

#[test]
fn runs_the_three_sequences_in_order() {
    let lock = PriorityLock::new();
    let order = Mutex::new(Vec::new());
    let outcome = run_boot(
        &lock,
        &NullLogger,
        recording(SequenceKind::Initialize, &order),
        || recording(SequenceKind::Install, &order),
        || recording(SequenceKind::Boot, &order),
    )
    .unwrap();
    assert_eq!(outcome, BootOutcome::Booted);
    assert_eq!(
        *order.lock().unwrap(),
        [
            SequenceKind::Initialize,
            SequenceKind::Install,
            SequenceKind::Boot
        ]
    );
    assert_eq!(lock.running(), None);
}

#[test]
fn initialize_cancelled_skips_install_and_boot() {
    let lock = PriorityLock::new();
    let order = Mutex::new(Vec::new());
    let (started_tx, started_rx) = mpsc::channel();
    let initialize = PhaseListBuilder::new()
        .append(
            "config",
            [Task::new("waitForConfig", move |ctx| {
                started_tx.send(()).unwrap();
                // Nothing takes over Initialize by the matrix; SIGTERM does.
                if ctx.cancel_token().wait_timeout(Duration::from_secs(30)) {
                    return Err(TaskError::Cancelled);
                }
                Ok(())
            })],
        )
        .append("later", [Task::new("later", |_| Ok(()))])
        .into_sequence(SequenceKind::Initialize);
    let logger = MemoryLogger::new();
    thread::scope(|s| {
        let lock_ref = &lock;
        let sigterm = s.spawn(move || {
            started_rx.recv().unwrap();
            lock_ref
                .lock_with_takeover(SequenceKind::Shutdown)
                .map(|guard| guard.kind())
        });
        let outcome = run_boot(
            &lock,
            &logger,
            initialize,
            || recording(SequenceKind::Install, &order),
            || recording(SequenceKind::Boot, &order),
        );
        assert_eq!(outcome.unwrap(), BootOutcome::InitializeCancelled);
        assert_eq!(sigterm.join().unwrap(), Ok(SequenceKind::Shutdown));
    });
    assert!(
        order.lock().unwrap().is_empty(),
        "install or boot was built"
    );
    assert!(logger
        .lines()
        .contains(&"initialize sequence cancelled: skipping install and boot".to_owned()));
}

#[test]
fn install_reboot_request_is_returned_and_boot_skipped() {
    let lock = PriorityLock::new();
    let order = Mutex::new(Vec::new());
    let install = PhaseListBuilder::new()
        .append(
            "reboot",
            [Task::new("reboot", |_| {
                Err(TaskError::Reboot(RebootMode::Default))
            })],
        )
        .into_sequence(SequenceKind::Install);
    let error = run_boot(
        &lock,
        &NullLogger,
        recording(SequenceKind::Initialize, &order),
        || install,
        || recording(SequenceKind::Boot, &order),
    )
    .unwrap_err();
    assert!(matches!(
        error,
        SequenceError::Reboot {
            mode: RebootMode::Default
        }
    ));
    assert_eq!(*order.lock().unwrap(), [SequenceKind::Initialize]);
}

#[test]
fn boot_taken_over_by_reboot_is_not_an_error() {
    let lock = PriorityLock::new();
    let (started_tx, started_rx) = mpsc::channel();
    let boot = PhaseListBuilder::new()
        .append(
            "services",
            [Task::new("startServices", move |ctx| {
                started_tx.send(()).unwrap();
                ctx.sleep(Duration::from_secs(30))
            })],
        )
        .into_sequence(SequenceKind::Boot);
    thread::scope(|s| {
        let lock_ref = &lock;
        let api = s.spawn(move || {
            started_rx.recv().unwrap();
            lock_ref
                .try_lock(SequenceKind::Reboot)
                .map(|guard| guard.kind())
        });
        let outcome = run_boot(
            &lock,
            &NullLogger,
            Sequence::new(SequenceKind::Initialize, Vec::new()),
            || Sequence::new(SequenceKind::Install, Vec::new()),
            || boot,
        );
        assert_eq!(outcome.unwrap(), BootOutcome::BootCancelled);
        assert_eq!(api.join().unwrap(), Ok(SequenceKind::Reboot));
    });
}
