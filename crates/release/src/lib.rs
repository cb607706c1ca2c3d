//! Releases and channels as values: the release index a registry holds beside the bundles
//! (docs/formats.md §10), what publishing, promoting and yanking do to it, and the update
//! agent's choice of the next version from the running one.
//!
//! Channels nest: a release published to `stable` is also in `beta` and `alpha`; a release is
//! only ever promoted towards `stable`. `min_from` is the oldest version that may upgrade
//! straight to a release (an upgrade barrier); a yanked release is never chosen, and a node on
//! one moves forward when it can. Versions compare as systemd-boot compares them (UAPI).
//!
//! Architecture invariant: pure — no IO; the CLI and the agent read and write the index.

mod choose;
mod failures;

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

pub use choose::{choose, Choice, Hold, Policy};
pub use failures::{FailureCounter, GIVE_UP_AFTER};

/// The only schema this slate reads and writes.
pub const INDEX_SCHEMA: u32 = 1;
/// An index larger than this is refused before it is parsed.
pub const MAX_INDEX_BYTES: usize = 4 << 20;
/// The media type of the index blob in the registry.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.slate.release-index.v1+json";
/// The tag of the release index in its repository.
pub const RELEASE_INDEX_TAG: &str = "releases";
/// Tags slate itself uses in a release repository: the index and the channel tags. A version is
/// pushed under its own name as a tag, so it may not take one of these (nor a signature tag,
/// `sha256-<hex>.sig`).
pub const RESERVED_TAGS: [&str; 4] = [RELEASE_INDEX_TAG, "alpha", "beta", "stable"];

/// A cosign signature tag, `sha256-<hex>.sig` (`slate_bundle::is_signature_tag`'s rule; this
/// crate is pure and does not depend on the bundle reader for one line).
fn is_signature_tag(tag: &str) -> bool {
    tag.starts_with("sha256-") && tag.ends_with(".sig")
}

/// Version order (UAPI, as systemd-boot sorts entries).
pub fn compare(a: &str, b: &str) -> Ordering {
    slate_bootspec::compare_versions(a, b)
}

/// A release channel, least conservative first: a channel sees the releases of its own and of
/// every more conservative channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Alpha,
    Beta,
    Stable,
}

impl Channel {
    pub const ALL: [Channel; 3] = [Channel::Alpha, Channel::Beta, Channel::Stable];

    pub fn parse(name: &str) -> Result<Channel, ReleaseError> {
        Channel::ALL
            .into_iter()
            .find(|c| c.as_str() == name)
            .ok_or_else(|| ReleaseError::UnknownChannel(name.to_owned()))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Alpha => "alpha",
            Channel::Beta => "beta",
            Channel::Stable => "stable",
        }
    }

    /// Whether a node following `self` sees a release published to `release`.
    pub fn sees(self, release: Channel) -> bool {
        release >= self
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One published version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    pub version: String,
    /// The bundle's image manifest digest (`sha256:…`): what a node pulls.
    pub digest: String,
    /// When it was first published (RFC 3339, UTC).
    pub created: String,
    /// The most conservative channel it has been promoted to.
    pub channel: Channel,
    /// Built and signed by the release pipeline (not a developer's build).
    #[serde(default)]
    pub official: bool,
    /// The oldest version that may upgrade straight to this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_from: Option<String>,
    /// Why it was yanked; a yanked release is never installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yanked: Option<String>,
}

impl Release {
    pub fn is_yanked(&self) -> bool {
        self.yanked.is_some()
    }

    /// Whether a node running `running` may upgrade straight to this release.
    pub fn reachable_from(&self, running: &str) -> bool {
        self.min_from
            .as_deref()
            .is_none_or(|min| compare(running, min) != Ordering::Less)
    }
}

/// Every release of one repository, in version order (oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseIndex {
    pub schema: u32,
    pub releases: Vec<Release>,
}

impl Default for ReleaseIndex {
    fn default() -> Self {
        ReleaseIndex {
            schema: INDEX_SCHEMA,
            releases: Vec::new(),
        }
    }
}

/// Why an index or an operation on it was refused. Nothing is changed by a refused operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    #[error("the release index is {len} bytes; at most {MAX_INDEX_BYTES} are accepted")]
    TooLarge { len: usize },
    #[error("the release index is not valid JSON of schema {INDEX_SCHEMA}: {0}")]
    Malformed(String),
    #[error("release index schema {0} is not one this slate reads ({INDEX_SCHEMA})")]
    Schema(u32),
    #[error("{0:?} is not a channel (alpha, beta or stable)")]
    UnknownChannel(String),
    #[error("{version:?} is not a release version (A-Z a-z 0-9 . + ~ - _, at most 64)")]
    BadVersion { version: String },
    #[error(
        "version {version:?} is a tag slate uses itself ({}, sha256-….sig); a release may not \
         take its name",
        RESERVED_TAGS.join(", ")
    )]
    ReservedVersion { version: String },
    #[error(
        "release {version}: created {created:?} is not an RFC 3339 time in UTC \
         (e.g. 2026-12-01T00:00:00Z)"
    )]
    BadCreated { version: String, created: String },
    #[error("{digest:?} is not a sha256 digest (sha256: and 64 lower-case hex digits)")]
    BadDigest { digest: String },
    #[error("version {0} is listed twice")]
    Duplicate(String),
    #[error("release {version}: min_from {min_from} is not older than the release")]
    MinFrom { version: String, min_from: String },
    #[error(
        "version {version} is already published as {existing}; a version's bundle never \
         changes (publish a new version)"
    )]
    DigestConflict { version: String, existing: String },
    #[error("version {version} is in {current}; promotion goes forward only (not to {asked})")]
    Demotion {
        version: String,
        current: Channel,
        asked: Channel,
    },
    #[error("version {version} was yanked ({reason}); it cannot be published again")]
    Yanked { version: String, reason: String },
    #[error("no release {0} in the index")]
    NotFound(String),
}

