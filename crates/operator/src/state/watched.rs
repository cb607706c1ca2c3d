//! The revisions of `policies` and `rollouts/<group>` followed by watches, so that a leader's
//! tick learns whether any of them moved from memory instead of asking etcd (at 10,000 nodes
//! that read was a tenth of a tick's median and a quarter of its tail).
//!
//! Only revisions are held: a key whose revision moved is fetched and decoded again by the
//! refresh, as before. The watches are never ahead of etcd and may be behind by their delay;
//! what this process itself wrote or fetched it notes at once ([`WatchedRevisions::note_rollout`]),
//! so its own writes never look like another replica's. A write the watch has not delivered
//! yet (a pause from another replica) is caught where it always was: by the compare-and-swap
//! of the commit, which expects each rollout's revision as held, and the next tick decides
//! again on what the watch then shows.

use std::collections::BTreeMap;

use crate::etcd::{EtcdState, Mirror, Mirrored, StateError};

use super::{POLICIES, ROLLOUTS};

/// A mirror that keeps each key's revision and nothing of its value.
#[derive(Debug)]
pub struct RevisionsOnly;

impl Mirrored for RevisionsOnly {
    type Value = ();

    fn parse(_key: &str, _value: &[u8]) -> Result<(), String> {
        Ok(())
    }

    fn wakes(_old: Option<&()>, _new: Option<&()>) -> bool {
        true
    }
}

/// The `policies` key and the `rollouts/` subtree, each followed by its own watch.
pub struct WatchedRevisions {
    policies: Mirror<RevisionsOnly>,
    rollouts: Mirror<RevisionsOnly>,
}

/// The `policies` key's revision (0: absent) and each `rollouts/<group>` key's, by key.
pub type StateRevisions = (i64, BTreeMap<String, i64>);

impl WatchedRevisions {
    /// Starts both watches; until both have listed, [`WatchedRevisions::current`] is `None`.
    pub fn follow(state: &EtcdState) -> Result<Self, StateError> {
        Ok(Self {
            policies: state.mirror(POLICIES)?,
            rollouts: state.mirror(ROLLOUTS)?,
        })
    }

    /// The revisions as the watches last delivered them (or as this process noted them), or
    /// `None` while either watch is not synced (the caller reads etcd instead).
    pub fn current(&self) -> Option<StateRevisions> {
        let policies = self.policies.revisions()?;
        let rollouts = self.rollouts.revisions()?;
        let policy = policies.get("").copied().unwrap_or(0);
        let rollouts = rollouts
            .into_iter()
            .map(|(group, revision)| (format!("{ROLLOUTS}{group}"), revision))
            .collect();
        Some((policy, rollouts))
    }

    /// `rollouts/<group>` was written or read by this process at `revision`.
    pub fn note_rollout(&self, group: &str, revision: i64) {
        self.rollouts.note(group, (), revision);
    }

    /// `policies` was read by this process at `revision`.
    pub fn note_policies(&self, revision: i64) {
        self.policies.note("", (), revision);
    }
}

impl std::fmt::Debug for WatchedRevisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedRevisions")
            .field("synced", &self.current().is_some())
            .finish_non_exhaustive()
    }
}
