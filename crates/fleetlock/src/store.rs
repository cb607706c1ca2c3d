//! Where semaphores live: one value per group, changed only by compare-and-swap against the
//! version that was read, so that several servers (or a server and `slate fleetlock release`)
//! can share one store. [`lock`] and [`unlock`] are the read–transition–swap loop over any
//! [`SemaphoreStore`]: the file store (`slate-fleetlock-server`), etcd, or [`MemStore`].

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::sync::Mutex;

use thiserror::Error;

use crate::request::{ClientId, GroupName};
use crate::semaphore::{Full, Semaphore, Transition};

/// How many times a transition is re-read and re-tried when another writer changed the
/// semaphore in between. airlock tries once; a few more turn most races between servers into
/// successes, and the bound keeps a request from spinning (the client retries anyway).
pub const CAS_ATTEMPTS: usize = 8;

/// The version of a stored semaphore: changes with every successful write. Opaque to this crate
/// beyond equality (the file store counts writes; etcd has the key's version).
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
    for _ in 0..CAS_ATTEMPTS {
        let current = store.load(group).map_err(ApplyError::Load)?;
        let (version, semaphore) = match current {
            Some((v, s)) => (Some(v), Some(s)),
            None => (None, None),
        };
        let (change, write, unchanged) = step(semaphore.as_ref())?;
        let Some(new) = write else {
            return Ok(Applied {
                change,
                semaphore: unchanged,
            });
        };
        if store
            .compare_and_swap(group, version, &new)
            .map_err(ApplyError::Write)?
        {
            return Ok(Applied {
                change,
                semaphore: Some(new),
            });
        }
    }
    Err(ApplyError::Conflict)
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

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<GroupName, (Version, Semaphore)>> {
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
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn id(s: &str) -> ClientId {
        ClientId::new(s).unwrap()
    }

    fn g() -> GroupName {
        GroupName::default_group()
    }

    #[test]
    fn lock_creates_then_recurses_then_fills() {
        let store = MemStore::new();
        let a = lock(&store, &g(), &id("a"), 1).unwrap();
        assert_eq!(a.change, Change::Locked);
        assert_eq!(store.load(&g()).unwrap().unwrap().0, Version(1));
        let again = lock(&store, &g(), &id("a"), 1).unwrap();
        assert_eq!(again.change, Change::AlreadyHeld);
        assert_eq!(again.semaphore.unwrap().holders(), ["a"]);
        assert_eq!(store.load(&g()).unwrap().unwrap().0, Version(1), "no write");
        let full = lock(&store, &g(), &id("b"), 1).unwrap_err();
        assert_eq!(full.to_string(), "all 1 semaphore slots currently locked");
    }

    #[test]
    fn unlock_writes_only_real_changes() {
        let store = MemStore::new();
        let none = unlock(&store, &g(), "a").unwrap();
        assert_eq!((none.change, none.semaphore), (Change::NotHeld, None));
        assert!(store.groups().unwrap().is_empty(), "nothing created");
        lock(&store, &g(), &id("a"), 2).unwrap();
        let other = unlock(&store, &g(), "b").unwrap();
        assert_eq!(other.change, Change::NotHeld);
        assert_eq!(store.load(&g()).unwrap().unwrap().0, Version(1));
        let done = unlock(&store, &g(), "a").unwrap();
        assert_eq!(done.change, Change::Unlocked);
        assert_eq!(store.load(&g()).unwrap().unwrap().0, Version(2));
    }

    /// A store whose first `n` swaps lose a race: another writer changed the value.
    struct Racy {
        inner: MemStore,
        losses: AtomicUsize,
    }

    impl SemaphoreStore for Racy {
        fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
            self.inner.groups()
        }
        fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
            self.inner.load(group)
        }
        fn compare_and_swap(
            &self,
            group: &GroupName,
            expected: Option<Version>,
            new: &Semaphore,
        ) -> Result<bool, StoreError> {
            if let Ok(n) = self
                .losses
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            {
                // Another writer took a slot between our read and our swap.
                lock(&self.inner, group, &id(&format!("other{n}")), 2).unwrap();
                return Ok(false);
            }
            self.inner.compare_and_swap(group, expected, new)
        }
    }

    #[test]
    fn a_lost_race_is_retried_on_the_new_value() {
        let store = Racy {
            inner: MemStore::new(),
            losses: AtomicUsize::new(1),
        };
        let a = lock(&store, &g(), &id("a"), 2).unwrap();
        assert_eq!(a.semaphore.unwrap().holders(), ["a", "other1"]);
        // Two losses fill the group: the retry sees it full.
        let store = Racy {
            inner: MemStore::new(),
            losses: AtomicUsize::new(2),
        };
        assert!(matches!(
            lock(&store, &g(), &id("a"), 2),
            Err(ApplyError::Full(Full { slots: 2 }))
        ));
    }

    struct AlwaysLoses(MemStore);

    impl SemaphoreStore for AlwaysLoses {
        fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
            self.0.groups()
        }
        fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
            self.0.load(group)
        }
        fn compare_and_swap(
            &self,
            _: &GroupName,
            _: Option<Version>,
            _: &Semaphore,
        ) -> Result<bool, StoreError> {
            Ok(false)
        }
    }

    #[test]
    fn endless_conflicts_give_up() {
        let err = lock(&AlwaysLoses(MemStore::new()), &g(), &id("a"), 1).unwrap_err();
        assert!(matches!(err, ApplyError::Conflict));
        assert_eq!(err.to_string(), "conflict on semaphore detected, aborting");
    }
}
