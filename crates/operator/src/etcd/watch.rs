//! A subtree of keys held in memory: listed once, then followed by an etcd watch from the
//! listing's revision, so a reader asks memory instead of listing ten thousand keys again.
//!
//! The mirror is never ahead of etcd and may be behind by the watch's delay (milliseconds on
//! a healthy cluster). While the watch is broken — a member lost, the stream cancelled, the
//! listing's revision compacted — it is *unsynced* and [`Mirror::snapshot`] answers `None`,
//! so a caller falls back to a linearizable listing instead of trusting an old picture. It
//! lists and watches again by itself.
//!
//! Readers get the map behind an `Arc`: taking a snapshot copies nothing, and the watch copies
//! the map (once) only when it must change one that a reader still holds.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{Client, Error as EtcdError, EventType, WatchOptions};
use tokio::task::JoinHandle;

use super::{prefix_end, read_range, EtcdState, StateError};

/// The pause after a failed listing or watch, doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// How a mirror reads its values.
pub trait Mirrored: Send + Sync + 'static {
    type Value: Clone + Send + Sync + 'static;
    /// The value a key holds, or why it holds none (kept apart as corrupt, not guessed at).
    fn parse(key: &str, value: &[u8]) -> Result<Self::Value, String>;
    /// Whether a change is news a waiter should wake for (not, e.g., a refreshed timestamp).
    fn wakes(old: Option<&Self::Value>, new: Option<&Self::Value>) -> bool;
}

/// What the mirror holds at one instant.
#[derive(Debug)]
pub struct Snapshot<V> {
    /// By key relative to the mirrored subtree (`nodes/n1` → `n1`).
    pub values: Arc<BTreeMap<String, V>>,
    /// The first key whose value did not parse, and why.
    pub corrupt: Option<(String, String)>,
    /// Counts the changes waiters wake for ([`Mirror::wait_change`]).
    pub generation: u64,
}

struct Held<V> {
    values: Arc<BTreeMap<String, V>>,
    revisions: BTreeMap<String, i64>,
    corrupt: BTreeMap<String, String>,
    synced: bool,
    generation: u64,
}

struct Inner<M: Mirrored> {
    held: Mutex<Held<M::Value>>,
    changed: Condvar,
}

impl<M: Mirrored> Inner<M> {
    fn lock(&self) -> MutexGuard<'_, Held<M::Value>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A subtree under the state's prefix, followed in the background until dropped.
pub struct Mirror<M: Mirrored> {
    inner: Arc<Inner<M>>,
    task: JoinHandle<()>,
}

impl<M: Mirrored> Drop for Mirror<M> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<M: Mirrored> std::fmt::Debug for Mirror<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.inner.lock();
        f.debug_struct("Mirror")
            .field("keys", &held.values.len())
            .field("synced", &held.synced)
            .finish_non_exhaustive()
    }
}

impl EtcdState {
    /// Starts mirroring the keys under `key_prefix` (relative, non-empty). Nothing is waited
    /// for: the mirror is unsynced until its first listing.
    pub fn mirror<M: Mirrored>(&self, key_prefix: &str) -> Result<Mirror<M>, StateError> {
        let start = self.absolute(key_prefix)?.into_bytes();
        let inner = Arc::new(Inner::<M> {
            held: Mutex::new(Held {
                values: Arc::default(),
                revisions: BTreeMap::new(),
                corrupt: BTreeMap::new(),
                synced: false,
                generation: 0,
            }),
            changed: Condvar::new(),
        });
        // The waiting client: a watch is one long request, which the bounded client's request
        // timeout would cut; its HTTP/2 pings notice a member that vanished.
        let client = self.shared.waiting.clone();
        let task = self
            .shared
            .runtime
            .spawn(follow(client, start, inner.clone()));
        Ok(Mirror { inner, task })
    }
}

impl<M: Mirrored> Mirror<M> {
    /// The values as of the watch's last event, or `None` while the mirror is not synced.
    pub fn snapshot(&self) -> Option<Snapshot<M::Value>> {
        let held = self.inner.lock();
        held.synced.then(|| Snapshot {
            values: held.values.clone(),
            corrupt: held
                .corrupt
                .iter()
                .next()
                .map(|(k, r)| (k.clone(), r.clone())),
            generation: held.generation,
        })
    }

    /// `None` while the mirror is not synced; else one key's value and `mod_revision`, if the
    /// mirror holds it.
    pub fn get(&self, key: &str) -> Option<Option<(M::Value, i64)>> {
        let held = self.inner.lock();
        if !held.synced {
            return None;
        }
        let value = held.values.get(key).cloned();
        Some(value.zip(held.revisions.get(key).copied()))
    }

