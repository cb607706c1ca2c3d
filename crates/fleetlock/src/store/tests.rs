//! `lock` and `unlock` over `MemStore` and over stores that lose races on cue: retries on what
//! won and how many reads and swaps they take, turns and memory, the pauses between losses.

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

/// A store with everything a store may offer: swaps that answer what won, optionally
/// turns and memory; and counters. Before each of the next `rivals` swaps another writer
/// locks `otherN`, as another server would between a read and a swap.
#[derive(Default)]
struct Counted {
    inner: MemStore,
    local: Option<Local>,
    loads: AtomicUsize,
    swaps: AtomicUsize,
    lost: AtomicUsize,
    rivals: AtomicUsize,
}

impl Counted {
    fn with_turns() -> Self {
        Counted {
            local: Some(Local::new()),
            ..Counted::default()
        }
    }

    /// (loads, swaps, lost swaps) so far.
    fn counts(&self) -> (usize, usize, usize) {
        (
            self.loads.load(Ordering::SeqCst),
            self.swaps.load(Ordering::SeqCst),
            self.lost.load(Ordering::SeqCst),
        )
    }

    /// A write by another server: this store's memory does not see it.
    fn rival_locks(&self, who: &str) {
        lock(&self.inner, &g(), &id(who), 16).unwrap();
    }
}

impl SemaphoreStore for Counted {
    fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
        self.inner.groups()
    }
    fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.inner.load(group)
    }
    fn compare_and_swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<bool, StoreError> {
        Ok(matches!(self.swap(group, expected, new)?, Swap::Swapped(_)))
    }
    fn swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<Swap, StoreError> {
        self.swaps.fetch_add(1, Ordering::SeqCst);
        if let Ok(n) = self
            .rivals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        {
            self.rival_locks(&format!("other{n}"));
        }
        // Compare and write, or answer what stands, under one lock: one atomic step.
        let mut map = self.inner.map();
        let current = map.get(group).cloned();
        if current.as_ref().map(|(v, _)| *v) != expected {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Ok(Swap::LostTo(current));
        }
        let next = Version(current.map_or(1, |(v, _)| v.0 + 1));
        map.insert(group.clone(), (next, new.clone()));
        Ok(Swap::Swapped(Some(next)))
    }
    fn local(&self) -> Option<&Local> {
        self.local.as_ref()
    }
}

#[test]
fn a_lost_swap_answers_the_winner() {
    let store = Counted::default();
    lock(&store, &g(), &id("a"), 2).unwrap();
    let (v1, one) = store.inner.load(&g()).unwrap().unwrap();
    store.rival_locks("b");
    let (v2, two) = store.inner.load(&g()).unwrap().unwrap();
    assert_eq!(two.holders(), ["a", "b"]);
    let Transition::Changed(stale) = one.unlock("a") else {
        panic!("a holds")
    };
    assert_eq!(
        store.swap(&g(), Some(v1), &stale).unwrap(),
        Swap::LostTo(Some((v2, two.clone())))
    );
    assert_eq!(
        store.swap(&g(), None, &stale).unwrap(),
        Swap::LostTo(Some((v2, two))),
        "no longer absent"
    );
    assert!(!store.compare_and_swap(&g(), Some(v1), &stale).unwrap());
}

#[test]
fn the_retry_goes_on_what_won_without_a_read() {
    let store = Counted::default();
    store.rivals.store(1, Ordering::SeqCst);
    let a = lock(&store, &g(), &id("a"), 2).unwrap();
    assert_eq!(a.change, Change::Locked);
    assert_eq!(a.semaphore.unwrap().holders(), ["a", "other1"]);
    // One read, the first swap lost to the rival's creation, the second made on it.
    assert_eq!(store.counts(), (1, 2, 1));

    // What won decides without a write too: full, on the one read made.
    let store = Counted::default();
    store.rival_locks("x");
    store.rivals.store(1, Ordering::SeqCst);
    assert!(matches!(
        lock(&store, &g(), &id("a"), 2),
        Err(ApplyError::Full(Full { slots: 2 }))
    ));
    assert_eq!(store.counts(), (1, 1, 1));

    // Unlock: the same.
    store.inner.map().clear();
    lock(&store, &g(), &id("a"), 3).unwrap();
    let (loads, swaps, lost) = store.counts();
    store.rivals.store(1, Ordering::SeqCst);
    let done = unlock(&store, &g(), "a").unwrap();
    assert_eq!(done.change, Change::Unlocked);
    assert_eq!(done.semaphore.unwrap().holders(), ["other1"]);
    assert_eq!(store.counts(), (loads + 1, swaps + 2, lost + 1));
}

