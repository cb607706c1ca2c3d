//! Which wave a node is in, under one policy: the policy's nodes in a group, in a stable order
//! (by a hash of the node id, so the canaries are the same on every leader and every tick, and
//! not the alphabetically first), cut at the waves' cumulative percentages.

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

/// The indexes of `covered` in wave order, sorted now.
pub(crate) fn fresh_wave_order(covered: &[&NodeRecord]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..covered.len()).collect();
    order.sort_by_cached_key(|&i| {
        let id = covered[i].report.id.as_str();
        (wave_hash(id), id)
    });
    order
}

pub(crate) fn wave_hash(id: &str) -> u64 {
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// One policy over the nodes it covers in a group.
///
/// Built every tick for every policy of every group, so it holds no hash map: a member is
/// found by its index in the group's nodes in id order (`slot`, the tick's hot path) or by
/// its id through `by_id`, both filled in one pass over nodes the caller already sorted.
#[derive(Debug)]
pub(crate) struct PolicyView<'a> {
    pub(crate) policy: &'a Policy,
    /// In wave order.
    pub(crate) members: Vec<&'a str>,
    /// `members`' records, in the same order (a tick reads them without a lookup by id).
    pub(crate) records: Vec<&'a NodeRecord>,
    /// Each member's index in the group's nodes in id order, in wave order.
    pub(crate) at: Vec<usize>,
    /// By index in the group's nodes in id order: the node's position in `members`, or
    /// [`NOT_A_MEMBER`].
    slot: Vec<u32>,
    /// The members' ids in id order, each with its position in `members`.
    by_id: Vec<(&'a str, u32)>,
    /// The number of members in waves up to and including each wave.
    bounds: Vec<usize>,
}

const NOT_A_MEMBER: u32 = u32::MAX;

impl<'a> PolicyView<'a> {
    /// `None` when the policy covers none of `nodes`.
    pub(crate) fn new(policy: &'a Policy, nodes: &[&'a NodeRecord]) -> Option<Self> {
        let mut by_id = nodes.to_vec();
        by_id.sort_by(|a, b| a.report.id.cmp(&b.report.id));
        let order = fresh_wave_order(&by_id);
        let ordered: Vec<(&'a NodeRecord, usize)> = order.iter().map(|&i| (by_id[i], i)).collect();
        Self::of_ordered(policy, &ordered)
    }

    /// [`PolicyView::new`] of a group's nodes already in wave order, each with its index in
    /// the group's nodes in id order (a tick sorts a group once for all its policies).
    pub(crate) fn of_ordered(
        policy: &'a Policy,
        ordered: &[(&'a NodeRecord, usize)],
    ) -> Option<Self> {
        let mut slot = vec![NOT_A_MEMBER; ordered.len()];
        let mut ids: Vec<Option<&'a str>> = vec![None; ordered.len()];
        let mut members = Vec::new();
        let mut records = Vec::new();
        let mut at = Vec::new();
        for &(record, index) in ordered {
            if policy.applies_to(&record.report) {
                let id = record.report.id.as_str();
                slot[index] = u32::try_from(members.len()).unwrap_or(NOT_A_MEMBER);
                ids[index] = Some(id);
                members.push(id);
                records.push(record);
                at.push(index);
            }
        }
        if members.is_empty() {
            return None;
        }
        let by_id = ids
            .iter()
            .zip(&slot)
            .filter_map(|(id, &position)| id.map(|id| (id, position)))
            .collect();
        Some(PolicyView {
            bounds: wave_bounds(
                &policy.waves.iter().map(|w| w.percent).collect::<Vec<_>>(),
                members.len(),
            ),
            policy,
            members,
            records,
            at,
            slot,
            by_id,
        })
    }

    /// The position in `members` of the group's node at `index` (in id order), if a member.
    pub(crate) fn position_at(&self, index: usize) -> Option<usize> {
        match self.slot.get(index) {
            Some(&position) if position != NOT_A_MEMBER => Some(position as usize),
            _ => None,
        }
    }

    /// The position in `members` of the node `id`, if a member.
    pub(crate) fn position(&self, id: &str) -> Option<usize> {
        let found = self.by_id.binary_search_by(|(member, _)| (*member).cmp(id));
        found.ok().map(|i| self.by_id[i].1 as usize)
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.position(id).is_some()
    }

    /// The wave (from 0) of a member, when the policy has waves.
    pub(crate) fn wave_of(&self, id: &str) -> Option<usize> {
        self.wave_at(self.position(id)?)
    }

    /// The wave (from 0) of the member at `position` in `members`.
    pub(crate) fn wave_at(&self, position: usize) -> Option<usize> {
        self.bounds.iter().position(|&bound| position < bound)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeReport;
    use crate::policy::PolicySet;

    fn record(id: &str, zone: &str) -> NodeRecord {
        let mut report = NodeReport::settled(id, "g", format!("{id}:50000"), "1");
        report.labels.insert("zone".into(), zone.into());
        NodeRecord {
            report,
            last_seen: 0,
        }
    }

    /// The view's lookups by index and by id agree with the members' wave order, for a
    /// policy that covers only some of the nodes, given in no particular order.
    #[test]
    fn a_member_is_found_by_index_and_by_id_at_its_place_in_wave_order() {
        let policies = PolicySet::parse(
            "[[policy]]\nname = \"a\"\nlabels = { zone = \"a\" }\n\
             waves = [{ percent = 10 }, { percent = 100 }]\n",
        )
        .unwrap();
        let records: Vec<NodeRecord> = (0..200)
            .rev()
            .map(|i| record(&format!("n{i:03}"), if i % 3 == 0 { "b" } else { "a" }))
            .collect();
        let nodes: Vec<&NodeRecord> = records.iter().collect();
        let view = PolicyView::new(&policies.policies[0], &nodes).unwrap();

        let mut expected: Vec<&str> = records
            .iter()
            .filter(|r| r.report.labels["zone"] == "a")
            .map(|r| r.report.id.as_str())
            .collect();
        expected.sort_by_key(|id| wave_key(id));
        assert_eq!(view.members, expected);
        assert_eq!(view.records.len(), expected.len());

        let mut by_id = nodes.clone();
        by_id.sort_by(|a, b| a.report.id.cmp(&b.report.id));
        for (index, rec) in by_id.iter().enumerate() {
            let id = rec.report.id.as_str();
            let position = expected.iter().position(|m| *m == id);
            assert_eq!(view.position_at(index), position, "{id} by index");
            assert_eq!(view.position(id), position, "{id} by id");
            assert_eq!(view.contains(id), position.is_some());
            if let Some(p) = position {
                assert_eq!(view.at[p], index);
                assert_eq!(view.records[p].report.id, id);
                assert_eq!(view.wave_of(id), view.wave_at(p));
            }
        }
        assert_eq!(view.position("n999"), None);
        assert_eq!(view.position_at(by_id.len()), None);
        // 133 members: the first wave holds 10 % of them, rounded up (14).
        assert_eq!(view.wave_at(13), Some(0));
        assert_eq!(view.wave_at(14), Some(1));
    }
}