    /// `None` while the mirror is not synced; else every key's `mod_revision` (a key whose
    /// value did not parse included).
    pub fn revisions(&self) -> Option<BTreeMap<String, i64>> {
        let held = self.inner.lock();
        held.synced.then(|| held.revisions.clone())
    }

    /// Records a value this process has just written at `mod_revision`, before its watch
    /// event arrives, so that the writer's next read sees its own write.
    pub fn note(&self, key: &str, value: M::Value, mod_revision: i64) {
        let mut held = self.inner.lock();
        apply::<M>(&mut held, key, Some(Ok(value)), mod_revision);
        self.inner.changed.notify_all();
    }

    /// Waits until the generation differs from `seen` or `timeout` passes; answers the
    /// generation then.
    pub fn wait_change(&self, seen: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut held = self.inner.lock();
        while held.generation == seen {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            held = self
                .inner
                .changed
                .wait_timeout(held, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        held.generation
    }
}

/// Applies one change to a key (`None`: deleted) unless the mirror holds a newer write of it.
fn apply<M: Mirrored>(
    held: &mut Held<M::Value>,
    key: &str,
    value: Option<Result<M::Value, String>>,
    mod_revision: i64,
) {
    if held.revisions.get(key).is_some_and(|r| *r > mod_revision) {
        return;
    }
    let old = held.values.get(key);
    let wakes = match &value {
        Some(Ok(new)) => M::wakes(old, Some(new)),
        Some(Err(_)) | None => true,
    };
    let values = Arc::make_mut(&mut held.values);
    match value {
        Some(Ok(v)) => {
            values.insert(key.to_owned(), v);
            held.revisions.insert(key.to_owned(), mod_revision);
            held.corrupt.remove(key);
        }
        Some(Err(reason)) => {
            values.remove(key);
            held.revisions.insert(key.to_owned(), mod_revision);
            held.corrupt.insert(key.to_owned(), reason);
        }
        None => {
            values.remove(key);
            held.revisions.remove(key);
            held.corrupt.remove(key);
        }
    }
    if wakes {
        held.generation += 1;
    }
}

/// Lists and watches, again after every failure, until the task is aborted.
async fn follow<M: Mirrored>(client: Client, start: Vec<u8>, inner: Arc<Inner<M>>) {
    let mut pause = FIRST_PAUSE;
    loop {
        let synced_once = follow_once(client.clone(), &start, &inner).await;
        inner.lock().synced = false;
        if synced_once {
            pause = FIRST_PAUSE;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// One listing and the watch after it; answers whether the listing got through. Returns when
/// the watch ends, fails or is cancelled (compacted past, a member without a leader).
async fn follow_once<M: Mirrored>(client: Client, start: &[u8], inner: &Inner<M>) -> bool {
    let Ok((entries, revision)) = read_range(client.clone(), start.to_vec()).await else {
        return false;
    };
    {
        let mut values = BTreeMap::new();
        let mut revisions = BTreeMap::new();
        let mut corrupt = BTreeMap::new();
        for (key, value, mod_revision) in entries {
            let Some(key) = relative(start, &key) else {
                continue;
            };
            match M::parse(&key, &value) {
                Ok(v) => {
                    values.insert(key.clone(), v);
                }
                Err(reason) => {
                    corrupt.insert(key.clone(), reason);
                }
            }
            revisions.insert(key, mod_revision);
        }
        let mut held = inner.lock();
        held.values = Arc::new(values);
        held.revisions = revisions;
        held.corrupt = corrupt;
        held.synced = true;
        held.generation += 1;
        inner.changed.notify_all();
    }
    let _ = watch(client, start, revision + 1, inner).await;
    true
}

async fn watch<M: Mirrored>(
    mut client: Client,
    start: &[u8],
    from: i64,
    inner: &Inner<M>,
) -> Result<(), EtcdError> {
    let options = WatchOptions::new()
        .with_range(prefix_end(start))
        .with_start_revision(from);
    let mut stream = client.watch(start.to_vec(), Some(options)).await?;
    while let Some(resp) = stream.message().await? {
        if resp.canceled() {
            return Err(EtcdError::WatchError(resp.cancel_reason().to_owned()));
        }
        if resp.events().is_empty() {
            continue;
        }
        let mut held = inner.lock();
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(key) = relative(start, kv.key()) else {
                continue;
            };
            let value = match event.event_type() {
                EventType::Put => Some(M::parse(&key, kv.value())),
                EventType::Delete => None,
            };
            // A delete event's key carries the delete's revision.
            apply::<M>(&mut held, &key, value, kv.mod_revision());
        }
        inner.changed.notify_all();
    }
    Ok(())
}

/// A key relative to the mirrored subtree; `None` for one outside it or not UTF-8 (neither is
/// written by the operator).
fn relative(start: &[u8], key: &[u8]) -> Option<String> {
    String::from_utf8(key.strip_prefix(start)?.to_vec()).ok()
}
