//! `--wait` on `upgrade`, `rollback` and `reboot`: follow the node across its reboots by polling
//! its status — never a stream, which a reboot cuts — until the outcome: the target version
//! committed, or the node back on another version (and why), or a timeout.
//!
//! [`Follower`] is the pure part: each observation (a status, or none when the node did not
//! answer) in, progress events and at most one [`Outcome`] out. A new boot is a new kernel
//! boot ID (`Status::boot_id`); a boot is over when the node says it is `committed`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde::Serialize;
use slate_api::{Failure, Stage, Status};

use crate::args::{NodeTarget, OutputFormat};

/// How often the node is asked while it is followed.
const POLL_EVERY: Duration = Duration::from_secs(2);
/// Each poll's own limit: a node on its way down must not hold the follower for long.
const POLL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Follow the node across its reboots until the outcome: exit 0 once the target version
    /// is committed, non-zero when the node went back to another version (naming why), when
    /// the operation failed, or at --timeout. With --output json, one progress event per line.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait follows the node, in seconds.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

/// One step the follower saw (`--output json`: `{"event":"booted","version":…,"elapsed_s":…}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Progress {
    /// The bundle reached the node.
    Uploaded { version: String, bytes: u64 },
    /// The node checked its digests and signature and kept it.
    Verified { version: String, id: String },
    /// The node accepted the operation (upgrade, rollback, reboot).
    Accepted { operation: String },
    /// The node is writing the new version.
    Installing,
    /// The node went down (or said it is rebooting).
    Rebooting,
    /// A new boot answered.
    Booted {
        version: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        boot_id: Option<String>,
    },
    /// The end: the version the node settled on is committed.
    Committed { version: String },
    /// The end: the node went back to `to` instead of staying on `target`.
    Reverted {
        target: String,
        to: String,
        reason: String,
    },
    /// The end: the operation failed before any reboot, the node runs what it ran.
    Failed { reason: String },
    /// The end: no outcome within the timeout.
    TimedOut { waited_s: u64, last_seen: String },
}

/// How the follow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Committed {
        version: String,
    },
    Reverted {
        target: String,
        to: String,
        reason: String,
    },
    Failed {
        reason: String,
    },
}

/// The pure state machine behind `--wait`.
#[derive(Debug)]
pub struct Follower {
    /// The version that must end up committed (`None`: any, after a reboot).
    target: Option<String>,
    before_boot: Option<String>,
    before_failure: Option<Failure>,
    /// The boot last announced as booted.
    seen_boot: Option<String>,
    went_down: bool,
    /// The node went away since the last boot was announced.
    down_since_booted: bool,
    said_rebooting: bool,
    said_installing: bool,
    /// Polls in a row that found the same boot idle again (the operation ended without a
    /// reboot).
    idle_again: u32,
}

impl Follower {
    /// `before`: the status read before the operation was asked for.
    pub fn new(before: &Status, target: Option<String>) -> Self {
        Follower {
            target,
            before_boot: before.boot_id.clone(),
            before_failure: before.last_failure.clone(),
            seen_boot: before.boot_id.clone(),
            went_down: false,
            down_since_booted: false,
            said_rebooting: false,
            said_installing: false,
            idle_again: 0,
        }
    }

    /// One poll: the node's status, or `None` when it did not answer.
    pub fn observe(&mut self, seen: Option<&Status>) -> (Vec<Progress>, Option<Outcome>) {
        let mut events = Vec::new();
        let Some(status) = seen else {
            self.went_down = true;
            self.down_since_booted = true;
            self.rebooting(&mut events);
            return (events, None);
        };
        let new_boot = match (&self.before_boot, &status.boot_id) {
            (Some(before), Some(now)) => before != now,
            // A node that does not say its boot ID: a boot is new once the node went away.
            _ => self.went_down,
        };
        if !new_boot {
            let outcome = self.same_boot(status, &mut events);
            return (events, outcome);
        }
        // Without boot IDs, a boot is announced once per time the node went away.
        let unannounced = match &status.boot_id {
            Some(_) => self.seen_boot != status.boot_id,
            None => self.down_since_booted,
        };
        if unannounced {
            self.rebooting(&mut events);
            events.push(Progress::Booted {
                version: status.version.clone(),
                boot_id: status.boot_id.clone(),
            });
            self.seen_boot = status.boot_id.clone();
            self.down_since_booted = false;
        }
        if !status.committed {
            return (events, None);
        }
        let outcome = match &self.target {
            Some(target) if *target != status.version => Outcome::Reverted {
                target: target.clone(),
                to: status.version.clone(),
                reason: why_not(status, target),
            },
            _ => Outcome::Committed {
                version: status.version.clone(),
            },
        };
        (events, Some(outcome))
    }

