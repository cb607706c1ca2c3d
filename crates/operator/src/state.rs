//! The operator's state in etcd, typed (docs/operator.md "State in etcd"): every key is
//! relative to the prefix (`/slate/operator/` by default).
//!
//! | key | value | written by |
//! |---|---|---|
//! | `nodes/<id>` | [`NodeRecord`] JSON | any replica, on a heartbeat or `fleet add-node` |
//! | `policies` | the policy file (TOML), checked | any replica, `fleet policy set` |
//! | `rollouts/<group>` | [`Rollout`] JSON, gzip-compressed above 16 KiB (`rollout_value.rs`) | the leader (fenced), and any replica for pause/resume/abort, always by compare-and-swap |
//! | `events/<ms>-<n>` | a JSON array of [`Event`]s | with the rollout change they record, in the same transaction; deleted by the leader once older than the retention |
//! | `leader/<lease>` | the leader's name | etcd's election |

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use slate_rollout::{Event, Inventory, NodeRecord, NodeReport, PolicySet, Rollout};

use crate::etcd::{Commit, EtcdState, Expect, Fence, Mirror, Mirrored, Outcome, StateError};

mod node_store;
pub mod rollout_value;
mod watched;

pub use node_store::{NodeStore, MAX_BATCH};
pub use watched::{RevisionsOnly, StateRevisions, WatchedRevisions};

pub const NODES: &str = "nodes/";
pub const POLICIES: &str = "policies";
pub const ROLLOUTS: &str = "rollouts/";
pub const EVENTS: &str = "events/";
pub const ELECTION: &str = "leader";

/// A value from etcd that does not parse: the store is refused, not guessed at.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Store(#[from] StateError),
    #[error("etcd key {key:?} holds no valid {what}: {reason}")]
    Corrupt {
        key: String,
        what: &'static str,
        reason: String,
    },
}

fn parse<T: serde::de::DeserializeOwned>(
    key: &str,
    value: &[u8],
    what: &'static str,
) -> Result<T, ReadError> {
    serde_json::from_slice(value).map_err(|e| ReadError::Corrupt {
        key: key.to_owned(),
        what,
        reason: e.to_string(),
    })
}

fn json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("state values serialize")
}

/// A rollout and the revision it was read at (what a compare-and-swap expects).
#[derive(Debug, Clone)]
pub struct Stored<T> {
    pub value: T,
    pub revision: i64,
}

pub fn inventory(state: &EtcdState) -> Result<Inventory, ReadError> {
    let mut out = Inventory::new();
    for entry in state.list(NODES)? {
        let id = entry.key.strip_prefix(NODES).unwrap_or(&entry.key);
        let record = NodeRecords::parse(id, &entry.value).map_err(|reason| ReadError::Corrupt {
            key: entry.key.clone(),
            what: "node record",
            reason,
        })?;
        out.insert(record.report.id.clone(), record);
    }
    Ok(out)
}

/// Equal but for when they were taken.
pub fn same_but_time(a: &NodeReport, b: &NodeReport) -> bool {
    let mut b = b.clone();
    b.sent_at_ms = a.sent_at_ms;
    *a == b
}

/// `nodes/` as [`Mirror`] reads it: a waiter wakes when a report changes, not when only its
/// `last_seen` or `sent_at_ms` moved.
#[derive(Debug)]
pub struct NodeRecords;

impl Mirrored for NodeRecords {
    type Value = NodeRecord;

    fn parse(key: &str, value: &[u8]) -> Result<NodeRecord, String> {
        let record: NodeRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        if record.report.id != key {
            return Err(format!("the record is about node {:?}", record.report.id));
        }
        Ok(record)
    }

    fn wakes(old: Option<&NodeRecord>, new: Option<&NodeRecord>) -> bool {
        match (old, new) {
            (Some(a), Some(b)) => !same_but_time(&a.report, &b.report),
            _ => true,
        }
    }
}

/// The inventory held in memory from a watch (`etcd/watch.rs`).
pub type Nodes = Mirror<NodeRecords>;

pub fn mirror_nodes(state: &EtcdState) -> Result<Nodes, StateError> {
    state.mirror(NODES)
}

/// The inventory from the mirror while it is synced (and its generation), else listed from
/// etcd (generation `None`). A record that does not parse refuses the whole inventory either
/// way.
pub fn inventory_from(
    state: &EtcdState,
    nodes: Option<&Nodes>,
) -> Result<(Arc<Inventory>, Option<u64>), ReadError> {
    if let Some(snapshot) = nodes.and_then(Nodes::snapshot) {
        if let Some((key, reason)) = snapshot.corrupt {
            return Err(ReadError::Corrupt {
                key: format!("{NODES}{key}"),
                what: "node record",
                reason,
            });
        }
        return Ok((snapshot.values, Some(snapshot.generation)));
    }
    Ok((Arc::new(inventory(state)?), None))
}

