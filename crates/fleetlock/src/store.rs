//! Where semaphores live: one value per group, changed only by compare-and-swap against the
//! version that was read, so that several servers (or a server and `slate fleetlock release`)
//! can share one store. [`lock`] and [`unlock`] are the read–transition–swap loop over any
//! [`SemaphoreStore`]: the file store (`slate-fleetlock-server`), etcd, or [`MemStore`].
//!
//! Contention is made cheap without loosening that rule: a lost swap can answer what won
//! ([`Swap::LostTo`]), so the retry needs no read; the retries are spread by a short random
//! pause; and a store may keep [`Local`] turns, so that one server's requests on a group queue
//! instead of racing each other, and swap against the value the last of them saw.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use thiserror::Error;

use crate::request::{ClientId, GroupName};
use crate::semaphore::{Full, Semaphore, Transition};

/// How many swaps a lock or unlock makes before it gives up, each on the value the previous
/// one lost to. airlock tries once; a few more turn most races between servers into
/// successes, and the bound keeps a request from spinning (the client retries anyway).
pub const CAS_ATTEMPTS: usize = 8;

/// The version of a stored semaphore: changes with every successful write. Opaque to this crate
/// beyond equality (the file store counts writes; etcd's is the key's `mod_revision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u64);

/// Why a store could not answer. The text carries the cause (there is no `source` chain to
/// print it a second time).
#[derive(Debug, Error)]
pub enum StoreError {
    /// The stored bytes are not a valid semaphore ([`crate::SemaphoreError`], or a store's own
    /// record error).
    #[error("the stored semaphore of group {group} is corrupt: {reason}")]
    Corrupt { group: String, reason: String },
    #[error("{what}: {error}")]
    Backend {
        what: String,
        error: Box<dyn StdError + Send + Sync + 'static>,
    },
}

impl StoreError {
    pub fn backend(
        what: impl Into<String>,
        error: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        StoreError::Backend {
            what: what.into(),
            error: error.into(),
        }
    }
}

/// One semaphore per group, read and written whole.
///
/// Synchronous on purpose: the server calls it from blocking threads, and an async backend
/// (etcd's client) can block on its own runtime there.
pub trait SemaphoreStore: Send + Sync {
    /// The groups that have a stored semaphore, sorted (`slate fleetlock status`).
    fn groups(&self) -> Result<Vec<GroupName>, StoreError>;

    /// The group's semaphore and its version; `None` if it was never written.
    fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError>;

    /// Writes `new` if the stored version is still `expected` (`None`: still absent) and
    /// answers `true`; answers `false` and writes nothing if someone else changed it.
    fn compare_and_swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<bool, StoreError>;

    /// [`compare_and_swap`](Self::compare_and_swap), and on a lost swap what won, when the
    /// store has it in the same atomic step as the compare ([`Swap::LostTo`]): etcd as the
    /// `Else` branch of the swap's transaction, the file store under its lock. [`lock`] and
    /// [`unlock`] then retry on it without a read of their own, which under contention is one
    /// round trip of two. The default knows only that the swap was lost.
    fn swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<Swap, StoreError> {
        Ok(if self.compare_and_swap(group, expected, new)? {
            Swap::Swapped(None)
        } else {
            Swap::Lost
        })
    }

    /// The per-group turns and memory that this store value shares between its callers
    /// ([`Local`]), if it keeps them: worth it where a round trip is dear (etcd). The default
    /// keeps none, and every [`lock`] and [`unlock`] reads first and races the others.
    fn local(&self) -> Option<&Local> {
        None
    }
}

/// What a [`SemaphoreStore::swap`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// `new` is stored, at this version if the store knows it.
    Swapped(Option<Version>),
    /// Nothing was written: another writer changed the value since it was read.
    Lost,
    /// Nothing was written, and this is the value that stands (`None`: absent), read in the
    /// same atomic step as the failed compare: as good as a fresh [`SemaphoreStore::load`].
    LostTo(Option<(Version, Semaphore)>),
}

/// What a successful [`lock`] or [`unlock`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Locked,
    AlreadyHeld,
    Unlocked,
    NotHeld,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Locked => "locked",
            Change::AlreadyHeld => "already held",
            Change::Unlocked => "unlocked",
            Change::NotHeld => "not held",
        }
    }

    /// As a metric's label value.
    pub fn label(self) -> &'static str {
        match self {
            Change::Locked => "locked",
            Change::AlreadyHeld => "already_held",
            Change::Unlocked => "unlocked",
            Change::NotHeld => "not_held",
        }
    }
}

/// The outcome and the semaphore as it stands after it (`None`: an unlock in a group that
/// has no stored semaphore yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub change: Change,
    pub semaphore: Option<Semaphore>,
}

