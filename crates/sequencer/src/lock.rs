//! The priority lock: one sequence at a time, with takeover by the seed's matrix.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::cancel::CancelToken;
use crate::error::{LockError, SequenceError};
use crate::kind::{can_take_over, SequenceKind};
use crate::log::Logger;
use crate::phase::Sequence;

/// At most one sequence runs at a time; some may preempt others.
///
/// A request is granted at once when nothing runs. When something runs, the request may take
/// it over only as [`can_take_over`] allows (or always, with
/// [`lock_with_takeover`](Self::lock_with_takeover)): the running sequence's token is cancelled,
/// the request blocks until that sequence drops its guard, and then it is granted. Otherwise it
/// fails at once with [`LockError::Locked`].
///
/// While one takeover is waiting, it counts as the running sequence: a request it does not
/// yield to is refused naming it, one it does yield to waits for it to be granted and then
/// takes over again. So two requests never both cancel the same victim and race for the lock.
///
/// Waiting for a release is bounded by the takeover timeout (default
/// [`DEFAULT_TAKEOVER_TIMEOUT`](Self::DEFAULT_TAKEOVER_TIMEOUT)): cancellation is cooperative,
/// and one task that ignores it must not wedge every later request, SIGTERM included.
///
/// A cheap handle: clones share the same lock. Guards own a handle too, so a guard can be
/// moved to the thread that runs the sequence.
#[derive(Clone)]
pub struct PriorityLock {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<LockState>,
    /// Signalled when the holder releases and when a pending takeover ends.
    changed: Condvar,
    takeover_timeout: Duration,
}

#[derive(Default)]
struct LockState {
    holder: Option<Holder>,
    /// The kind of a request that has cancelled the holder and waits for it to release.
    pending: Option<SequenceKind>,
    next_id: u64,
}

struct Holder {
    kind: SequenceKind,
    token: CancelToken,
    id: u64,
}

impl Default for PriorityLock {
    fn default() -> Self {
        Self::new()
    }
}

impl PriorityLock {
    /// How long a takeover waits for the running sequence to stop, by default.
    pub const DEFAULT_TAKEOVER_TIMEOUT: Duration = Duration::from_secs(60);

    /// A free lock with the default takeover timeout.
    pub fn new() -> Self {
        Self::with_takeover_timeout(Self::DEFAULT_TAKEOVER_TIMEOUT)
    }