/// What [`ReleaseIndex::publish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    New,
    Promoted {
        from: Channel,
        to: Channel,
    },
    /// Already there, in that channel or a more conservative one.
    Unchanged,
}

fn check_version(version: &str) -> Result<(), ReleaseError> {
    let ok = !version.is_empty()
        && version.len() <= 64
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+~-_".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ReleaseError::BadVersion {
            version: version.to_owned(),
        })
    }
}

/// A version as the name of a release: a version, and not one of slate's own tags.
pub fn check_release_version(version: &str) -> Result<(), ReleaseError> {
    check_version(version)?;
    if RESERVED_TAGS.contains(&version) || is_signature_tag(version) {
        return Err(ReleaseError::ReservedVersion {
            version: version.to_owned(),
        });
    }
    Ok(())
}

fn check_created(release: &Release) -> Result<(), ReleaseError> {
    // humantime's RFC 3339 reader takes UTC only (`Z`), which is what the index promises.
    humantime::parse_rfc3339(&release.created)
        .map(|_| ())
        .map_err(|_| ReleaseError::BadCreated {
            version: release.version.clone(),
            created: release.created.clone(),
        })
}

fn check_digest(digest: &str) -> Result<(), ReleaseError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(ReleaseError::BadDigest {
            digest: digest.to_owned(),
        })
    }
}

fn check_release(release: &Release) -> Result<(), ReleaseError> {
    check_release_version(&release.version)?;
    check_digest(&release.digest)?;
    check_created(release)?;
    if let Some(min) = &release.min_from {
        check_version(min)?;
        if compare(min, &release.version) != Ordering::Less {
            return Err(ReleaseError::MinFrom {
                version: release.version.clone(),
                min_from: min.clone(),
            });
        }
    }
    Ok(())
}

impl ReleaseIndex {
    /// Parse and check an index: schema, every version (none named like a tag slate reserves),
    /// digest and `created` (RFC 3339, UTC), no version twice. The
    /// releases come back in version order whatever order the document had.
    pub fn parse(bytes: &[u8]) -> Result<ReleaseIndex, ReleaseError> {
        if bytes.len() > MAX_INDEX_BYTES {
            return Err(ReleaseError::TooLarge { len: bytes.len() });
        }
        let mut index: ReleaseIndex =
            serde_json::from_slice(bytes).map_err(|e| ReleaseError::Malformed(e.to_string()))?;
        if index.schema != INDEX_SCHEMA {
            return Err(ReleaseError::Schema(index.schema));
        }
        index.releases.iter().try_for_each(check_release)?;
        index
            .releases
            .sort_by(|a, b| compare(&a.version, &b.version));
        for pair in index.releases.windows(2) {
            if compare(&pair[0].version, &pair[1].version) == Ordering::Equal {
                return Err(ReleaseError::Duplicate(pair[1].version.clone()));
            }
        }
        Ok(index)
    }

    /// The document (pretty JSON, releases in version order).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a release index always serializes")
    }

    pub fn get(&self, version: &str) -> Option<&Release> {
        self.releases
            .iter()
            .find(|r| compare(&r.version, version) == Ordering::Equal)
    }

    /// Add a release, or promote an existing one (same digest) to a more conservative channel.
    pub fn publish(&mut self, release: Release) -> Result<Published, ReleaseError> {
        check_release(&release)?;
        if let Some(existing) = self
            .releases
            .iter_mut()
            .find(|r| compare(&r.version, &release.version) == Ordering::Equal)
        {
            if existing.digest != release.digest {
                return Err(ReleaseError::DigestConflict {
                    version: release.version,
                    existing: existing.digest.clone(),
                });
            }
            if let Some(reason) = &existing.yanked {
                return Err(ReleaseError::Yanked {
                    version: release.version,
                    reason: reason.clone(),
                });
            }
            return match release.channel.cmp(&existing.channel) {
                Ordering::Less => Err(ReleaseError::Demotion {
                    version: release.version,
                    current: existing.channel,
                    asked: release.channel,
                }),
                Ordering::Equal => Ok(Published::Unchanged),
                Ordering::Greater => {
                    let from = existing.channel;
                    existing.channel = release.channel;
                    Ok(Published::Promoted {
                        from,
                        to: release.channel,
                    })
                }
            };
        }
        let at = self
            .releases
            .partition_point(|r| compare(&r.version, &release.version) == Ordering::Less);
        self.releases.insert(at, release);
        Ok(Published::New)
    }

    /// Mark a release bad (idempotent; the first reason stays).
    pub fn yank(&mut self, version: &str, reason: &str) -> Result<&Release, ReleaseError> {
        let release = self
            .releases
            .iter_mut()
            .find(|r| compare(&r.version, version) == Ordering::Equal)
            .ok_or_else(|| ReleaseError::NotFound(version.to_owned()))?;
        if release.yanked.is_none() {
            release.yanked = Some(reason.to_owned());
        }
        Ok(release)
    }

    /// The releases a node following `channel` sees, oldest first (yanked ones included:
    /// `list` shows them; [`choose`] never picks them).
    pub fn visible(&self, channel: Channel) -> impl Iterator<Item = &Release> {
        self.releases
            .iter()
            .filter(move |r| channel.sees(r.channel))
    }
}

#[cfg(test)]
mod tests;
