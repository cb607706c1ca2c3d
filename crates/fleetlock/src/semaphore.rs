//! airlock's counting semaphore, one per group: `{"total_slots":N,"holders":[sorted ids]}`
//! (coreos/airlock `internal/lock/semaphore.go`), and its two transitions. A transition returns
//! the new value or "no change", so that a store writes only real changes, each with a
//! compare-and-swap against the version it read.

use serde::Deserialize;
use thiserror::Error;

use crate::request::{ClientId, IdentityError};

/// Cap on a stored semaphore's bytes. The most a valid one needs is about 1024 slots (the
/// largest `--group` takes) of 256-byte ids, escaped: well under this.
pub const MAX_SEMAPHORE_LEN: usize = 1 << 20;

/// The semaphore of one group. Invariants, kept by every constructor: `holders` are valid
/// [`ClientId`]s, strictly ascending (so unique), and at most `total_slots` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Semaphore {
    total_slots: u64,
    holders: Vec<String>,
}

/// The outcome of a transition that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing to write: the lock was already held, or the unlocking id held nothing.
    Unchanged,
    /// The value to compare-and-swap in.
    Changed(Semaphore),
}

/// A lock refused because every slot is taken. The text is airlock's, word for word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("all {slots} semaphore slots currently locked")]
pub struct Full {
    pub slots: u64,
}

/// Why stored bytes are not a semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SemaphoreError {
    #[error("{len} bytes, at most {MAX_SEMAPHORE_LEN} are allowed")]
    TooLarge { len: usize },
    #[error("not a semaphore: {0}")]
    Json(String),
    #[error("holder {index}: {reason}")]
    Holder { index: usize, reason: IdentityError },
    #[error("holders are not sorted and unique at index {index} ({id:?})")]
    Order { index: usize, id: String },
    #[error("{holders} holders but only {total_slots} slots")]
    Overfull { holders: usize, total_slots: u64 },
}

/// The serde shape; [`Semaphore::try_from_raw`] checks the invariants.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSemaphore {
    total_slots: u64,
    holders: Vec<String>,
}

impl Semaphore {
    /// No holders.
    pub fn new(total_slots: u64) -> Self {
        Semaphore {
            total_slots,
            holders: Vec::new(),
        }
    }

    pub fn total_slots(&self) -> u64 {
        self.total_slots
    }

    /// Sorted byte-wise, as Go's `sort.Strings` sorts them.
    pub fn holders(&self) -> &[String] {
        &self.holders
    }

    pub fn holds(&self, id: &str) -> bool {
        self.find(id).is_ok()
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        self.holders.binary_search_by(|h| h.as_str().cmp(id))
    }

    /// `RecursiveLock` with `slots` slots (the server's configuration for the group). A holder
    /// locking again succeeds with no change; otherwise the id is admitted while fewer than
    /// `slots` ids hold, and the new value records `slots` as its `total_slots`.
    ///
    /// **Difference** from airlock, which keeps the `total_slots` of the semaphore's first
    /// creation forever (and only warns when the configuration differs): here the configured
    /// count takes effect at the next lock. Lowering it evicts nobody; new ids wait until
    /// enough holders have unlocked.
    pub fn lock(&self, id: &ClientId, slots: u64) -> Result<Transition, Full> {
        let at = match self.find(id.as_str()) {
            Ok(_) => return Ok(Transition::Unchanged),
            Err(at) => at,
        };
        if self.holders.len() as u64 >= slots {
            return Err(Full { slots });
        }
        let mut holders = self.holders.clone();
        holders.insert(at, id.as_str().to_owned());
        Ok(Transition::Changed(Semaphore {
            total_slots: slots,
            holders,
        }))
    }

    /// `UnlockIfHeld`: removes `id` if it holds a slot; an id that holds nothing changes
    /// nothing and is not an error (every client unlocks on every start).
    pub fn unlock(&self, id: &str) -> Transition {
        match self.find(id) {
            Ok(at) => {
                let mut holders = self.holders.clone();
                holders.remove(at);
                Transition::Changed(Semaphore {
                    total_slots: self.total_slots,
                    holders,
                })
            }
            Err(_) => Transition::Unchanged,
        }
    }