    /// A free lock whose takeovers wait at most `timeout` (`Duration::MAX`: forever).
    pub fn with_takeover_timeout(timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(LockState::default()),
                changed: Condvar::new(),
                takeover_timeout: timeout,
            }),
        }
    }

    /// The sequence holding the lock, if any (for the status API).
    pub fn running(&self) -> Option<SequenceKind> {
        self.state().holder.as_ref().map(|holder| holder.kind)
    }

    /// Acquires the lock for `kind`, taking over the running sequence if the matrix allows it.
    /// May block (up to the takeover timeout) while a taken-over sequence stops.
    ///
    /// Called by the thread that holds the lock, a request that takes itself over (reboot
    /// during reboot) waits for its own release and times out: acquire from another thread.
    pub fn try_lock(&self, kind: SequenceKind) -> Result<SequenceGuard, LockError> {
        self.acquire(kind, false)
    }

    /// Acquires the lock for `kind`, taking over whatever runs regardless of the matrix — the
    /// escape hatch for SIGTERM and the ACPI power button.
    pub fn lock_with_takeover(&self, kind: SequenceKind) -> Result<SequenceGuard, LockError> {
        self.acquire(kind, true)
    }

    /// Runs `sequence` under the lock ([`try_lock`](Self::try_lock) rules), releasing it after.
    pub fn run(&self, sequence: Sequence<'_>, logger: &dyn Logger) -> Result<(), SequenceError> {
        let guard = self.try_lock(sequence.kind())?;
        sequence.run(guard.token(), logger)
    }

    /// Runs `sequence` under the lock, taking over whatever runs.
    pub fn run_with_takeover(
        &self,
        sequence: Sequence<'_>,
        logger: &dyn Logger,
    ) -> Result<(), SequenceError> {
        let guard = self.lock_with_takeover(sequence.kind())?;
        sequence.run(guard.token(), logger)
    }

    fn state(&self) -> MutexGuard<'_, LockState> {
        // Nothing panics while holding this lock; recovering keeps PID 1 alive regardless.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire(&self, kind: SequenceKind, force: bool) -> Result<SequenceGuard, LockError> {
        // None when the timeout does not fit in an Instant: wait without a deadline.
        let deadline = Instant::now().checked_add(self.shared.takeover_timeout);
        let mut state = self.state();

        while let Some(pending) = state.pending {
            if !force && !can_take_over(pending, kind) {
                return Err(LockError::Locked { running: pending });
            }
            let timed_out;
            (state, timed_out) = self.wait(state, deadline);
            if timed_out && state.pending.is_some() {
                return Err(LockError::TakeoverTimeout { running: pending });
            }
        }

        if let Some(holder) = &state.holder {
            let running = holder.kind;
            if !force && !can_take_over(running, kind) {
                return Err(LockError::Locked { running });
            }
            holder.token.cancel();
            state.pending = Some(kind);
            while state.holder.is_some() {
                let timed_out;
                (state, timed_out) = self.wait(state, deadline);
                if timed_out && state.holder.is_some() {
                    state.pending = None;
                    drop(state);
                    self.shared.changed.notify_all();
                    return Err(LockError::TakeoverTimeout { running });
                }
            }
            state.pending = None;
            // Requests queued behind this takeover re-evaluate against the new holder.
            self.shared.changed.notify_all();
        }

        let id = state.next_id;
        state.next_id += 1;
        let token = CancelToken::new();
        state.holder = Some(Holder {
            kind,
            token: token.clone(),
            id,
        });
        Ok(SequenceGuard {
            lock: self.clone(),
            kind,
            token,
            id,
        })
    }

    /// One wait on the condvar, bounded by `deadline`; returns whether the deadline passed.
    fn wait<'g>(
        &self,
        state: MutexGuard<'g, LockState>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'g, LockState>, bool) {
        let Some(deadline) = deadline else {
            let state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            return (state, false);
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return (state, true);
        }
        let (state, result) = self
            .shared
            .changed
            .wait_timeout(state, remaining)
            .unwrap_or_else(PoisonError::into_inner);
        (state, result.timed_out())
    }

    fn release(&self, id: u64) {
        let mut state = self.state();
        if state.holder.as_ref().is_some_and(|holder| holder.id == id) {
            if let Some(holder) = state.holder.take() {
                // Whatever the sequence left behind (a stray helper thread) learns it is over.
                holder.token.cancel();
            }
            drop(state);
            self.shared.changed.notify_all();
        }
    }
}

impl fmt::Debug for PriorityLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("PriorityLock")
            .field("running", &state.holder.as_ref().map(|holder| holder.kind))
            .field("pending_takeover", &state.pending)
            .field("takeover_timeout", &self.shared.takeover_timeout)
            .finish()
    }
}

/// Proof of holding the [`PriorityLock`]; released on drop.
///
/// Run the sequence with [`token`](Self::token): it is cancelled when another request takes
/// the lock over, and the taker waits until this guard is dropped.
pub struct SequenceGuard {
    lock: PriorityLock,
    kind: SequenceKind,
    token: CancelToken,
    id: u64,
}

impl SequenceGuard {
    /// The sequence holding the lock.
    pub fn kind(&self) -> SequenceKind {
        self.kind
    }

    /// The holder's cancellation token, cancelled on takeover.
    pub fn token(&self) -> &CancelToken {
        &self.token
    }
}

impl Drop for SequenceGuard {
    fn drop(&mut self) {
        self.lock.release(self.id);
    }
}

impl fmt::Debug for SequenceGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequenceGuard")
            .field("kind", &self.kind)
            .field("cancelled", &self.token.is_cancelled())
            .finish()
    }
}
