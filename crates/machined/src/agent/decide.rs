//! One tick of the update agent as a value: from the update settings, the running version,
//! the release index, the give-up counter, the clock and what is already downloaded, what to
//! do next. Pure: the loop in `agent` does the IO each step names.

pub use slate_machine_config::minute_of_week;
use slate_machine_config::{describe_minute_of_week, minutes_until_open, Strategy, UpdateSettings};
use slate_release::ReleaseIndex;
use slate_release::{choose, compare, Channel, Choice, FailureCounter, Hold, Policy, Release};

/// What the agent does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<'a> {
    /// Nothing to install; the reason is what `slate status` shows.
    Hold(String),
    /// Fetch and verify this release's bundle (ahead of any window).
    Download(&'a Release),
    /// The bundle is here; the window is closed for `minutes` more.
    WaitForWindow {
        release: &'a Release,
        opens: String,
        minutes: u32,
    },
    /// Install it now (after taking a FleetLock slot when `lock`).
    Apply { release: &'a Release, lock: bool },
}

/// What one tick decides from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub settings: &'a UpdateSettings,
    pub running: &'a str,
    pub index: &'a ReleaseIndex,
    pub failures: &'a FailureCounter,
    /// Minutes since Monday 00:00 UTC.
    pub minute_of_week: u32,
    /// The version whose bundle is downloaded and verified, if any.
    pub downloaded: Option<&'a str>,
}

/// The newest release `channel` offers that is not yanked (what status calls "available").
pub fn newest_available(index: &ReleaseIndex, channel: Channel) -> Option<&Release> {
    index.visible(channel).filter(|r| !r.is_yanked()).last()
}

pub fn decide<'a>(inputs: &Inputs<'a>) -> Step<'a> {
    let settings = inputs.settings;
    let Ok(channel) = Channel::parse(&settings.channel) else {
        return Step::Hold(format!("{:?} is not a release channel", settings.channel));
    };
    let skip = inputs.failures.skipped();
    let policy = Policy {
        pin: settings.pin.as_deref(),
        max_version: settings.max_version.as_deref(),
        skip: &skip,
    };
    let release = match choose(inputs.index, channel, inputs.running, &policy) {
        Choice::Upgrade(release) => release,
        Choice::Hold(hold) => return Step::Hold(hold_reason(&hold, inputs, channel, &skip)),
    };
    if inputs.downloaded != Some(release.version.as_str()) {
        return Step::Download(release);
    }
    let windowed = matches!(settings.strategy, Strategy::Periodic | Strategy::FleetLock);
    if windowed {
        match minutes_until_open(&settings.windows, inputs.minute_of_week) {
            Some(0) => {}
            Some(minutes) => {
                return Step::WaitForWindow {
                    release,
                    opens: describe_minute_of_week(inputs.minute_of_week + minutes),
                    minutes,
                }
            }
            None => return Step::Hold("no valid maintenance window".into()),
        }
    }
    Step::Apply {
        release,
        lock: settings.strategy == Strategy::FleetLock,
    }
}