#[derive(Debug, Error)]
pub enum ApplyError {
    #[error(transparent)]
    Full(#[from] Full),
    /// airlock's text.
    #[error("conflict on semaphore detected, aborting")]
    Conflict,
    #[error("cannot read the semaphore: {0}")]
    Load(StoreError),
    #[error("cannot write the semaphore: {0}")]
    Write(StoreError),
}

/// `RecursiveLock` of `id` in `group` with the configured `slots`. An absent semaphore is
/// created by the same compare-and-swap (expected: absent).
pub fn lock(
    store: &dyn SemaphoreStore,
    group: &GroupName,
    id: &ClientId,
    slots: u64,
) -> Result<Applied, ApplyError> {
    transact(store, group, |current| {
        let current = current.cloned().unwrap_or_else(|| Semaphore::new(slots));
        Ok(match current.lock(id, slots)? {
            Transition::Unchanged => (Change::AlreadyHeld, None, Some(current)),
            Transition::Changed(new) => (Change::Locked, Some(new), None),
        })
    })
}

/// `UnlockIfHeld` of `id` in `group`. Nothing is written when `id` holds nothing, including
/// when the group has no semaphore yet.
pub fn unlock(
    store: &dyn SemaphoreStore,
    group: &GroupName,
    id: &str,
) -> Result<Applied, ApplyError> {
    transact(store, group, |current| {
        Ok(match current.map(|s| (s, s.unlock(id))) {
            None => (Change::NotHeld, None, None),
            Some((s, Transition::Unchanged)) => (Change::NotHeld, None, Some(s.clone())),
            Some((_, Transition::Changed(new))) => (Change::Unlocked, Some(new), None),
        })
    })
}

/// A step: the change, the value to write (if any), and the value to report when nothing is
/// written.
type Step = (Change, Option<Semaphore>, Option<Semaphore>);

fn transact(
    store: &dyn SemaphoreStore,
    group: &GroupName,
    step: impl Fn(Option<&Semaphore>) -> Result<Step, Full>,
) -> Result<Applied, ApplyError> {
    // Held for the whole read, transition and swap (see `Local`). `None` where the store keeps
    // no turns, or when this one was not given within the patience: then as if it kept none.
    let turn = store
        .local()
        .and_then(|local| local.turn(group, TURN_PATIENCE));
    let remember = |seen: Option<(Version, Semaphore)>| {
        if let Some(turn) = &turn {
            turn.remember(seen);
        }
    };
    let load = || -> Result<_, ApplyError> {
        let current = store.load(group).map_err(ApplyError::Load)?;
        remember(current.clone());
        Ok(current)
    };
    // `fresh`: `current` was read during this call (by a load, or by the swap that lost to
    // it), so an answer that writes nothing may rest on it. A remembered value was read or
    // written by an earlier call and may be older than another server's write: it only ever
    // names the version a swap expects, and that swap fails if anything changed since.
    let (mut current, mut fresh) = match turn.as_ref().and_then(Turn::seen) {
        Some(seen) => (Some(seen), false),
        None => (load()?, true),
    };
    let mut losses = 0;
    loop {
        let version = current.as_ref().map(|(v, _)| *v);
        let (change, new) = match step(current.as_ref().map(|(_, s)| s)) {
            Ok((change, Some(new), _)) => (change, new),
            _ if !fresh => {
                current = load()?;
                fresh = true;
                continue;
            }
            Ok((change, None, unchanged)) => {
                return Ok(Applied {
                    change,
                    semaphore: unchanged,
                })
            }
            Err(full) => return Err(full.into()),
        };
        let swap = store.swap(group, version, &new).map_err(|e| {
            // Made or not: nothing is known.
            remember(None);
            ApplyError::Write(e)
        })?;
        let winner = match swap {
            Swap::Swapped(at) => {
                remember(at.map(|v| (v, new.clone())));
                return Ok(Applied {
                    change,
                    semaphore: Some(new),
                });
            }
            Swap::LostTo(winner) => {
                remember(winner.clone());
                Some(winner)
            }
            Swap::Lost => {
                remember(None);
                None
            }
        };
        losses += 1;
        if losses == CAS_ATTEMPTS {
            return Err(ApplyError::Conflict);
        }
        std::thread::sleep(jitter(backoff_ceiling(losses), random()));
        current = match winner {
            Some(winner) => winner,
            None => load()?,
        };
        fresh = true;
    }
}

/// The pause after the first lost swap in a row is random up to this, doubling after each
/// further loss up to [`MAX_BACKOFF`]: writers that lost to the same winner then come back
/// spread out instead of all at once, to mostly lose again (each loss a round trip, for etcd a
/// Raft proposal). Every pause of one call together stays under 64 ms.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);
const MAX_BACKOFF: Duration = Duration::from_millis(16);

/// The most a pause after the `losses`-th lost swap in a row (from 1) may last.
fn backoff_ceiling(losses: usize) -> Duration {
    let doublings = u32::try_from(losses.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(8);
    (FIRST_BACKOFF * (1 << doublings)).min(MAX_BACKOFF)
}

/// A pause from 0 to `ceiling`, by `random`.
fn jitter(ceiling: Duration, random: u64) -> Duration {
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random % nanos.saturating_add(1))
}

/// Random enough for jitter, without a dependency: every `RandomState` has its own keys
/// (random per thread, then counted up), so the hash of nothing differs each call.
fn random() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// How long [`lock`] and [`unlock`] wait for a group's turn ([`Local`]) before they go ahead
/// without it. A turn normally lasts a swap or two (milliseconds); a store that does not
/// answer holds it for its whole retry budget, and the callers queued behind it would then
/// wait one budget each. Past this they race as if there were no turns.
pub const TURN_PATIENCE: Duration = Duration::from_secs(1);

/// What the callers of one store value (one server's requests) share per group, so that they
/// do not race each other's compare-and-swaps. N callers on one group would otherwise swap
/// against the same version; one wins, N−1 lose and go round again, every one of them a round
/// trip to the store (and for etcd a Raft proposal). Instead:
///
/// - a **turn**: a caller waits for the group's turn (at most [`TURN_PATIENCE`]) and holds it
///   for its read, transition and swap;
/// - a **memory**: the value and version last read, written or lost to in a turn, which the
///   next turn swaps against without reading first (the round trip of a read saved, the
///   common case when this server is the only writer).
///
/// Neither weakens the compare-and-swap: other servers are not in the queue, a remembered
/// value is only ever the version a swap expects (the swap fails if anything changed it
/// since), and an answer that writes nothing (already held, not held, full) always rests on a
/// read made during the request.
#[derive(Debug, Default)]
pub struct Local {
    /// One entry per group ever locked or unlocked through this store value: the configured
    /// groups, and those `slate fleetlock release` names.
    groups: Mutex<BTreeMap<GroupName, Arc<Queue>>>,
}

#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
    free: Condvar,
}