    fn rebooting(&mut self, events: &mut Vec<Progress>) {
        if !self.said_rebooting {
            self.said_rebooting = true;
            events.push(Progress::Rebooting);
        }
    }

    /// Still the boot the operation was asked of: installing, rebooting, or back to idle —
    /// which, once seen twice (or with a new failure recorded), means it failed.
    fn same_boot(&mut self, status: &Status, events: &mut Vec<Progress>) -> Option<Outcome> {
        match status.stage {
            Stage::Upgrading if !self.said_installing => {
                self.said_installing = true;
                events.push(Progress::Installing);
            }
            Stage::Rebooting | Stage::ShuttingDown => self.rebooting(events),
            _ => {}
        }
        let idle = status.stage == Stage::Running && status.running_sequence.is_none();
        let new_failure =
            status.last_failure.is_some() && status.last_failure != self.before_failure;
        if !idle {
            self.idle_again = 0;
            return None;
        }
        self.idle_again += 1;
        if !new_failure && self.idle_again < 2 {
            return None;
        }
        let reason = match (&status.last_failure, new_failure) {
            (Some(failure), true) => failure.reason.clone(),
            _ => format!(
                "the node is idle again on {} without a reboot (see `slate logs`)",
                status.version
            ),
        };
        Some(Outcome::Failed { reason })
    }
}

/// Why the node is not on `target`: its rollback record when that names `target`, else its
/// failure record when that does.
fn why_not(status: &Status, target: &str) -> String {
    if let Some(rollback) = status.last_rollback.as_ref().filter(|r| r.from == target) {
        return format!("{target}: {}", rollback.reason);
    }
    if let Some(failure) = status.last_failure.as_ref().filter(|f| f.version == target) {
        return format!("{target}: {}", failure.reason);
    }
    format!(
        "{target} did not stay: the node came back on {}",
        status.version
    )
}

/// Prints progress as text lines or JSON lines (with the seconds since the start).
pub struct Reporter {
    output: OutputFormat,
    start: Instant,
}

#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    progress: &'a Progress,
    elapsed_s: u64,
}

