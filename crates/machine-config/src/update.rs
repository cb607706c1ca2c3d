//! Update settings: which channel the node follows, how it takes updates, and when. Parsed
//! and validated here; the update agent acts on them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateSettings {
    /// Whether the node updates itself at all.
    #[serde(default)]
    pub enabled: bool,
    /// The release repository the agent follows (`host[:port]/path`, no tag): its release
    /// index (tag `releases`) and the bundles, pulled by digest. Required when the node
    /// updates itself (`enabled`, any strategy but `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Plain HTTP to that registry (a registry on a private network without TLS); the
    /// bundles are verified against the image's trusted keys either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// The release channel: `stable`, `beta` or `alpha`.
    #[serde(default = "default_channel")]
    pub channel: String,
    #[serde(default)]
    pub strategy: Strategy,
    /// How often the registry is asked (`"1h"`, `"15m"`; 10 s to 7 days); a random jitter of up
    /// to a tenth is added.
    #[serde(default = "default_poll_interval")]
    pub poll_interval: String,
    /// When updates may be applied (periodic and fleet-lock strategies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Window>,
    /// The FleetLock server (`http://host:port`), fleet-lock strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_server: Option<String>,
    /// The FleetLock group (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_group: Option<String>,
    /// Stay on exactly this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
    /// Never move past this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_version: Option<String>,
    /// The rollout operator's replicas (`HOST:PORT`), operator strategy: the node reports
    /// itself to the first that answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operator: Vec<String>,
    /// The node group the operator rolls out by (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Labels the operator's policies select on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `HOST:PORT` at which the operator reaches this node's API (default: the node's name
    /// and the API port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
}

impl Default for UpdateSettings {
    fn default() -> Self {
        UpdateSettings {
            enabled: false,
            image: None,
            insecure: false,
            channel: default_channel(),
            strategy: Strategy::default(),
            poll_interval: default_poll_interval(),
            windows: Vec::new(),
            lock_server: None,
            lock_group: None,
            pin: None,
            max_version: None,
            operator: Vec::new(),
            group: None,
            labels: BTreeMap::new(),
            advertise: None,
        }
    }
}

impl UpdateSettings {
    /// The poll interval (validated; an unparsable one reads as the default hour).
    pub fn poll_interval(&self) -> Duration {
        humantime::parse_duration(&self.poll_interval).unwrap_or(Duration::from_secs(3600))
    }
}

fn default_channel() -> String {
    "stable".to_owned()
}

fn default_poll_interval() -> String {
    "1h".to_owned()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Apply a new release as soon as it is seen.
    #[default]
    Immediate,
    /// Apply only inside a maintenance window.
    Periodic,
    /// Inside a window, and only holding a FleetLock slot.
    FleetLock,
    /// The rollout operator decides.
    Operator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Weekday {
    pub const ALL: [Weekday; 7] = [
        Weekday::Mon,
        Weekday::Tue,
        Weekday::Wed,
        Weekday::Thu,
        Weekday::Fri,
        Weekday::Sat,
        Weekday::Sun,
    ];

    fn parse(text: &str) -> Option<Weekday> {
        let lower = text.to_ascii_lowercase();
        Weekday::ALL
            .into_iter()
            .find(|d| lower == d.name() || (lower.len() > 3 && d.long_name().starts_with(&lower)))
    }

    pub fn name(self) -> &'static str {
        ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][self as usize]
    }

    fn long_name(self) -> &'static str {
        [
            "monday",
            "tuesday",
            "wednesday",
            "thursday",
            "friday",
            "saturday",
            "sunday",
        ][self as usize]
    }
}

const MINUTES_PER_DAY: u32 = 24 * 60;
const MINUTES_PER_WEEK: u32 = 7 * MINUTES_PER_DAY;

/// A maintenance window: on each of `days`, from `start` (UTC, `HH:MM`) for `length`. It may
/// run past midnight and past Sunday into Monday.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// `["mon", "thu"]`, or `["*"]` for every day.
    pub days: Vec<String>,
    pub start: String,
    pub length: String,
}