pub fn node(state: &EtcdState, id: &str) -> Result<Option<Stored<NodeRecord>>, ReadError> {
    let key = format!("{NODES}{id}");
    state
        .get(&key)?
        .map(|e| {
            Ok(Stored {
                value: parse(&key, &e.value, "node record")?,
                revision: e.mod_revision,
            })
        })
        .transpose()
}

/// Writes a node's record if its key still stands as `expect` says.
pub fn put_node_if(
    state: &EtcdState,
    record: &NodeRecord,
    expect: Expect,
) -> Result<Outcome, StateError> {
    let key = format!("{NODES}{}", record.report.id);
    let commit = Commit {
        checks: vec![(key.clone(), expect)],
        puts: vec![(key, json(record))],
        ..Commit::default()
    };
    state.commit(&commit)
}

pub fn rollouts(state: &EtcdState) -> Result<BTreeMap<String, Stored<Rollout>>, ReadError> {
    let mut out = BTreeMap::new();
    for entry in state.list(ROLLOUTS)? {
        let rollout = rollout_value::decode(&entry.value).map_err(|reason| ReadError::Corrupt {
            key: entry.key.clone(),
            what: "rollout",
            reason,
        })?;
        out.insert(
            rollout.group.clone(),
            Stored {
                value: rollout,
                revision: entry.mod_revision,
            },
        );
    }
    Ok(out)
}

/// The rollouts as a leader keeps them between its ticks: by group, to be lent to each tick
/// as they are (a tick used to read a copy of every rollout, ten thousand nodes' progress),
/// with the revision each was read or written at.
#[derive(Debug, Default)]
pub struct RolloutCache {
    /// By etcd key (`rollouts/<group>`): the group its value is about, and its revision.
    keys: BTreeMap<String, (String, i64)>,
    /// By group.
    rollouts: BTreeMap<String, Rollout>,
    /// Groups changed in place since they were read or stored ([`RolloutCache::edit`]): ahead
    /// of etcd until [`RolloutCache::edits_stored`], or read again after
    /// [`RolloutCache::discard_edits`].
    edited: BTreeSet<String>,
}

impl RolloutCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The rollouts by group.
    pub fn rollouts(&self) -> &BTreeMap<String, Rollout> {
        &self.rollouts
    }

    /// Each group's revision: what a compare-and-swap of its rollout expects.
    pub fn revisions(&self) -> BTreeMap<String, i64> {
        self.keys.values().cloned().collect()
    }

    /// A group's rollout and its revision.
    pub fn get(&self, group: &str) -> Option<(&Rollout, i64)> {
        let revision = self.keys.get(&format!("{ROLLOUTS}{group}"))?.1;
        Some((self.rollouts.get(group)?, revision))
    }

    fn forget(&mut self, key: &str) {
        if let Some((group, _)) = self.keys.remove(key) {
            self.edited.remove(&group);
            self.rollouts.remove(&group);
        }
    }

    /// A group's rollout to change in place, ahead of a commit that stores it: a leader
    /// records its nodes' answers so, without copying the rollout (at 10,000 nodes a copy and
    /// a commit of its own per group were a large part of each tick). Until
    /// [`RolloutCache::edits_stored`] or [`RolloutCache::discard_edits`], the cache holds what
    /// etcd does not.
    pub fn edit(&mut self, group: &str) -> Option<&mut Rollout> {
        let rollout = self.rollouts.get_mut(group)?;
        self.edited.insert(group.to_owned());
        Some(rollout)
    }

    /// The rollouts by group, to change in place ([`slate_rollout::tick_in_place`]): the
    /// caller names the groups it changed with [`RolloutCache::mark_edited`].
    pub fn rollouts_mut(&mut self) -> &mut BTreeMap<String, Rollout> {
        &mut self.rollouts
    }

    /// `groups` were changed (or begun) in place: see [`RolloutCache::edit`].
    pub fn mark_edited(&mut self, groups: impl IntoIterator<Item = String>) {
        self.edited.extend(groups);
    }

    /// The groups edited in place and not yet stored, with their rollouts as they now stand.
    pub fn edited(&self) -> impl Iterator<Item = (&str, &Rollout)> {
        self.edited
            .iter()
            .filter_map(|g| Some((g.as_str(), self.rollouts.get(g)?)))
    }

    /// The edits were stored by a commit at `revision`.
    pub fn edits_stored(&mut self, revision: i64) {
        for group in std::mem::take(&mut self.edited) {
            if self.rollouts.contains_key(&group) {
                self.keys
                    .insert(format!("{ROLLOUTS}{group}"), (group, revision));
            }
        }
    }

    /// The edits were not stored: their groups are forgotten (a rollout begun in place
    /// included), so the next refresh reads them from etcd again.
    pub fn discard_edits(&mut self) {
        for group in std::mem::take(&mut self.edited) {
            self.forget(&format!("{ROLLOUTS}{group}"));
            self.rollouts.remove(&group);
        }
    }
}