    /// Parses a stored value strictly: size cap, exactly the two fields, holders valid ids,
    /// sorted and unique, no more of them than slots.
    pub fn parse(bytes: &[u8]) -> Result<Self, SemaphoreError> {
        if bytes.len() > MAX_SEMAPHORE_LEN {
            return Err(SemaphoreError::TooLarge { len: bytes.len() });
        }
        let raw: RawSemaphore =
            serde_json::from_slice(bytes).map_err(|e| SemaphoreError::Json(e.to_string()))?;
        Self::try_from_raw(raw)
    }

    pub(crate) fn try_from_raw(raw: RawSemaphore) -> Result<Self, SemaphoreError> {
        for (index, id) in raw.holders.iter().enumerate() {
            ClientId::new(id.as_str())
                .map_err(|reason| SemaphoreError::Holder { index, reason })?;
        }
        if let Some(index) = raw.holders.windows(2).position(|w| w[0] >= w[1]) {
            return Err(SemaphoreError::Order {
                index: index + 1,
                id: raw.holders[index + 1].clone(),
            });
        }
        if raw.holders.len() as u64 > raw.total_slots {
            return Err(SemaphoreError::Overfull {
                holders: raw.holders.len(),
                total_slots: raw.total_slots,
            });
        }
        Ok(Semaphore {
            total_slots: raw.total_slots,
            holders: raw.holders,
        })
    }