impl Window {
    /// The window's days, start (minutes after midnight) and length, or why not.
    pub fn parse(&self, field: &str) -> Result<(Vec<Weekday>, u32, Duration), ConfigError> {
        let mut days = Vec::new();
        if self.days.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.days"),
                "names no day (use [\"*\"] for every day)",
            ));
        }
        for day in &self.days {
            if day == "*" {
                days.extend(Weekday::ALL);
            } else {
                days.push(Weekday::parse(day).ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{field}.days"),
                        format!("{day:?} is not a day (mon … sun, or \"*\")"),
                    )
                })?);
            }
        }
        days.sort();
        days.dedup();
        let start = parse_clock(&self.start).ok_or_else(|| {
            ConfigError::invalid(
                format!("{field}.start"),
                format!("{:?} is not a time of day HH:MM (UTC)", self.start),
            )
        })?;
        let length = parse_duration(&self.length, &format!("{field}.length"))?;
        if length.is_zero() || length > Duration::from_secs(u64::from(MINUTES_PER_WEEK) * 60) {
            return Err(ConfigError::invalid(
                format!("{field}.length"),
                "must be more than 0 and at most 7 days",
            ));
        }
        Ok((days, start, length))
    }

    /// Whether `minute_of_week` (0 = Monday 00:00 UTC) falls inside the window.
    pub fn contains(&self, minute_of_week: u32) -> bool {
        let Ok((days, start, length)) = self.parse("window") else {
            return false;
        };
        let length = (length.as_secs() / 60) as u32;
        days.iter().any(|day| {
            let opens = *day as u32 * MINUTES_PER_DAY + start;
            let since =
                (minute_of_week % MINUTES_PER_WEEK + MINUTES_PER_WEEK - opens) % MINUTES_PER_WEEK;
            since < length
        })
    }
}

/// Minutes from `minute_of_week` (0 = Monday 00:00 UTC) until one of `windows` is open: 0 when
/// one is open now; `None` without a (valid) window.
pub fn minutes_until_open(windows: &[Window], minute_of_week: u32) -> Option<u32> {
    windows
        .iter()
        .filter_map(|w| {
            let (days, start, length) = w.parse("window").ok()?;
            let length = (length.as_secs() / 60) as u32;
            days.iter()
                .map(|day| {
                    let opens = *day as u32 * MINUTES_PER_DAY + start;
                    let since = (minute_of_week % MINUTES_PER_WEEK + MINUTES_PER_WEEK - opens)
                        % MINUTES_PER_WEEK;
                    if since < length {
                        0
                    } else {
                        MINUTES_PER_WEEK - since
                    }
                })
                .min()
        })
        .min()
}

/// The minute of the week (0 = Monday 00:00 UTC) of a Unix time. 1970-01-01 was a Thursday.
pub fn minute_of_week(unix_seconds: u64) -> u32 {
    let days = unix_seconds / 86_400;
    let weekday = (days + 3) % 7;
    (weekday * u64::from(MINUTES_PER_DAY) + (unix_seconds % 86_400) / 60) as u32
}

/// `Tue 02:00` for a minute of the week.
pub fn describe_minute_of_week(minute_of_week: u32) -> String {
    let minute = minute_of_week % MINUTES_PER_WEEK;
    let day = Weekday::ALL[(minute / MINUTES_PER_DAY) as usize].name();
    let mut name = day.to_owned();
    name[..1].make_ascii_uppercase();
    let in_day = minute % MINUTES_PER_DAY;
    format!("{name} {:02}:{:02}", in_day / 60, in_day % 60)
}

fn parse_clock(text: &str) -> Option<u32> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

/// A duration as `"90m"`, `"1h30m"`, `"45s"`.
pub(crate) fn parse_duration(text: &str, field: &str) -> Result<Duration, ConfigError> {
    duration(text).map_err(|reason| {
        ConfigError::invalid(
            field,
            format!("{text:?} is not a duration like \"90m\" or \"1h30m\": {reason}"),
        )
    })
}

/// humantime's durations, each unit at most once and largest first: humantime sums `1h1h1h`
/// to three hours, which is a typo far more often than a meaning (issue 44). Shared with the
/// rollout policies.
pub fn duration(text: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    let mut last: Option<(u8, &str)> = None;
    let mut rest = text.trim();
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let after = rest[digits..].trim_start();
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let unit = &after[..unit_len];
        let Some(rank) = unit_rank(unit) else {
            break; // humantime took it; nothing to say about order
        };
        if let Some((previous, name)) = last {
            if rank == previous {
                return Err(format!("the unit {unit:?} comes twice (after {name:?})"));
            }
            if rank > previous {
                return Err(format!(
                    "the unit {unit:?} comes after the smaller {name:?} (largest first)"
                ));
            }
        }
        last = Some((rank, unit));
        rest = after[unit_len..].trim_start();
    }
    Ok(parsed)
}

/// The size order of humantime's unit names (larger unit, larger rank).
fn unit_rank(unit: &str) -> Option<u8> {
    Some(match unit {
        "nsec" | "ns" => 0,
        "usec" | "us" => 1,
        "msec" | "ms" => 2,
        "seconds" | "second" | "sec" | "s" => 3,
        "minutes" | "minute" | "min" | "m" => 4,
        "hours" | "hour" | "hr" | "h" => 5,
        "days" | "day" | "d" => 6,
        "weeks" | "week" | "w" => 7,
        "months" | "month" | "M" => 8,
        "years" | "year" | "y" => 9,
        _ => return None,
    })
}
