//! Which wave a node is in, under one policy: the policy's nodes in a group, in a stable order
//! (by a hash of the node id, so the canaries are the same on every leader and every tick, and
//! not the alphabetically first), cut at the waves' cumulative percentages.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::node::NodeRecord;
use crate::policy::Policy;

/// The order nodes are taken in: the first 8 bytes of SHA-256 of the id, then the id.
pub fn wave_key(id: &str) -> (u64, String) {
    (wave_hash(id), id.to_owned())
}

/// Sorts by [`wave_key`] without owning the ids: a tick sorts every covered node, and an owned
/// copy of each id was ten thousand allocations a tick.
pub(crate) fn sort_in_waves(nodes: &mut [&NodeRecord]) {
    nodes.sort_by_cached_key(|n| {
        let n: &NodeRecord = n;
        (wave_hash(&n.report.id), &n.report.id)
    });
}

pub(crate) fn wave_hash(id: &str) -> u64 {
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// One policy over the nodes it covers in a group.
#[derive(Debug)]
pub(crate) struct PolicyView<'a> {
    pub(crate) policy: &'a Policy,
    /// In wave order.
    pub(crate) members: Vec<&'a str>,
    /// `members`' records, in the same order (a tick reads them without a lookup by id).
    pub(crate) records: Vec<&'a NodeRecord>,
    pub(crate) position: HashMap<&'a str, usize>,
    /// The number of members in waves up to and including each wave.
    bounds: Vec<usize>,
}

impl<'a> PolicyView<'a> {
    /// `None` when the policy covers none of `nodes`.
    pub(crate) fn new(policy: &'a Policy, nodes: &[&'a NodeRecord]) -> Option<Self> {
        let mut ordered = nodes.to_vec();
        sort_in_waves(&mut ordered);
        Self::of_ordered(policy, &ordered)
    }

    /// [`PolicyView::new`] of nodes already in wave order (a tick sorts a group's nodes once
    /// for all its policies).
    pub(crate) fn of_ordered(policy: &'a Policy, ordered: &[&'a NodeRecord]) -> Option<Self> {
        let records: Vec<&'a NodeRecord> = ordered
            .iter()
            .copied()
            .filter(|n| policy.applies_to(&n.report))
            .collect();
        let members: Vec<&'a str> = records.iter().map(|n| n.report.id.as_str()).collect();
        if members.is_empty() {
            return None;
        }
        let position = members.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        Some(PolicyView {
            bounds: wave_bounds(
                &policy.waves.iter().map(|w| w.percent).collect::<Vec<_>>(),
                members.len(),
            ),
            policy,
            members,
            records,
            position,
        })
    }

    /// The wave (from 0) of a member, when the policy has waves.
    pub(crate) fn wave_of(&self, id: &str) -> Option<usize> {
        let pos = *self.position.get(id)?;
        self.bounds.iter().position(|&bound| pos < bound)
    }

    /// The highest wave all of whose earlier waves' members are `finished`.
    pub(crate) fn open_wave(&self, finished: impl Fn(&str) -> bool) -> usize {
        let first_unfinished = self
            .members
            .iter()
            .position(|id| !finished(id))
            .unwrap_or(self.members.len());
        self.open_wave_before(first_unfinished)
    }

    /// [`PolicyView::open_wave`] when the first unfinished member (in wave order) is known.
    pub(crate) fn open_wave_before(&self, first_unfinished: usize) -> usize {
        // Wave k is open when every member before its start (bounds[k-1]) has finished.
        let mut open = 0;
        for k in 1..self.bounds.len() {
            if self.bounds[k - 1] <= first_unfinished {
                open = k;
            } else {
                break;
            }
        }
        open
    }
}

/// The cumulative member counts of waves given as cumulative percentages of `members`: each
/// rounds up, and every wave holds at least one node more than the one before while nodes are
/// left (1 % of 30 nodes is one canary, not none).
pub fn wave_bounds(percents: &[u32], members: usize) -> Vec<usize> {
    let mut bounds: Vec<usize> = Vec::new();
    for &p in percents {
        let previous = bounds.last().copied().unwrap_or(0);
        let share = (members * p as usize).div_ceil(100);
        bounds.push(share.max((previous + 1).min(members)));
    }
    bounds
}
