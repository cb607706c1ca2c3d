//! Rollout policies: the TOML a user sets with `slate fleet policy set FILE`, checked whole
//! before anything is stored, and what they mean for one node.
//!
//! Several policies may apply to a node (by group and labels); every one of them must allow a
//! step. Settings that are one value per node, not a limit, are combined to the safer choice:
//! the most conservative channel, `in-place` over `replace`, the shortest upgrade timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use slate_machine_config::Window;
use slate_release::Channel;

use crate::node::NodeReport;

/// How long a node may take from the upgrade call to a committed boot when no policy says.
pub const DEFAULT_UPGRADE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Why a policy file is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("the policy file is not valid TOML for a policy set: {0}")]
    Syntax(String),
    #[error("policy {policy:?}: {field}: {reason}")]
    Invalid {
        policy: String,
        field: &'static str,
        reason: String,
    },
    #[error("two policies are named {0:?}")]
    Duplicate(String),
}

/// The policy file: `[[policy]]` tables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    #[serde(default)]
    pub policy: Vec<PolicySpec>,
}

/// One `[[policy]]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub name: String,
    /// The node groups it applies to; empty: every group.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Labels a node must carry (all of them) for the policy to apply.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The release channel for the nodes it covers (otherwise the node's own).
    #[serde(default)]
    pub channel: Option<String>,
    /// `in-place` (the upgrade transaction) or `replace` (a fresh install).
    #[serde(default)]
    pub strategy: Option<String>,
    /// At most this many of its nodes unavailable at once: `"10%"` or `"2"`.
    #[serde(default)]
    pub max_unavailable: Option<String>,
    /// At most this many upgrade starts per hour or day: `"20/hour"`, `"100/day"`.
    #[serde(default)]
    pub rate: Option<String>,
    /// Upgrades start only inside one of these (UTC); none: any time.
    #[serde(default)]
    pub windows: Vec<Window>,
    /// Cumulative percentages of its nodes, ascending, the last 100; each wave starts when the
    /// previous ones have finished and soaked.
    #[serde(default)]
    pub waves: Vec<WaveSpec>,
    /// Pause the rollout when this many of its nodes failed (reverted, or never committed).
    #[serde(default)]
    pub failure_budget: Option<u32>,
    /// The nodes it covers form a quorum (etcd, a control plane): never take one down when
    /// the healthy ones left would be no majority.
    #[serde(default)]
    pub quorum: bool,
    /// A plain HTTP URL (`{host}` replaced by the node's host) that must answer 2xx for a
    /// soaking node to count as healthy, besides machined's own checks.
    #[serde(default)]
    pub probe: Option<String>,
    /// How long an upgrade may take to a committed boot before it counts as failed.
    #[serde(default)]
    pub upgrade_timeout: Option<String>,
    /// Also roll out releases not marked official.
    #[serde(default)]
    pub allow_unofficial: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaveSpec {
    pub percent: u32,
    /// How long the wave's nodes must stay healthy after they committed.
    #[serde(default)]
    pub soak: Option<String>,
}

/// How the node gets the new version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    InPlace,
    Replace,
}

/// A limit on unavailable nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limit {
    Percent(u32),
    Count(u32),
}