/// A hold as status says it; "up to date" names a newer version that was given up on, since
/// that is why the node stays.
fn hold_reason(hold: &Hold, inputs: &Inputs<'_>, channel: Channel, skip: &[String]) -> String {
    if *hold == Hold::UpToDate {
        let given_up = skip
            .iter()
            .filter(|v| compare(v, inputs.running).is_gt())
            .filter(|v| inputs.index.visible(channel).any(|r| r.version == **v))
            .filter_map(|v| inputs.failures.describe(v))
            .next_back();
        if let Some(reason) = given_up {
            return reason;
        }
    }
    hold.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_machine_config::Window;
    use slate_release::Channel;

    fn release(version: &str, channel: Channel) -> Release {
        Release {
            version: version.into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            created: "2026-12-01T00:00:00Z".into(),
            channel,
            official: true,
            min_from: None,
            yanked: None,
        }
    }

    fn index(releases: Vec<Release>) -> ReleaseIndex {
        let mut index = ReleaseIndex::default();
        for r in releases {
            index.publish(r).unwrap();
        }
        index
    }

    fn settings(strategy: Strategy) -> UpdateSettings {
        UpdateSettings {
            enabled: true,
            image: Some("10.0.2.2:5000/slate/os".into()),
            strategy,
            windows: vec![Window {
                days: vec!["tue".into()],
                start: "02:00".into(),
                length: "2h".into(),
            }],
            lock_server: Some("http://10.0.2.2:8080".into()),
            ..UpdateSettings::default()
        }
    }

    /// Tuesday 03:00 UTC (inside the window) and Monday 12:00 (outside).
    const TUE_0300: u32 = 24 * 60 + 3 * 60;
    const MON_1200: u32 = 12 * 60;

    fn step<'a>(
        settings: &'a UpdateSettings,
        index: &'a ReleaseIndex,
        failures: &'a FailureCounter,
        minute: u32,
        downloaded: Option<&'a str>,
    ) -> Step<'a> {
        decide(&Inputs {
            settings,
            running: "1.0.0",
            index,
            failures,
            minute_of_week: minute,
            downloaded,
        })
    }

    #[test]
    fn the_minute_of_the_week_starts_on_monday_utc() {
        // 1970-01-01 00:00 was a Thursday.
        assert_eq!(minute_of_week(0), 3 * 24 * 60);
        // 2026-12-01 02:30 UTC is a Tuesday.
        assert_eq!(minute_of_week(1_796_092_200), 24 * 60 + 150);
    }

    #[test]
    fn a_beta_release_is_not_seen_on_stable_and_a_stable_one_is_downloaded_ahead_of_the_window() {
        let s = settings(Strategy::FleetLock);
        let failures = FailureCounter::default();
        let beta = index(vec![release("2.0.0", Channel::Beta)]);
        assert_eq!(
            step(&s, &beta, &failures, TUE_0300, None),
            Step::Hold("up to date".into())
        );
        let stable = index(vec![release("2.0.0", Channel::Stable)]);
        let Step::Download(r) = step(&s, &stable, &failures, MON_1200, None) else {
            panic!("expected a download outside the window");
        };
        assert_eq!(r.version, "2.0.0");
        match step(&s, &stable, &failures, MON_1200, Some("2.0.0")) {
            Step::WaitForWindow { opens, minutes, .. } => {
                assert_eq!(opens, "Tue 02:00");
                assert_eq!(minutes, 14 * 60);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            step(&s, &stable, &failures, TUE_0300, Some("2.0.0")),
            Step::Apply { lock: true, .. }
        ));
    }

    #[test]
    fn immediate_ignores_windows_and_takes_no_lock() {
        let s = settings(Strategy::Immediate);
        let failures = FailureCounter::default();
        let stable = index(vec![release("2.0.0", Channel::Stable)]);
        assert!(matches!(
            step(&s, &stable, &failures, MON_1200, Some("2.0.0")),
            Step::Apply { lock: false, .. }
        ));
    }

    #[test]
    fn a_window_that_wraps_the_week_is_open_on_monday_morning() {
        let mut s = settings(Strategy::Periodic);
        s.windows = vec![Window {
            days: vec!["sun".into()],
            start: "23:00".into(),
            length: "3h".into(),
        }];
        let failures = FailureCounter::default();
        let stable = index(vec![release("2.0.0", Channel::Stable)]);
        assert!(matches!(
            step(&s, &stable, &failures, 60, Some("2.0.0")),
            Step::Apply { lock: false, .. }
        ));
        assert!(matches!(
            step(&s, &stable, &failures, 2 * 60 + 30, Some("2.0.0")),
            Step::WaitForWindow { .. }
        ));
    }

    #[test]
    fn a_yanked_release_is_never_chosen_and_a_given_up_one_is_named() {
        let s = settings(Strategy::Immediate);
        let mut idx = index(vec![
            release("2.0.0", Channel::Stable),
            release("3.0.0", Channel::Stable),
        ]);
        idx.yank("3.0.0", "eats disks").unwrap();
        let mut failures = FailureCounter::default();
        let Step::Download(r) = step(&s, &idx, &failures, 0, None) else {
            panic!()
        };
        assert_eq!(r.version, "2.0.0");
        for _ in 0..3 {
            failures.record_revert("2.0.0");
        }
        assert_eq!(
            step(&s, &idx, &failures, 0, None),
            Step::Hold("2.0.0 reverted 3 times: skipped".into())
        );
        assert_eq!(
            newest_available(&idx, Channel::Stable).unwrap().version,
            "2.0.0"
        );
    }

    #[test]
    fn pin_and_max_version_limit_the_choice() {
        let mut s = settings(Strategy::Immediate);
        let idx = index(vec![
            release("2.0.0", Channel::Stable),
            release("3.0.0", Channel::Stable),
        ]);
        let failures = FailureCounter::default();
        s.max_version = Some("2.5".into());
        assert!(
            matches!(step(&s, &idx, &failures, 0, None), Step::Download(r) if r.version == "2.0.0")
        );
        s.max_version = None;
        s.pin = Some("1.0.0".into());
        assert_eq!(
            step(&s, &idx, &failures, 0, None),
            Step::Hold("pinned to 1.0.0".into())
        );
    }
}
