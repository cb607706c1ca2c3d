//! What a leader keeps from one tick to the next: each group's wave order.
//!
//! The wave order is a SHA-256 of every covered id and a sort, which at 10,000 nodes was the
//! largest part of a tick that does not depend on what the nodes report. It depends on the
//! group's ids alone, so a cached order is checked against the ids (one comparison of each,
//! in id order) instead of being invalidated by revisions: whatever changed in the inventory,
//! a hit is exactly what a fresh sort gives, and a miss sorts afresh.

use std::collections::HashMap;

use crate::node::NodeRecord;
use crate::waves::fresh_wave_order;

/// The parts of a tick, for a caller that times them ([`crate::tick_marked`]): each is
/// reported when it ends, once per group for all but [`TickPart::Grouping`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickPart {
    /// The inventory walked and each covered node put in its group.
    Grouping,
    /// A group's nodes in wave order (cached or sorted).
    WaveOrder,
    /// A group's policy views: which policy covers which node, the waves' bounds.
    Views,
    /// A group's decisions: following the nodes, starting new ones, the rollout's state.
    Decisions,
}

impl TickPart {
    pub const ALL: [TickPart; 4] = [
        TickPart::Grouping,
        TickPart::WaveOrder,
        TickPart::Views,
        TickPart::Decisions,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Each group's wave order as of the last tick that saw it; see the module's text.
#[derive(Debug, Default, Clone)]
pub struct TickCache {
    groups: HashMap<String, WaveOrder>,
    /// Orders computed afresh and reused since the cache was made (for the bench).
    pub misses: u64,
    pub hits: u64,
}

#[derive(Debug, Clone)]
struct WaveOrder {
    /// The group's covered ids, in id order, as last sorted.
    ids: Vec<String>,
    /// Indexes into `ids` in wave order.
    order: Vec<usize>,
}

impl TickCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The indexes of `covered` (in id order) in wave order.
    pub(crate) fn wave_order(&mut self, group: &str, covered: &[&NodeRecord]) -> Vec<usize> {
        if let Some(known) = self.groups.get(group) {
            let same = known.ids.len() == covered.len()
                && known
                    .ids
                    .iter()
                    .zip(covered)
                    .all(|(id, rec)| *id == rec.report.id);
            if same {
                self.hits += 1;
                return known.order.clone();
            }
        }
        self.misses += 1;
        let order = fresh_wave_order(covered);
        self.groups.insert(
            group.to_owned(),
            WaveOrder {
                ids: covered.iter().map(|r| r.report.id.clone()).collect(),
                order: order.clone(),
            },
        );
        order
    }

    /// Forgets the groups not seen in the last tick (a group that emptied, or lost its
    /// policies), so the cache never outgrows the fleet.
    pub(crate) fn keep_only<'a>(&mut self, groups: impl Iterator<Item = &'a str>) {
        let seen: std::collections::HashSet<&str> = groups.collect();
        self.groups.retain(|g, _| seen.contains(g.as_str()));
    }

    /// The groups held.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}
