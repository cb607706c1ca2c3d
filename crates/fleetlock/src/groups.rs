//! The groups a server serves and their slots: `--group NAME=SLOTS`, repeatable; without any,
//! the group `default` with 1 slot (zincati's default group, airlock's default count).

use std::collections::BTreeMap;
use std::str::FromStr;

use thiserror::Error;

use crate::request::{GroupName, IdentityError};

/// The most slots a group may have. Far above any fleet's reboot parallelism; it bounds the
/// stored semaphore (see [`crate::semaphore::MAX_SEMAPHORE_LEN`]).
pub const MAX_SLOTS: u64 = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GroupsError {
    #[error("{arg:?}: expected NAME=SLOTS, e.g. default=1")]
    Syntax { arg: String },
    #[error("{arg:?}: {reason}")]
    Name { arg: String, reason: IdentityError },
    #[error("{arg:?}: slots must be a whole number from 0 to {MAX_SLOTS}")]
    Slots { arg: String },
    #[error("group {group} is given twice")]
    Duplicate { group: String },
}

/// One `NAME=SLOTS`. Zero slots is allowed: it stops a group's reboots on purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: GroupName,
    pub slots: u64,
}

impl FromStr for GroupSpec {
    type Err = GroupsError;

    fn from_str(arg: &str) -> Result<Self, GroupsError> {
        let (name, slots) = arg.split_once('=').ok_or_else(|| GroupsError::Syntax {
            arg: arg.to_owned(),
        })?;
        let name = GroupName::new(name).map_err(|reason| GroupsError::Name {
            arg: arg.to_owned(),
            reason,
        })?;
        let slots = slots
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= MAX_SLOTS)
            .ok_or_else(|| GroupsError::Slots {
                arg: arg.to_owned(),
            })?;
        Ok(GroupSpec { name, slots })
    }
}

/// The configured groups, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups(BTreeMap<GroupName, u64>);

impl Default for Groups {
    fn default() -> Self {
        Groups(BTreeMap::from([(GroupName::default_group(), 1)]))
    }
}

impl Groups {
    /// Exactly the groups given (a name twice is an error); none given: [`Groups::default`].
    /// `default` is not added next to explicit groups, so a client of an unlisted group is
    /// told `unknown_group` rather than silently sharing a slot.
    pub fn new(specs: impl IntoIterator<Item = GroupSpec>) -> Result<Self, GroupsError> {
        let mut map = BTreeMap::new();
        for spec in specs {
            if map.insert(spec.name.clone(), spec.slots).is_some() {
                return Err(GroupsError::Duplicate {
                    group: spec.name.to_string(),
                });
            }
        }
        if map.is_empty() {
            return Ok(Groups::default());
        }
        Ok(Groups(map))
    }

    pub fn slots(&self, group: &GroupName) -> Option<u64> {
        self.0.get(group).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&GroupName, u64)> {
        self.0.iter().map(|(g, n)| (g, *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(args: &[&str]) -> Result<Groups, GroupsError> {
        let specs = args
            .iter()
            .map(|a| a.parse::<GroupSpec>())
            .collect::<Result<Vec<_>, _>>()?;
        Groups::new(specs)
    }

    #[test]
    fn default_is_one_slot_named_default() {
        let g = specs(&[]).unwrap();
        assert_eq!(g, Groups::default());
        assert_eq!(g.slots(&GroupName::default_group()), Some(1));
    }

    #[test]
    fn explicit_groups_replace_the_default() {
        let g = specs(&["workers=2", "controllers=0", "web.eu-1=1024"]).unwrap();
        assert_eq!(g.slots(&GroupName::new("workers").unwrap()), Some(2));
        assert_eq!(g.slots(&GroupName::new("controllers").unwrap()), Some(0));
        assert_eq!(g.slots(&GroupName::new("web.eu-1").unwrap()), Some(1024));
        assert_eq!(g.slots(&GroupName::default_group()), None);
        assert_eq!(
            g.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["controllers", "web.eu-1", "workers"]
        );
    }

    #[test]
    fn bad_arguments() {
        for (arg, text) in [
            ("default", "expected NAME=SLOTS"),
            ("=1", "empty client group"),
            ("a/b=1", "must match"),
            ("a=", "whole number"),
            ("a=-1", "whole number"),
            ("a=1025", "whole number"),
            ("a=x", "whole number"),
        ] {
            let err = arg.parse::<GroupSpec>().unwrap_err().to_string();
            assert!(err.contains(text), "{arg}: {err}");
        }
        assert_eq!(
            specs(&["a=1", "b=1", "a=2"]),
            Err(GroupsError::Duplicate { group: "a".into() })
        );
    }
}