    /// Compact JSON with airlock's field order (`total_slots`, then `holders`).
    pub fn to_json(&self) -> String {
        let holders: Vec<String> = self
            .holders
            .iter()
            .map(|h| serde_json::Value::String(h.clone()).to_string())
            .collect();
        format!(
            "{{\"total_slots\":{},\"holders\":[{}]}}",
            self.total_slots,
            holders.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn id(s: &str) -> ClientId {
        ClientId::new(s).unwrap()
    }

    fn changed(t: Transition) -> Semaphore {
        match t {
            Transition::Changed(s) => s,
            Transition::Unchanged => panic!("expected a change"),
        }
    }

    #[test]
    fn lock_is_recursive_and_bounded() {
        let s = Semaphore::new(2);
        let s = changed(s.lock(&id("b"), 2).unwrap());
        assert_eq!(s.lock(&id("b"), 2), Ok(Transition::Unchanged));
        let s = changed(s.lock(&id("a"), 2).unwrap());
        assert_eq!(s.holders(), ["a", "b"]);
        assert_eq!(s.lock(&id("c"), 2), Err(Full { slots: 2 }));
        assert_eq!(
            Full { slots: 2 }.to_string(),
            "all 2 semaphore slots currently locked"
        );
        // A holder of a full semaphore still locks (recursively).
        assert_eq!(s.lock(&id("a"), 2), Ok(Transition::Unchanged));
    }

    #[test]
    fn unlock_is_idempotent() {
        let s = changed(Semaphore::new(1).lock(&id("a"), 1).unwrap());
        assert_eq!(s.unlock("b"), Transition::Unchanged);
        assert_eq!(
            s.unlock("A"),
            Transition::Unchanged,
            "ids are case-sensitive"
        );
        let s = changed(s.unlock("a"));
        assert!(s.holders().is_empty());
        assert_eq!(s.total_slots(), 1);
        assert_eq!(s.unlock("a"), Transition::Unchanged);
    }

    #[test]
    fn the_configured_slots_take_effect_at_the_next_lock() {
        let s = changed(Semaphore::new(1).lock(&id("a"), 1).unwrap());
        // Raised: admitted, and recorded.
        let s = changed(s.lock(&id("b"), 3).unwrap());
        assert_eq!(s.total_slots(), 3);
        let s = changed(s.lock(&id("c"), 3).unwrap());
        // Lowered below the holders: nobody is evicted, nobody new gets in.
        assert_eq!(s.lock(&id("d"), 1), Err(Full { slots: 1 }));
        assert_eq!(s.lock(&id("a"), 1), Ok(Transition::Unchanged));
        let s = changed(s.unlock("a"));
        let s = changed(s.unlock("b"));
        assert_eq!(s.lock(&id("d"), 1), Err(Full { slots: 1 }));
        let s = changed(s.unlock("c"));
        let s = changed(s.lock(&id("d"), 1).unwrap());
        assert_eq!((s.total_slots(), s.holders()), (1, &["d".to_owned()][..]));
        // Zero slots stops the line on purpose.
        assert_eq!(Semaphore::new(0).lock(&id("a"), 0), Err(Full { slots: 0 }));
    }

    #[test]
    fn airlock_layout_round_trips() {
        let s = changed(Semaphore::new(3).lock(&id("z\"q"), 3).unwrap());
        let s = changed(s.lock(&id("m"), 3).unwrap());
        assert_eq!(s.to_json(), r#"{"total_slots":3,"holders":["m","z\"q"]}"#);
        assert_eq!(Semaphore::parse(s.to_json().as_bytes()), Ok(s));
        assert_eq!(
            Semaphore::parse(br#"{"total_slots":1,"holders":[]}"#),
            Ok(Semaphore::new(1))
        );
        // What airlock itself writes, pretty or not.
        let s = Semaphore::parse(b" {\"holders\": [\"a\", \"b\"], \"total_slots\": 2}\n").unwrap();
        assert_eq!(s.holders(), ["a", "b"]);
    }

    #[test]
    fn stored_values_are_parsed_strictly() {
        let bad: &[(&[u8], &str)] = &[
            (b"", "not a semaphore"),
            (br#"{"total_slots":1}"#, "not a semaphore"),
            (br#"{"total_slots":-1,"holders":[]}"#, "not a semaphore"),
            (br#"{"total_slots":1,"holders":null}"#, "not a semaphore"),
            (
                br#"{"total_slots":1,"holders":[],"x":0}"#,
                "not a semaphore",
            ),
            (br#"{"total_slots":2,"holders":["b","a"]}"#, "not sorted"),
            (br#"{"total_slots":2,"holders":["a","a"]}"#, "not sorted"),
            (
                br#"{"total_slots":1,"holders":["a","b"]}"#,
                "2 holders but only 1 slots",
            ),
            (
                br#"{"total_slots":1,"holders":[""]}"#,
                "holder 0: empty client ID",
            ),
        ];
        for (bytes, text) in bad {
            let err = Semaphore::parse(bytes).unwrap_err();
            assert!(
                err.to_string().contains(text),
                "{:?}: {err}",
                String::from_utf8_lossy(bytes)
            );
        }
        let huge = vec![b' '; MAX_SEMAPHORE_LEN + 1];
        assert_eq!(
            Semaphore::parse(&huge),
            Err(SemaphoreError::TooLarge {
                len: MAX_SEMAPHORE_LEN + 1
            })
        );
    }

    proptest! {
        /// Any sequence of locks and unlocks keeps the invariants, never admits more than the
        /// slots, and matches a plain set model.
        #[test]
        fn transitions_match_a_set_model(ops in proptest::collection::vec((any::<bool>(), 0u8..6), 0..60), slots in 0u64..4) {
            let mut s = Semaphore::new(slots);
            let mut model = std::collections::BTreeSet::new();
            for (lock, n) in ops {
                let name = format!("n{n}");
                if lock {
                    match s.lock(&id(&name), slots) {
                        Ok(Transition::Changed(new)) => {
                            prop_assert!(model.insert(name.clone()));
                            s = new;
                        }
                        Ok(Transition::Unchanged) => prop_assert!(model.contains(&name)),
                        Err(Full { slots: n }) => {
                            prop_assert_eq!(n, slots);
                            prop_assert!(!model.contains(&name));
                            prop_assert_eq!(model.len() as u64, slots);
                        }
                    }
                } else {
                    match s.unlock(&name) {
                        Transition::Changed(new) => {
                            prop_assert!(model.remove(&name));
                            s = new;
                        }
                        Transition::Unchanged => prop_assert!(!model.contains(&name)),
                    }
                }
                prop_assert!(model.iter().eq(s.holders().iter()));
                prop_assert_eq!(Semaphore::parse(s.to_json().as_bytes()), Ok(s.clone()));
            }
        }
    }
}