impl Reporter {
    pub fn new(output: OutputFormat) -> Self {
        Reporter {
            output,
            start: Instant::now(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn report(&self, progress: &Progress) {
        let elapsed_s = self.start.elapsed().as_secs();
        match self.output {
            OutputFormat::Json => {
                if let Ok(line) = serde_json::to_string(&Line {
                    progress,
                    elapsed_s,
                }) {
                    println!("{line}");
                }
            }
            OutputFormat::Text => println!("{}", text(progress, elapsed_s)),
        }
    }
}

fn text(progress: &Progress, elapsed_s: u64) -> String {
    match progress {
        Progress::Uploaded { version, bytes } => format!("uploaded {version} ({bytes} bytes)"),
        Progress::Verified { version, id } => {
            format!("verified by the node: {version} ({id})")
        }
        Progress::Accepted { operation } => format!("{operation} accepted"),
        Progress::Installing => "installing".into(),
        Progress::Rebooting => "rebooting".into(),
        Progress::Booted { version, boot_id } => match boot_id {
            Some(id) => format!("booted {version} (boot {})", &id[..id.len().min(8)]),
            None => format!("booted {version}"),
        },
        Progress::Committed { version } => format!("committed {version} in {elapsed_s} s"),
        Progress::Reverted { to, reason, .. } => format!("rolled back to {to}: {reason}"),
        Progress::Failed { reason } => format!("failed: {reason}"),
        Progress::TimedOut {
            waited_s,
            last_seen,
        } => format!("no outcome after {waited_s} s; last seen: {last_seen}"),
    }
}

/// The status before an operation, for [`follow`] (a node that cannot be asked is an error:
/// there would be nothing to compare with).
pub fn status_before(target: &NodeTarget) -> Result<Status> {
    target
        .client()?
        .with_timeout(POLL_TIMEOUT)
        .status()
        .context("asking the node for its status before the operation")
}

/// Polls the node until the outcome; `Ok` only when `target` (or, for a reboot, whatever came
/// up) is committed.
pub fn follow(
    node: &NodeTarget,
    before: &Status,
    target: Option<String>,
    args: &WaitArgs,
    reporter: &Reporter,
) -> Result<()> {
    let client = node.client()?.with_timeout(POLL_TIMEOUT);
    let mut follower = Follower::new(before, target);
    let timeout = Duration::from_secs(args.timeout);
    loop {
        let seen = client.status();
        let last_seen = match &seen {
            Ok(s) => format!("{} {:?}", s.version, s.stage),
            Err(e) => format!("no answer ({e})"),
        };
        let (events, outcome) = follower.observe(seen.as_ref().ok());
        for event in &events {
            reporter.report(event);
        }
        if let Some(outcome) = outcome {
            return finish(outcome, reporter);
        }
        if reporter.elapsed() >= timeout {
            let waited_s = reporter.elapsed().as_secs();
            reporter.report(&Progress::TimedOut {
                waited_s,
                last_seen: last_seen.clone(),
            });
            bail!(
                "no outcome after {waited_s} s (--timeout {}): last seen {last_seen}",
                args.timeout
            );
        }
        std::thread::sleep(POLL_EVERY);
    }
}

fn finish(outcome: Outcome, reporter: &Reporter) -> Result<()> {
    match outcome {
        Outcome::Committed { version } => {
            reporter.report(&Progress::Committed { version });
            Ok(())
        }
        Outcome::Reverted { target, to, reason } => {
            let message = format!("rolled back to {to}: {reason}");
            reporter.report(&Progress::Reverted { target, to, reason });
            bail!(message)
        }
        Outcome::Failed { reason } => {
            reporter.report(&Progress::Failed {
                reason: reason.clone(),
            });
            bail!("failed: {reason}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_api::{Mode, RollbackRecord};

    fn status(version: &str, boot: &str, stage: Stage, committed: bool) -> Status {
        Status {
            version: version.into(),
            boot_id: Some(boot.into()),
            committed,
            last_rollback: None,
            pinned: Vec::new(),
            secure_boot: None,
            var: None,
            boot_times: None,
            memory: None,
            warnings: Vec::new(),
            booted_entry: None,
            stage,
            running_sequence: None,
            mode: Mode::Metal,
            staged_image: None,
            last_failure: None,
            node_name: None,
            hostname: None,
            machine_id: None,
            agent: None,
        }
    }

    fn busy(mut s: Status, sequence: &str) -> Status {
        s.running_sequence = Some(sequence.into());
        s
    }

    /// Feeds observations, collecting every event and the outcome.
    fn run(target: Option<&str>, seen: &[Option<Status>]) -> (Vec<Progress>, Option<Outcome>) {
        let before = status("1.0.0", "boot-1", Stage::Running, true);
        let mut follower = Follower::new(&before, target.map(str::to_owned));
        let mut all = Vec::new();
        for s in seen {
            let (events, outcome) = follower.observe(s.as_ref());
            all.extend(events);
            if outcome.is_some() {
                return (all, outcome);
            }
        }
        (all, None)
    }

    #[test]
    fn an_upgrade_is_followed_through_its_reboot_to_the_commit() {
        let (events, outcome) = run(
            Some("2.0.0"),
            &[
                Some(busy(
                    status("1.0.0", "boot-1", Stage::Upgrading, true),
                    "Upgrade",
                )),
                Some(busy(
                    status("1.0.0", "boot-1", Stage::Rebooting, true),
                    "Upgrade",
                )),
                None,
                None,
                Some(status("2.0.0", "boot-2", Stage::Running, false)),
                Some(status("2.0.0", "boot-2", Stage::Running, true)),
            ],
        );
        assert_eq!(
            events,
            [
                Progress::Installing,
                Progress::Rebooting,
                Progress::Booted {
                    version: "2.0.0".into(),
                    boot_id: Some("boot-2".into())
                }
            ]
        );
        assert_eq!(
            outcome,
            Some(Outcome::Committed {
                version: "2.0.0".into()
            })
        );
    }

    #[test]
    fn a_revert_ends_on_the_old_version_with_the_rollback_record_as_the_reason() {
        let mut back = status("1.0.0", "boot-3", Stage::Running, true);
        back.last_rollback = Some(RollbackRecord {
            from: "3.0.0".into(),
            to: "1.0.0".into(),
            reason: "health check `tcp 127.0.0.1:8080` failed".into(),
            time: 1,
        });
        let (events, outcome) = run(
            Some("3.0.0"),
            &[
                None,
                Some(status("3.0.0", "boot-2", Stage::Running, false)),
                Some(status("3.0.0", "boot-2", Stage::Failed, false)),
                None,
                Some(back),
            ],
        );
        let booted: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                Progress::Booted { version, .. } => Some(version.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(booted, ["3.0.0", "1.0.0"]);
        assert_eq!(events.first(), Some(&Progress::Rebooting));
        assert_eq!(
            outcome,
            Some(Outcome::Reverted {
                target: "3.0.0".into(),
                to: "1.0.0".into(),
                reason: "3.0.0: health check `tcp 127.0.0.1:8080` failed".into()
            })
        );
    }

    #[test]
    fn an_upgrade_that_fails_before_its_reboot_ends_with_the_recorded_failure() {
        let mut failed = status("1.0.0", "boot-1", Stage::Running, true);
        failed.last_failure = Some(Failure {
            version: "1.0.0".into(),
            reason: "upgrade failed: the UKI does not fit".into(),
        });
        let (events, outcome) = run(
            Some("2.0.0"),
            &[
                Some(busy(
                    status("1.0.0", "boot-1", Stage::Upgrading, true),
                    "Upgrade",
                )),
                Some(failed),
            ],
        );
        assert_eq!(events, [Progress::Installing]);
        assert_eq!(
            outcome,
            Some(Outcome::Failed {
                reason: "upgrade failed: the UKI does not fit".into()
            })
        );
        // Idle twice in a row with no new failure recorded: also over.
        let idle = status("1.0.0", "boot-1", Stage::Running, true);
        let (_, outcome) = run(Some("2.0.0"), &[Some(idle.clone()), Some(idle)]);
        assert!(
            matches!(outcome, Some(Outcome::Failed { .. })),
            "{outcome:?}"
        );
    }

    #[test]
    fn a_reboot_ends_with_whatever_version_came_up_committed() {
        let (events, outcome) = run(
            None,
            &[
                Some(busy(
                    status("1.0.0", "boot-1", Stage::Rebooting, true),
                    "Reboot",
                )),
                None,
                Some(status("1.0.0", "boot-2", Stage::Booting, false)),
                Some(status("1.0.0", "boot-2", Stage::Running, true)),
            ],
        );
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(
            outcome,
            Some(Outcome::Committed {
                version: "1.0.0".into()
            })
        );
    }

    #[test]
    fn nodes_without_a_boot_id_count_a_boot_once_they_went_away() {
        let mut old = status("1.0.0", "x", Stage::Running, true);
        old.boot_id = None;
        let mut follower = Follower::new(&old, Some("2.0.0".into()));
        let mut up = status("2.0.0", "x", Stage::Running, true);
        up.boot_id = None;
        assert_eq!(follower.observe(None).0, [Progress::Rebooting]);
        let (events, outcome) = follower.observe(Some(&up));
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            outcome,
            Some(Outcome::Committed {
                version: "2.0.0".into()
            })
        );
    }

    #[test]
    fn json_lines_carry_the_event_name_and_the_elapsed_seconds() {
        let line = serde_json::to_string(&Line {
            progress: &Progress::Committed {
                version: "2.0.0".into(),
            },
            elapsed_s: 41,
        })
        .unwrap();
        assert_eq!(
            line,
            r#"{"event":"committed","version":"2.0.0","elapsed_s":41}"#
        );
        assert_eq!(
            text(
                &Progress::Committed {
                    version: "2.0.0".into()
                },
                41
            ),
            "committed 2.0.0 in 41 s"
        );
    }
}