impl Limit {
    /// The number of nodes allowed out of `members`: a percentage rounds down but allows at
    /// least one (10 % of 5 nodes is one at a time, not none).
    pub fn of(self, members: usize) -> usize {
        match self {
            Limit::Count(n) => n as usize,
            Limit::Percent(p) => (members * p as usize / 100).max(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub starts: u32,
    pub per_seconds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wave {
    pub percent: u32,
    pub soak: Duration,
}

/// One checked policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub groups: BTreeSet<String>,
    pub labels: BTreeMap<String, String>,
    pub channel: Option<Channel>,
    pub strategy: Option<Strategy>,
    pub max_unavailable: Option<Limit>,
    pub rate: Option<Rate>,
    pub windows: Vec<Window>,
    pub waves: Vec<Wave>,
    pub failure_budget: Option<u32>,
    pub quorum: bool,
    pub probe: Option<String>,
    pub upgrade_timeout: Option<Duration>,
    pub allow_unofficial: bool,
}

impl Policy {
    /// Whether it covers `node`.
    pub fn applies_to(&self, node: &NodeReport) -> bool {
        (self.groups.is_empty() || self.groups.contains(&node.group))
            && self
                .labels
                .iter()
                .all(|(k, v)| node.labels.get(k) == Some(v))
    }
}

/// Every policy, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySet {
    pub policies: Vec<Policy>,
}

impl PolicySet {
    /// Parses and checks a policy file; nothing partial: any error refuses the whole file.
    pub fn parse(toml_text: &str) -> Result<PolicySet, PolicyError> {
        let file: PolicyFile =
            toml::from_str(toml_text).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        Self::from_file(&file)
    }

    pub fn from_file(file: &PolicyFile) -> Result<PolicySet, PolicyError> {
        let mut names = BTreeSet::new();
        let mut policies = Vec::new();
        for spec in &file.policy {
            if !names.insert(spec.name.clone()) {
                return Err(PolicyError::Duplicate(spec.name.clone()));
            }
            policies.push(check(spec)?);
        }
        Ok(PolicySet { policies })
    }

    /// The policies that cover `node`, in file order.
    pub fn for_node<'a>(&'a self, node: &'a NodeReport) -> impl Iterator<Item = &'a Policy> {
        self.policies.iter().filter(|p| p.applies_to(node))
    }

    /// The node's channel: the most conservative any covering policy names, else its own.
    pub fn channel_of(&self, node: &NodeReport) -> Option<Channel> {
        self.for_node(node)
            .filter_map(|p| p.channel)
            .max()
            .or_else(|| Channel::parse(&node.channel).ok())
    }

    /// `in-place` unless every covering policy that names a strategy says `replace`.
    pub fn strategy_of(&self, node: &NodeReport) -> Strategy {
        self.for_node(node)
            .filter_map(|p| p.strategy)
            .min()
            .unwrap_or(Strategy::InPlace)
    }

    pub fn upgrade_timeout_of(&self, node: &NodeReport) -> Duration {
        self.for_node(node)
            .filter_map(|p| p.upgrade_timeout)
            .min()
            .unwrap_or(DEFAULT_UPGRADE_TIMEOUT)
    }

    /// Whether unofficial releases may be rolled out to `node`: only when every covering
    /// policy allows them.
    pub fn allows_unofficial(&self, node: &NodeReport) -> bool {
        let mut covering = self.for_node(node).peekable();
        covering.peek().is_some() && covering.all(|p| p.allow_unofficial)
    }
}

fn check(spec: &PolicySpec) -> Result<Policy, PolicyError> {
    let invalid = |field: &'static str, reason: String| PolicyError::Invalid {
        policy: spec.name.clone(),
        field,
        reason,
    };
    if spec.name.trim().is_empty() {
        return Err(invalid("name", "must not be empty".into()));
    }
    let channel = spec
        .channel
        .as_deref()
        .map(Channel::parse)
        .transpose()
        .map_err(|e| invalid("channel", e.to_string()))?;
    let strategy = match spec.strategy.as_deref() {
        None => None,
        Some("in-place") => Some(Strategy::InPlace),
        Some("replace") => Some(Strategy::Replace),
        Some(other) => {
            return Err(invalid(
                "strategy",
                format!("{other:?} is neither \"in-place\" nor \"replace\""),
            ))
        }
    };
    let max_unavailable = spec
        .max_unavailable
        .as_deref()
        .map(parse_limit)
        .transpose()
        .map_err(|reason| invalid("max_unavailable", reason))?;
    let rate = spec
        .rate
        .as_deref()
        .map(parse_rate)
        .transpose()
        .map_err(|reason| invalid("rate", reason))?;
    for (i, window) in spec.windows.iter().enumerate() {
        window
            .parse(&format!("windows[{i}]"))
            .map_err(|e| invalid("windows", e.to_string()))?;
    }
    let mut waves = Vec::new();
    for (i, wave) in spec.waves.iter().enumerate() {
        let previous = waves.last().map_or(0, |w: &Wave| w.percent);
        if wave.percent <= previous || wave.percent > 100 {
            return Err(invalid(
                "waves",
                format!(
                    "wave {} is {} %: percentages are cumulative, ascending, 1 … 100",
                    i + 1,
                    wave.percent
                ),
            ));
        }
        let soak = match &wave.soak {
            None => Duration::ZERO,
            Some(text) => duration(text).map_err(|reason| invalid("waves", reason))?,
        };
        waves.push(Wave {
            percent: wave.percent,
            soak,
        });
    }
    if waves.last().is_some_and(|w| w.percent != 100) {
        return Err(invalid(
            "waves",
            "the last wave must be 100 % (the rest of the nodes)".into(),
        ));
    }
    if spec.failure_budget == Some(0) {
        return Err(invalid(
            "failure_budget",
            "must be at least 1 (the number of failed nodes that pauses the rollout)".into(),
        ));
    }
    if let Some(probe) = &spec.probe {
        if probe_target(probe, "node").is_none() {
            return Err(invalid(
                "probe",
                format!(
                    "{probe:?} is not an http://HOST[:PORT]/PATH URL (`{{host}}` is the node's \
                     host; no TLS for probes)"
                ),
            ));
        }
    }
    let upgrade_timeout = spec
        .upgrade_timeout
        .as_deref()
        .map(duration)
        .transpose()
        .map_err(|reason| invalid("upgrade_timeout", reason))?;
    if upgrade_timeout.is_some_and(|t| t.is_zero()) {
        return Err(invalid("upgrade_timeout", "must be more than 0".into()));
    }
    Ok(Policy {
        name: spec.name.clone(),
        groups: spec.groups.iter().cloned().collect(),
        labels: spec.labels.clone(),
        channel,
        strategy,
        max_unavailable,
        rate,
        windows: spec.windows.clone(),
        waves,
        failure_budget: spec.failure_budget,
        quorum: spec.quorum,
        probe: spec.probe.clone(),
        upgrade_timeout,
        allow_unofficial: spec.allow_unofficial,
    })
}

fn duration(text: &str) -> Result<Duration, String> {
    slate_machine_config::duration(text)
        .map_err(|e| format!("{text:?} is not a duration like \"10m\" or \"1h30m\": {e}"))
}

fn parse_limit(text: &str) -> Result<Limit, String> {
    let bad = || format!("{text:?} is neither a percentage like \"10%\" nor a count like \"2\"");
    let limit = match text.trim().strip_suffix('%') {
        Some(p) => Limit::Percent(p.trim().parse().map_err(|_| bad())?),
        None => Limit::Count(text.trim().parse().map_err(|_| bad())?),
    };
    match limit {
        Limit::Percent(0) | Limit::Count(0) => Err(format!("{text:?} allows no node at all")),
        Limit::Percent(p) if p > 100 => Err(format!("{text:?} is more than 100 %")),
        limit => Ok(limit),
    }
}

fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = || format!("{text:?} is not a rate like \"20/hour\" or \"100/day\"");
    let (count, unit) = text.split_once('/').ok_or_else(bad)?;
    let starts: u32 = count.trim().parse().map_err(|_| bad())?;
    let per_seconds = match unit.trim() {
        "hour" | "h" => 3600,
        "day" | "d" => 86_400,
        _ => return Err(bad()),
    };
    if starts == 0 {
        return Err(format!("{text:?} allows no upgrade at all"));
    }
    Ok(Rate {
        starts,
        per_seconds,
    })
}

/// Where a probe goes for a node on `host`: (`HOST:PORT`, path), from `http://…{host}…`, or
/// `None` when the URL is not plain HTTP.
pub fn probe_target(probe: &str, host: &str) -> Option<(String, String)> {
    let url = probe.replace("{host}", host);
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains(['@', ' ']) || path.contains(' ') {
        return None;
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Some((authority, path.to_owned()))
}
