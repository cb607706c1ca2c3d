//! Cancellation tokens: the thread-based stand-in for Go's `context.Context` cancellation.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// A cloneable, thread-safe cancellation flag.
///
/// Clones share one flag. A [`child`](Self::child) token is cancelled with its parent but can
/// also be cancelled on its own; the runner gives every phase a child of the sequence token so a
/// failing task can stop its siblings without cancelling the sequence (and so without looking
/// like a takeover to the caller).
///
/// Cancellation is cooperative: nothing is interrupted, tasks poll
/// [`is_cancelled`](Self::is_cancelled) or sleep through [`wait_timeout`](Self::wait_timeout).
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    cancelled_cv: Condvar,
}

#[derive(Default)]
struct State {
    cancelled: bool,
    children: Vec<Weak<Inner>>,
}

impl Inner {
    /// Poisoning only says another thread panicked while holding the lock; the state is a bool
    /// and a list, both always consistent, and PID 1 must not panic because a task did.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl CancelToken {
    /// A fresh, uncancelled token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels this token and every child derived from it. Idempotent.
    pub fn cancel(&self) {
        let children = {
            let mut state = self.inner.state();
            if state.cancelled {
                return;
            }
            state.cancelled = true;
            std::mem::take(&mut state.children)
        };
        self.inner.cancelled_cv.notify_all();
        // Outside the lock: a child's cancel takes the child's lock, and holding two locks in
        // parent → child order is safe but needless.
        for child in children.iter().filter_map(Weak::upgrade) {
            CancelToken { inner: child }.cancel();
        }
    }

    /// Whether [`cancel`](Self::cancel) was called on this token or an ancestor.
    pub fn is_cancelled(&self) -> bool {
        self.inner.state().cancelled
    }

    /// A new token cancelled when this one is (immediately, if it already is), which can also
    /// be cancelled on its own without affecting this one.
    pub fn child(&self) -> CancelToken {
        let child = CancelToken::new();
        let mut state = self.inner.state();
        if state.cancelled {
            child.inner.state().cancelled = true;
        } else {
            // Weak links, pruned here, so a long-lived parent does not accumulate dead children.
            state.children.retain(|weak| weak.strong_count() > 0);
            state.children.push(Arc::downgrade(&child.inner));
        }
        child
    }

    /// Blocks until the token is cancelled or `timeout` elapses; returns whether it is
    /// cancelled. Tasks use it instead of `thread::sleep` so a takeover is not held up.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.inner.state();
        while !state.cancelled {
            let remaining = match deadline {
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(remaining) if !remaining.is_zero() => remaining,
                    _ => return false,
                },
                // A timeout too large to represent: wait in long slices.
                None => Duration::from_secs(3600),
            };
            state = self
                .inner
                .cancelled_cv
                .wait_timeout(state, remaining)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Blocks until the token is cancelled.
    pub fn wait(&self) {
        let mut state = self.inner.state();
        while !state.cancelled {
            state = self
                .inner
                .cancelled_cv
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn clones_share_the_flag() {
        let token = CancelToken::new();
        let clone = token.clone();
        assert!(!token.is_cancelled());
        clone.cancel();
        assert!(token.is_cancelled());
    }

    #[test]
    fn parent_cancels_child_but_not_the_reverse() {
        let parent = CancelToken::new();
        let child = parent.child();
        let sibling = parent.child();
        child.cancel();
        assert!(!parent.is_cancelled());
        assert!(!sibling.is_cancelled());
        let grandchild = sibling.child();
        parent.cancel();
        assert!(sibling.is_cancelled());
        assert!(grandchild.is_cancelled());
        assert!(
            parent.child().is_cancelled(),
            "child of a cancelled token starts cancelled"
        );
    }

    #[test]
    fn wait_timeout_times_out_and_wakes_on_cancel() {
        let token = CancelToken::new();
        assert!(!token.wait_timeout(Duration::from_millis(10)));
        let child = token.child();
        thread::scope(|s| {
            let waiter = s.spawn(|| child.wait_timeout(Duration::from_secs(30)));
            token.cancel();
            assert!(waiter.join().unwrap());
        });
        child.wait();
    }
}
