//! The give-up counter: a version whose boots were reverted [`GIVE_UP_AFTER`] times is not
//! tried again (it stays skipped until a newer release replaces it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Reverted boots of one version before the agent stops trying it.
pub const GIVE_UP_AFTER: u32 = 3;

/// Reverted attempts per version, persisted by the agent between boots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCounter {
    reverted: BTreeMap<String, u32>,
}

impl FailureCounter {
    /// Count one reverted boot of `version`; true when this one makes the agent give up.
    pub fn record_revert(&mut self, version: &str) -> bool {
        let count = self.reverted.entry(version.to_owned()).or_default();
        *count += 1;
        *count == GIVE_UP_AFTER
    }

    pub fn reverts(&self, version: &str) -> u32 {
        self.reverted.get(version).copied().unwrap_or(0)
    }

    /// The versions given up on, for [`crate::Policy::skip`].
    pub fn skipped(&self) -> Vec<String> {
        self.reverted
            .iter()
            .filter(|(_, n)| **n >= GIVE_UP_AFTER)
            .map(|(v, _)| v.clone())
            .collect()
    }

    /// What `slate status` says about a skipped version: "2.1.0 reverted 3 times: skipped".
    pub fn describe(&self, version: &str) -> Option<String> {
        let n = self.reverts(version);
        (n >= GIVE_UP_AFTER).then(|| format!("{version} reverted {n} times: skipped"))
    }

    /// Forget versions at or below `running`: they are behind the node now.
    pub fn forget_up_to(&mut self, running: &str) {
        self.reverted
            .retain(|v, _| crate::compare(v, running) == std::cmp::Ordering::Greater);
    }
}