#[derive(Debug, Default)]
struct QueueState {
    busy: bool,
    /// A version and the value stored at it, exactly: a swap on a wrong pair would write a
    /// transition of a value that was never stored.
    seen: Option<(Version, Semaphore)>,
}

impl Local {
    pub fn new() -> Self {
        Self::default()
    }

    /// `group`'s turn, waited for up to `patience`; `None` if it is still taken then.
    fn turn(&self, group: &GroupName, patience: Duration) -> Option<Turn> {
        let queue = unpoisoned(&self.groups)
            .entry(group.clone())
            .or_default()
            .clone();
        let state = unpoisoned(&queue.state);
        let (mut state, _) = queue
            .free
            .wait_timeout_while(state, patience, |s| s.busy)
            .unwrap_or_else(|e| e.into_inner());
        if state.busy {
            return None;
        }
        state.busy = true;
        drop(state);
        Some(Turn { queue })
    }
}

/// Every critical section here is a single assignment or insert, so a poisoned mutex still
/// holds a consistent value.
fn unpoisoned<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A group's turn, given back when dropped (a panic included).
struct Turn {
    queue: Arc<Queue>,
}

impl Turn {
    fn seen(&self) -> Option<(Version, Semaphore)> {
        unpoisoned(&self.queue.state).seen.clone()
    }

    fn remember(&self, seen: Option<(Version, Semaphore)>) {
        unpoisoned(&self.queue.state).seen = seen;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        unpoisoned(&self.queue.state).busy = false;
        self.queue.free.notify_one();
    }
}

/// A store in memory: for tests, and for a server that needs no persistence.
#[derive(Debug, Default)]
pub struct MemStore {
    groups: Mutex<BTreeMap<GroupName, (Version, Semaphore)>>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<GroupName, (Version, Semaphore)>> {
        // A panic while holding the lock cannot leave a half-written entry (each write is one
        // insert), so a poisoned map is still consistent.
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SemaphoreStore for MemStore {
    fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
        Ok(self.map().keys().cloned().collect())
    }

    fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
        Ok(self.map().get(group).cloned())
    }

    fn compare_and_swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<bool, StoreError> {
        let mut map = self.map();
        let current = map.get(group).map(|(v, _)| *v);
        if current != expected {
            return Ok(false);
        }
        let next = Version(current.map_or(1, |v| v.0 + 1));
        map.insert(group.clone(), (next, new.clone()));
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