/// Brings `cache` up to etcd, as [`rollouts`] would read it: one read of the keys'
/// revisions, then only the rollouts whose revision moved (or that are new) are read and
/// decoded again.
pub fn refresh_rollouts(state: &EtcdState, cache: &mut RolloutCache) -> Result<(), ReadError> {
    let revisions: BTreeMap<String, i64> = state.revisions(ROLLOUTS)?.into_iter().collect();
    refresh_rollouts_at(state, cache, revisions, None)
}

/// The policies as a leader keeps them between its ticks: fetched and parsed again only when
/// their key's revision moved.
#[derive(Debug, Default)]
pub struct PolicyCache {
    /// The `policies` key's revision (0: absent) and what it holds.
    held: Option<(i64, Arc<PolicySet>)>,
}

/// [`refresh_rollouts`] and the policies, the revisions of both from `watched` while its
/// watches are synced, else with one read of them (`policies` sorts just before `rollouts/`):
/// a tick that finds neither moved reads nothing else.
pub fn refresh_state(
    state: &EtcdState,
    watched: Option<&WatchedRevisions>,
    rollouts: &mut RolloutCache,
    policies: &mut PolicyCache,
) -> Result<Arc<PolicySet>, ReadError> {
    let (policy_revision, revisions) = match watched.and_then(WatchedRevisions::current) {
        Some(current) => current,
        None => read_revisions(state)?,
    };
    refresh_rollouts_at(state, rollouts, revisions, watched)?;
    if let Some((held, set)) = &policies.held {
        if *held == policy_revision {
            return Ok(set.clone());
        }
    }
    let (text, revision) = match state.get(POLICIES)? {
        None => (String::new(), 0),
        Some(e) => (
            String::from_utf8(e.value).map_err(|_| ReadError::Corrupt {
                key: POLICIES.into(),
                what: "policy file",
                reason: "not UTF-8".into(),
            })?,
            e.mod_revision,
        ),
    };
    if let (Some(watched), true) = (watched, revision > 0) {
        watched.note_policies(revision);
    }
    let set = Arc::new(PolicySet::parse(&text).map_err(|e| ReadError::Corrupt {
        key: POLICIES.into(),
        what: "policy file",
        reason: e.to_string(),
    })?);
    policies.held = Some((revision, set.clone()));
    Ok(set)
}

/// The revisions of `policies` and of every `rollouts/` key, read from etcd.
fn read_revisions(state: &EtcdState) -> Result<StateRevisions, ReadError> {
    let mut revisions = BTreeMap::new();
    let mut policy_revision = 0;
    for (key, revision) in state.revisions_through(POLICIES, ROLLOUTS)? {
        if key == POLICIES {
            policy_revision = revision;
        } else if key.starts_with(ROLLOUTS) {
            revisions.insert(key, revision);
        }
    }
    Ok((policy_revision, revisions))
}

fn refresh_rollouts_at(
    state: &EtcdState,
    cache: &mut RolloutCache,
    revisions: BTreeMap<String, i64>,
    watched: Option<&WatchedRevisions>,
) -> Result<(), ReadError> {
    let moved: Vec<String> = cache
        .keys
        .iter()
        .filter(|(key, (_, held))| revisions.get(*key) != Some(held))
        .map(|(key, _)| key.clone())
        .collect();
    for key in moved {
        cache.forget(&key);
    }
    for key in revisions.keys() {
        if cache.keys.contains_key(key) {
            continue;
        }
        // Gone between the two reads: the next refresh sees it so.
        let Some(entry) = state.get(key)? else {
            continue;
        };
        if let (Some(watched), Some(group)) = (watched, key.strip_prefix(ROLLOUTS)) {
            watched.note_rollout(group, entry.mod_revision);
        }
        let rollout = rollout_value::decode(&entry.value).map_err(|reason| ReadError::Corrupt {
            key: key.clone(),
            what: "rollout",
            reason,
        })?;
        cache
            .keys
            .insert(key.clone(), (rollout.group.clone(), entry.mod_revision));
        cache.rollouts.insert(rollout.group.clone(), rollout);
    }
    Ok(())
}

/// Records in `cache` the rollouts a commit at `revision` has just stored.
pub fn remember_rollouts(
    cache: &mut RolloutCache,
    changed: BTreeMap<String, Rollout>,
    revision: i64,
) {
    for (group, rollout) in changed {
        let key = format!("{ROLLOUTS}{group}");
        cache.forget(&key);
        cache.keys.insert(key, (group.clone(), revision));
        cache.rollouts.insert(group, rollout);
    }
}