#[test]
fn a_turn_swaps_against_what_the_last_one_saw() {
    let store = Counted::with_turns();
    lock(&store, &g(), &id("a"), 2).unwrap();
    assert_eq!(store.counts(), (1, 1, 0), "nothing remembered yet: read");
    unlock(&store, &g(), "a").unwrap();
    lock(&store, &g(), &id("b"), 2).unwrap();
    assert_eq!(
        store.counts(),
        (1, 3, 0),
        "its own writes remembered: no read"
    );
    assert_eq!(store.inner.load(&g()).unwrap().unwrap().1.holders(), ["b"]);

    // Another server writes: the remembered version is stale, the swap on it is lost, and
    // what it lost to is the next guess.
    store.rival_locks("r");
    let c = lock(&store, &g(), &id("c"), 3).unwrap();
    assert_eq!(c.semaphore.unwrap().holders(), ["b", "c", "r"]);
    assert_eq!(store.counts(), (1, 5, 1));
    unlock(&store, &g(), "c").unwrap();
    assert_eq!(store.counts(), (1, 6, 1));
}

#[test]
fn what_writes_nothing_is_never_answered_from_memory() {
    let store = Counted::with_turns();
    lock(&store, &g(), &id("a"), 2).unwrap();
    store.rival_locks("b");
    // Remembered: only a holds. Stored: a and b. Unlocking b from memory would be "not
    // held", and b would keep its slot: it is read, and released.
    let b = unlock(&store, &g(), "b").unwrap();
    assert_eq!(b.change, Change::Unlocked);
    assert_eq!(store.counts(), (2, 2, 0));
    // Held per memory: read before answering "already held".
    store.inner.map().clear();
    let a = lock(&store, &g(), &id("a"), 2).unwrap();
    assert_eq!(a.change, Change::Locked, "the rival's reset was seen");
    assert_eq!(store.counts(), (3, 3, 0));
    // Full per memory: read before refusing.
    store.rival_locks("b");
    store.rival_locks("c");
    let full = lock(&store, &g(), &id("d"), 1);
    assert!(matches!(full, Err(ApplyError::Full(Full { slots: 1 }))));
    assert_eq!(store.counts(), (4, 3, 0));
    // Not held per memory, nor per the read: nothing written.
    let d = unlock(&store, &g(), "d").unwrap();
    assert_eq!(d.change, Change::NotHeld);
    assert_eq!(store.counts(), (5, 3, 0));
}

#[test]
fn callers_of_one_store_take_turns_instead_of_racing() {
    let store = Counted::with_turns();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let store = &store;
            scope.spawn(move || {
                for n in 0..25 {
                    let who = format!("t{t}-{n}");
                    lock(store, &g(), &id(&who), 8).unwrap();
                    unlock(store, &g(), &who).unwrap();
                }
            });
        }
    });
    let (loads, swaps, lost) = store.counts();
    assert_eq!((swaps, lost), (400, 0), "{loads} loads");
    assert_eq!(
        loads, 1,
        "only the first read: every later turn knew the value"
    );
    assert!(store
        .inner
        .load(&g())
        .unwrap()
        .unwrap()
        .1
        .holders()
        .is_empty());
}

#[test]
fn a_turn_is_waited_for_only_so_long() {
    let local = Local::new();
    let held = local.turn(&g(), Duration::ZERO).unwrap();
    let other = GroupName::new("other").unwrap();
    assert!(local.turn(&other, Duration::ZERO).is_some(), "per group");
    let start = std::time::Instant::now();
    assert!(local.turn(&g(), Duration::from_millis(20)).is_none());
    assert!(start.elapsed() >= Duration::from_millis(20));
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| local.turn(&g(), Duration::from_secs(30)).is_some());
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(waiter.join().unwrap(), "given back, and passed on");
    });
    assert!(local.turn(&g(), Duration::ZERO).is_some());
}

#[test]
fn pauses_between_lost_swaps_are_short_and_bounded() {
    let ms = Duration::from_millis;
    let ceilings: Vec<Duration> = (1..CAS_ATTEMPTS).map(backoff_ceiling).collect();
    assert_eq!(
        ceilings,
        [ms(1), ms(2), ms(4), ms(8), ms(16), ms(16), ms(16)]
    );
    assert!(ceilings.iter().sum::<Duration>() < ms(64));
    assert_eq!(backoff_ceiling(usize::MAX), MAX_BACKOFF);
    assert_eq!(jitter(ms(1), 0), Duration::ZERO);
    assert_eq!(jitter(ms(1), 1_000_000), ms(1));
    assert_eq!(jitter(ms(1), 1_000_001), Duration::ZERO);
    assert_eq!(jitter(Duration::ZERO, u64::MAX), Duration::ZERO);
    assert_ne!(random(), random());
}
