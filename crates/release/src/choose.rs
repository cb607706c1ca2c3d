//! The update agent's decision: from the running version, which release to install next.

use std::cmp::Ordering;

use crate::{compare, Channel, Release, ReleaseIndex};

/// The node's own limits, from its machine configuration and its history.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy<'a> {
    /// Go to exactly this version and stay there (stepping through intermediate versions when a
    /// barrier requires).
    pub pin: Option<&'a str>,
    /// Never move past this version.
    pub max_version: Option<&'a str>,
    /// Versions the agent gave up on (reverted too often).
    pub skip: &'a [String],
}

/// What the agent should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice<'a> {
    /// Install this release (the newest the channel, the limits and the barriers allow).
    Upgrade(&'a Release),
    /// Nothing to do, and why.
    Hold(Hold),
}

/// Why the agent installs nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// No allowed release is newer than the running one.
    UpToDate,
    /// The running version is the pinned one.
    Pinned { version: String },
    /// The pinned version is not in the channel (or yanked, or given up).
    PinUnavailable { version: String, channel: Channel },
    /// Newer releases exist, but each needs a newer starting point than the running one and
    /// no release in between leads there.
    Barrier {
        newest: String,
        min_from: String,
        running: String,
    },
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hold::UpToDate => write!(f, "up to date"),
            Hold::Pinned { version } => write!(f, "pinned to {version}"),
            Hold::PinUnavailable { version, channel } => write!(
                f,
                "pinned to {version}, which channel {channel} does not offer"
            ),
            Hold::Barrier {
                newest,
                min_from,
                running,
            } => write!(
                f,
                "{newest} upgrades only from {min_from} or newer, and nothing leads there from \
                 {running}"
            ),
        }
    }
}

fn at_most(version: &str, limit: &str) -> bool {
    compare(version, limit) != Ordering::Greater
}

/// The release to install next from `running` on `channel`: never a downgrade, never a
/// yanked or given-up version, nothing past `max_version` or the pin; the newest one that the
/// running version may upgrade to straight (its `min_from` barrier), so a node behind a
/// barrier steps through an intermediate release.
pub fn choose<'a>(
    index: &'a ReleaseIndex,
    channel: Channel,
    running: &str,
    policy: &Policy<'_>,
) -> Choice<'a> {
    if let Some(pin) = policy.pin {
        if compare(running, pin) == Ordering::Equal {
            return Choice::Hold(Hold::Pinned {
                version: pin.to_owned(),
            });
        }
    }
    let allowed = |r: &&Release| {
        !r.is_yanked()
            && compare(&r.version, running) == Ordering::Greater
            && !policy
                .skip
                .iter()
                .any(|s| compare(s, &r.version) == Ordering::Equal)
            && policy
                .max_version
                .is_none_or(|max| at_most(&r.version, max))
            && policy.pin.is_none_or(|pin| at_most(&r.version, pin))
    };
    let candidates: Vec<&Release> = index.visible(channel).filter(allowed).collect();
    if let Some(pin) = policy.pin {
        let offered = candidates
            .iter()
            .any(|r| compare(&r.version, pin) == Ordering::Equal);
        if !offered {
            return Choice::Hold(Hold::PinUnavailable {
                version: pin.to_owned(),
                channel,
            });
        }
    }
    if let Some(next) = candidates.iter().rev().find(|r| r.reachable_from(running)) {
        return Choice::Upgrade(next);
    }
    match candidates.last() {
        None => Choice::Hold(Hold::UpToDate),
        Some(newest) => Choice::Hold(Hold::Barrier {
            newest: newest.version.clone(),
            min_from: newest.min_from.clone().unwrap_or_default(),
            running: running.to_owned(),
        }),
    }
}