/// The policy file as stored (empty when none was set).
pub fn policies_text(state: &EtcdState) -> Result<String, ReadError> {
    match state.get(POLICIES)? {
        None => Ok(String::new()),
        Some(e) => String::from_utf8(e.value).map_err(|_| ReadError::Corrupt {
            key: POLICIES.into(),
            what: "policy file",
            reason: "not UTF-8".into(),
        }),
    }
}

pub fn set_policies(state: &EtcdState, text: &str) -> Result<(), StateError> {
    let commit = Commit {
        puts: vec![(POLICIES.into(), text.as_bytes().to_vec())],
        ..Commit::default()
    };
    state.commit(&commit).map(|_| ())
}

/// A key for a batch of events written at `now_ms`: in time order, and unique across
/// replicas and calls (the process id and a counter).
pub fn event_key(now_ms: u64) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{EVENTS}{now_ms:015}-{}-{n}", std::process::id())
}

/// The last `limit` events, oldest first. Every batch holds at least one event, so the last
/// `limit` batches hold them: one bounded read whatever the log's length.
pub fn events(state: &EtcdState, limit: usize) -> Result<Vec<Event>, ReadError> {
    let mut out = Vec::new();
    for entry in state.last(EVENTS, limit)? {
        let batch: Vec<Event> = parse(&entry.key, &entry.value, "event batch")?;
        out.extend(batch);
    }
    let skip = out.len().saturating_sub(limit);
    Ok(out.split_off(skip))
}

/// Delete every event batch written before `before_ms` (one range delete: batch keys sort by
/// their time), fenced by the leadership.
pub fn prune_events(
    state: &EtcdState,
    fence: &Fence,
    before_ms: u64,
) -> Result<Outcome, StateError> {
    let commit = Commit {
        fence: Some(fence.clone()),
        delete_ranges: vec![(EVENTS.into(), format!("{EVENTS}{before_ms:015}"))],
        ..Commit::default()
    };
    state.commit(&commit)
}

/// Rollouts changed together with the events that say why, in one transaction: each rollout
/// only if it still stands at the revision it was read at (or is still absent), and with a
/// fence only while that leadership stands.
pub fn commit_rollouts(
    state: &EtcdState,
    fence: Option<&Fence>,
    changed: &BTreeMap<String, Rollout>,
    read_at: &BTreeMap<String, i64>,
    events: &[Event],
    now_ms: u64,
) -> Result<Outcome, StateError> {
    let changed = changed.iter().map(|(g, r)| (g.as_str(), r));
    commit_rollouts_of(state, fence, changed, read_at, events, now_ms, None)
}

/// [`commit_rollouts`] of rollouts by reference, each group once, encoded by `encoder` when
/// one is given (a leader keeps one for its leadership; the bytes are the same).
pub fn commit_rollouts_of<'a>(
    state: &EtcdState,
    fence: Option<&Fence>,
    changed: impl IntoIterator<Item = (&'a str, &'a Rollout)>,
    read_at: &BTreeMap<String, i64>,
    events: &[Event],
    now_ms: u64,
    encoder: Option<&mut rollout_value::Encoder>,
) -> Result<Outcome, StateError> {
    let commit = rollouts_commit(fence, changed, read_at, events, now_ms, encoder);
    store_rollouts(state, &commit)
}

/// The transaction [`commit_rollouts_of`] stores, encoded and not yet sent (a leader times
/// the two apart).
pub fn rollouts_commit<'a>(
    fence: Option<&Fence>,
    changed: impl IntoIterator<Item = (&'a str, &'a Rollout)>,
    read_at: &BTreeMap<String, i64>,
    events: &[Event],
    now_ms: u64,
    mut encoder: Option<&mut rollout_value::Encoder>,
) -> Commit {
    let mut commit = Commit {
        fence: fence.cloned(),
        ..Commit::default()
    };
    for (group, rollout) in changed {
        let key = format!("{ROLLOUTS}{group}");
        let expect = match read_at.get(group) {
            Some(rev) => Expect::ModRevision(*rev),
            None => Expect::Absent,
        };
        commit.checks.push((key.clone(), expect));
        let value = match encoder.as_deref_mut() {
            Some(encoder) => encoder.encode(rollout),
            None => rollout_value::encode(rollout),
        };
        commit.puts.push((key, value));
    }
    if !events.is_empty() {
        commit.puts.push((event_key(now_ms), json(&events)));
    }
    commit
}

/// Stores what [`rollouts_commit`] built; one that writes nothing is not sent.
pub fn store_rollouts(state: &EtcdState, commit: &Commit) -> Result<Outcome, StateError> {
    if commit.puts.is_empty() {
        return Ok(Outcome::Committed { revision: 0 });
    }
    state.commit(commit)
}
