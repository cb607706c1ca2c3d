//! Acceptance tests of the priority lock and the takeover matrix.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use slate_sequencer::{
    can_take_over, LockError, NullLogger, PhaseListBuilder, PriorityLock, SequenceError,
    SequenceKind, Task,
};
use SequenceKind::*;

/// The seed's matrix, written out independently of the implementation: (running, requested).
const YIELDS: [(SequenceKind, SequenceKind); 6] = [
    (Boot, Reboot),
    (Boot, Reset),
    (Boot, Upgrade),
    (Boot, EmergencyVolumeCleanup),
    (Reboot, Reboot),
    (Reset, Reboot),
];

fn expected(running: SequenceKind, requested: SequenceKind) -> bool {
    YIELDS.contains(&(running, requested))
}

#[test]
fn takeover_matrix_every_pair() {
    let mut yes = 0;
    for running in SequenceKind::ALL {
        for requested in SequenceKind::ALL {
            assert_eq!(
                can_take_over(running, requested),
                expected(running, requested),
                "running {running}, requested {requested}"
            );
            yes += usize::from(can_take_over(running, requested));
        }
    }
    assert_eq!(yes, 6, "exactly the six listed yields");
    assert_eq!(SequenceKind::ALL.len(), 9);
}

#[test]
fn lock_matrix_every_pair_without_blocking() {
    // For every pair through the lock itself: refused pairs must fail at once naming the
    // running sequence and leave it uncancelled; allowed pairs must cancel it.
    for running in SequenceKind::ALL {
        for requested in SequenceKind::ALL {
            let lock = PriorityLock::with_takeover_timeout(Duration::from_millis(20));
            let held = lock.try_lock(running).unwrap();
            let result = lock.try_lock(requested);
            if expected(running, requested) {
                // The holder is still here, so the takeover times out — after cancelling it.
                assert_eq!(result.unwrap_err(), LockError::TakeoverTimeout { running });
                assert!(held.token().is_cancelled(), "{running} <- {requested}");
            } else {
                assert_eq!(result.unwrap_err(), LockError::Locked { running });
                assert!(!held.token().is_cancelled(), "{running} <- {requested}");
            }
            assert_eq!(lock.running(), Some(running));
        }
    }
}

#[test]
fn locked_error_names_the_running_sequence() {
    let lock = PriorityLock::new();
    let upgrade = lock.try_lock(Upgrade).unwrap();
    let error = lock.try_lock(Reset).unwrap_err();
    assert_eq!(error, LockError::Locked { running: Upgrade });
    assert_eq!(error.to_string(), "locked: the upgrade sequence is running");
    let error = SequenceError::from(error);
    assert!(error.is_swallowed());
    assert!(!upgrade.token().is_cancelled());
    drop(upgrade);
    assert_eq!(lock.running(), None);
    let reset = lock.try_lock(Reset).unwrap();
    assert_eq!(reset.kind(), Reset);
}

#[test]
fn takeover_cancels_the_holder_and_is_granted_after_release() {
    let lock = PriorityLock::new();
    let released = AtomicBool::new(false);
    let (held_tx, held_rx) = mpsc::channel();
    thread::scope(|s| {
        s.spawn(|| {
            let guard = lock.try_lock(Boot).unwrap();
            held_tx.send(()).unwrap();
            // A running Boot: works until it is told to stop.
            assert!(guard.token().wait_timeout(Duration::from_secs(30)));
            thread::sleep(Duration::from_millis(50));
            released.store(true, Ordering::SeqCst);
            drop(guard);
        });
        held_rx.recv().unwrap();
        let reboot = lock.try_lock(Reboot).unwrap();
        assert!(
            released.load(Ordering::SeqCst),
            "granted before the holder released"
        );
        assert_eq!(lock.running(), Some(Reboot));
        assert!(!reboot.token().is_cancelled());
    });
}

#[test]
fn lock_with_takeover_always_wins() {
    for running in SequenceKind::ALL {
        let lock = PriorityLock::new();
        let (held_tx, held_rx) = mpsc::channel();
        thread::scope(|s| {
            s.spawn(|| {
                let guard = lock.try_lock(running).unwrap();
                held_tx.send(()).unwrap();
                assert!(guard.token().wait_timeout(Duration::from_secs(30)));
            });
            held_rx.recv().unwrap();
            // Shutdown may take over nothing through the matrix.
            assert!(lock.try_lock(Shutdown).is_err());
            let guard = lock.lock_with_takeover(Shutdown).unwrap();
            assert_eq!(guard.kind(), Shutdown);
        });
    }
}

#[test]
fn a_pending_takeover_counts_as_running() {
    let lock = PriorityLock::new();
    let (held_tx, held_rx) = mpsc::channel();
    let (cancelled_tx, cancelled_rx) = mpsc::channel();
    thread::scope(|s| {
        s.spawn(|| {
            let guard = lock.try_lock(Boot).unwrap();
            held_tx.send(()).unwrap();
            assert!(guard.token().wait_timeout(Duration::from_secs(30)));
            cancelled_tx.send(()).unwrap();
            // Release late, so the Upgrade below arrives while Reboot waits.
            thread::sleep(Duration::from_millis(100));
        });
        held_rx.recv().unwrap();
        let reboot = s.spawn(|| lock.try_lock(Reboot).map(|guard| guard.kind()));
        cancelled_rx.recv().unwrap();
        // Boot alone would yield to Upgrade; the pending Reboot does not.
        assert_eq!(
            lock.try_lock(Upgrade).unwrap_err(),
            LockError::Locked { running: Reboot }
        );
        assert_eq!(reboot.join().unwrap(), Ok(Reboot));
    });
}

#[test]
fn run_releases_the_lock_and_reports_locked() {
    let lock = PriorityLock::new();
    let inner = lock.clone();
    let seen = std::sync::Mutex::new(None);
    let sequence = PhaseListBuilder::new()
        .append(
            "probe",
            [Task::new("probe", |_| {
                *seen.lock().unwrap() = Some((inner.running(), inner.try_lock(Install).err()));
                Ok(())
            })],
        )
        .into_sequence(Upgrade);
    lock.run(sequence, &NullLogger).unwrap();
    assert_eq!(
        seen.into_inner().unwrap(),
        Some((Some(Upgrade), Some(LockError::Locked { running: Upgrade })))
    );
    assert_eq!(lock.running(), None);
}
