//! The update agent: a node that follows a release channel and updates itself, never more of
//! them at once than the fleet allows.
//!
//! It starts once a boot is committed. It first judges the upgrade it started before the
//! reboot (committed, or reverted: the give-up counter on STATE) and, with the fleet-lock
//! strategy, gives its FleetLock slot back — on every start, as zincati does, so a node that
//! comes back always frees its slot and one that does not keeps it (the line stops). Then,
//! every poll interval (plus up to a tenth of jitter), it reads the channel's release index
//! from the registry, picks the next release ([`decide`]), downloads and verifies its bundle
//! ahead of the window (by digest, resumable, through the transport's cache; the signature
//! against the image's keys, as for an upload), waits for the window, takes the lock, and
//! hands the bundle to the same Upgrade sequence the API runs. The settings are read afresh
//! each tick, so a new machine configuration applies live.

mod credentials;
mod decide;
mod lock_client;
mod operator_report;
mod record;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slate_api::{AgentStatus, EventKind};
use slate_machine_config::{MachineConfig, Strategy, UpdateSettings};
use slate_release::{Release, ReleaseIndex, GIVE_UP_AFTER};
use slate_sequencer::{SequenceKind, REBOOT_REQUESTED};
use slate_transport::{Options, Reference};

use crate::base::node::{Node, Request, UpgradePlan};
use decide::{decide, minute_of_week, newest_available, Inputs, Step};
use lock_client::{LockClient, LockError};
use record::{AgentRecord, Attempt, Outcome};

/// How often a node with the operator strategy reports itself at least: the operator takes a
/// node silent for a minute (its default `--stale-after`) as down.
const OPERATOR_HEARTBEAT: Duration = Duration::from_secs(20);

/// How soon a refused lock or an unreachable lock server is asked again (at most).
const LOCK_RETRY: Duration = Duration::from_secs(30);

/// Start the agent on its own thread (after the boot's commit).
pub fn start(node: Arc<Node>) {
    let spawned = std::thread::Builder::new()
        .name("update-agent".into())
        .spawn(move || Agent::new(&node).run());
    if let Err(err) = spawned {
        eprintln!("machined: cannot start the update agent: {err}");
    }
}

struct Agent<'a> {
    node: &'a Node,
    record: AgentRecord,
    /// The release whose bundle is downloaded and verified, and its plan.
    downloaded: Option<UpgradePlan>,
    /// The FleetLock slot was given back in this boot.
    lock_released: bool,
    /// The node's client certificate toward the operator and a FleetLock server.
    credentials: credentials::Credentials,
}

impl<'a> Agent<'a> {
    fn new(node: &'a Node) -> Self {
        let state = crate::base::paths::state_dir();
        let (mut record, warning) = record::load(&state);
        if let Some(warning) = warning {
            node.journal.info(format_args!("update agent: {warning}"));
        }
        match record.settle(&node.version) {
            Outcome::Nothing => {}
            Outcome::Committed { version } => node.journal.info(format_args!(
                "update agent: the upgrade to {version} is committed"
            )),
            Outcome::Reverted {
                version,
                reverts,
                gave_up,
            } => node.journal.info(format_args!(
                "update agent: the upgrade to {version} was reverted ({reverts} of \
                 {GIVE_UP_AFTER}){}",
                if gave_up {
                    "; it will not be tried again"
                } else {
                    ""
                }
            )),
        }
        if let Err(err) = record::store(&state, &record) {
            node.journal
                .error(format_args!("update agent: cannot keep its record: {err}"));
        }
        Agent {
            node,
            record,
            downloaded: None,
            lock_released: false,
            credentials: Default::default(),
        }
    }

    fn run(mut self) {
        loop {
            let wait = self.tick();
            std::thread::sleep(wait);
        }
    }

    /// One decision and its action; answers how long to wait before the next.
    fn tick(&mut self) -> Duration {
        let Some(config) = self.node.machine.current() else {
            self.report_disabled(&UpdateSettings::default(), "no machine configuration");
            return Duration::from_secs(60);
        };
        let settings = &config.update;
        let poll = jittered(settings.poll_interval());
        if !settings.enabled {
            self.report_disabled(
                settings,
                "updates are disabled in the machine configuration",
            );
            return poll;
        }
        if settings.strategy == Strategy::Operator {
            let reason = match operator_report::report(&mut self.credentials, self.node, &config) {
                Ok(replica) => format!("the rollout operator decides (reported to {replica})"),
                Err(err) => format!("cannot report to the rollout operator: {err}"),
            };
            self.report(settings, "idle", None, None, Some(&reason));
            return poll.min(OPERATOR_HEARTBEAT);
        }
        let lock = match settings.strategy {
            Strategy::FleetLock => match self.lock_client(settings, &config) {
                Ok(lock) => Some(lock),
                Err(err) => {
                    let reason = format!("cannot set up the FleetLock client: {err}");
                    self.report(settings, "locking", None, None, Some(&reason));
                    return poll.min(LOCK_RETRY);
                }
            },
            _ => None,
        };
        if let (Some(lock), false) = (&lock, self.lock_released) {
            match lock.unlock() {
                Ok(()) => {
                    self.lock_released = true;
                    self.node.journal.info(format_args!(
                        "update agent: FleetLock slot released (steady state)"
                    ));
                }
                Err(err) => {
                    let reason = format!("cannot release the FleetLock slot: {err}");
                    self.report(settings, "locking", None, None, Some(&reason));
                    return poll.min(LOCK_RETRY);
                }
            }
        }
        let Some(image) = settings.image.as_deref() else {
            self.report(
                settings,
                "idle",
                None,
                None,
                Some("no update.image configured"),
            );
            return poll;
        };
        self.report(settings, "checking", None, None, None);
        let options = Options {
            insecure: settings.insecure,
            ..Options::default()
        };
        let index = match fetch_index(image, &options) {
            Ok(Some(index)) => index,
            Ok(None) => {
                let reason = format!("{image} has no releases yet");
                self.report(settings, "idle", None, None, Some(&reason));
                return poll;
            }
            Err(err) => {
                let reason = format!("reading the releases of {image}: {err}");
                self.report(settings, "idle", None, None, Some(&reason));
                return poll;
            }
        };
        self.act(settings, image, &options, &index, lock.as_ref(), poll)
    }

    fn act(
        &mut self,
        settings: &UpdateSettings,
        image: &str,
        options: &Options,
        index: &ReleaseIndex,
        lock: Option<&LockClient>,
        poll: Duration,
    ) -> Duration {
        let channel = slate_release::Channel::parse(&settings.channel).ok();
        let newest = channel
            .and_then(|c| newest_available(index, c))
            .map(|r| r.version.clone());
        let newest = newest.as_deref();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let step = decide(&Inputs {
            settings,
            running: &self.node.version,
            index,
            failures: &self.record.failures,
            minute_of_week: minute_of_week(now),
            downloaded: self.downloaded.as_ref().map(|p| p.version.as_str()),
        });
        match step {
            Step::Hold(reason) => {
                self.report(settings, "idle", newest, None, Some(&reason));
                poll
            }
            Step::Download(release) => {
                self.report(settings, "downloading", newest, Some(release), None);
                match self.download(image, options, release) {
                    Ok(plan) => {
                        self.downloaded = Some(plan);
                        Duration::ZERO
                    }
                    Err(err) => {
                        let reason = format!("downloading {}: {err}", release.version);
                        self.node
                            .journal
                            .info(format_args!("update agent: {reason}"));
                        self.report(settings, "idle", newest, Some(release), Some(&reason));
                        poll
                    }
                }
            }
            Step::WaitForWindow {
                release,
                opens,
                minutes,
            } => {
                let reason = format!("window opens {opens}");
                self.report(settings, "waiting", newest, Some(release), Some(&reason));
                let opens_at = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
                    + u64::from(minutes) * 60;
                self.node.journal.counters.next_window(Some(opens_at));
                poll.min(Duration::from_secs(u64::from(minutes) * 60))
            }
            Step::Apply { release, .. } => {
                if let Some(lock) = lock {
                    self.report(settings, "locking", newest, Some(release), None);
                    if let Err(err) = lock.lock() {
                        let reason = match err {
                            LockError::Refused { value, .. } => {
                                format!("waiting for a FleetLock slot: {value}")
                            }
                            other => other.to_string(),
                        };
                        self.report(settings, "waiting", newest, Some(release), Some(&reason));
                        return poll.min(LOCK_RETRY);
                    }
                    self.node.journal.info(format_args!(
                        "update agent: FleetLock slot taken for {}",
                        release.version
                    ));
                }
                self.report(settings, "upgrading", newest, Some(release), None);
                let version = release.version.clone();
                let err = self.apply(settings);
                // Only a failure comes back: a successful upgrade reboots the node.
                self.record.attempt = None;
                let outcome = self.record.failed(&version);
                let _ = record::store(&crate::base::paths::state_dir(), &self.record);
                self.node.journal.error(format_args!(
                    "update agent: the upgrade to {version} failed ({outcome:?}): {err}"
                ));
                if let Some(lock) = lock {
                    if let Err(unlock) = lock.unlock() {
                        self.node.journal.info(format_args!(
                            "update agent: cannot give the FleetLock slot back: {unlock}"
                        ));
                    }
                }
                self.downloaded = None;
                let reason = format!("the upgrade to {version} failed: {err}");
                self.report(settings, "idle", newest, None, Some(&reason));
                poll
            }
        }
    }

    /// Pull `release` by digest into its bundle directory (resuming an interrupted pull) and
    /// check it as an upload is checked.
    fn download(
        &self,
        image: &str,
        options: &Options,
        release: &Release,
    ) -> Result<UpgradePlan, String> {
        let pinned = crate::boot::upgrade::pull::pinned(&format!(
            "{image}:{}@{}",
            release.version, release.digest
        ))?;
        self.node.journal.info(format_args!(
            "update agent: downloading {} ({})",
            release.version, release.digest
        ));
        let (plan, moved) = crate::boot::upgrade::pull::pull(self.node, &pinned, options)?;
        self.node.journal.info(format_args!(
            "update agent: {} downloaded and verified ({moved})",
            release.version
        ));
        Ok(plan)
    }

    /// Hand the downloaded bundle to the Upgrade sequence; answers only when it failed.
    fn apply(&mut self, settings: &UpdateSettings) -> String {
        let Some(plan) = self.downloaded.clone() else {
            return "no downloaded bundle".into();
        };
        let events = self.node.subscribe();
        let guard = match self.node.lock.try_lock(SequenceKind::Upgrade) {
            Ok(guard) => guard,
            Err(err) => return format!("the node is busy: {err}"),
        };
        self.record.attempt = Some(Attempt {
            from: self.node.version.clone(),
            to: plan.version.clone(),
        });
        if let Err(err) = record::store(&crate::base::paths::state_dir(), &self.record) {
            return format!("cannot record the attempt: {err}");
        }
        self.node.journal.info(format_args!(
            "update agent: upgrading {} -> {} (channel {}, strategy {})",
            self.node.version,
            plan.version,
            settings.channel,
            strategy_name(settings)
        ));
        if let Err(err) = self.node.request(Request::Upgrade(plan, guard)) {
            return err;
        }
        let upgrade = SequenceKind::Upgrade.to_string();
        while let Ok(event) = events.recv() {
            let EventKind::SequenceFinished { sequence, error } = event.kind else {
                continue;
            };
            match error {
                // The sequence unwinds to the reboot handler: the new version is written and
                // the node restarts into it; the next boot judges the attempt. Keep the record
                // and the slot until then.
                Some(error) if sequence == upgrade && error.starts_with(REBOOT_REQUESTED) => loop {
                    std::thread::park();
                },
                Some(error) if sequence == upgrade => return error,
                _ => {}
            }
        }
        "the node's event stream ended".into()
    }

    fn report_disabled(&self, settings: &UpdateSettings, reason: &str) {
        let mut status = self.status(settings, "idle", None, None, Some(reason));
        status.strategy = "disabled".into();
        self.publish(status);
    }

    /// The FleetLock client: over `https://`, with the node's own client certificate and the
    /// fleet CA as the only roots (a lock server with `--client-ca` then knows which node asks
    /// and lets it act only for itself).
    fn lock_client(
        &mut self,
        settings: &UpdateSettings,
        config: &MachineConfig,
    ) -> Result<LockClient, String> {
        let server = settings.lock_server.as_deref().unwrap_or_default();
        let tls = if server.starts_with("https://") {
            let identity = self.credentials.current(config)?;
            Some(lock_client::LockTls {
                roots_pem: identity.fleet_ca.clone(),
                chain_pem: identity.cert.clone(),
                key_pem: identity.key.clone(),
            })
        } else {
            None
        };
        LockClient::new(
            server,
            settings.lock_group.as_deref().unwrap_or("default"),
            &config.node.name,
            tls.as_ref(),
        )
    }

    fn report(
        &self,
        settings: &UpdateSettings,
        state: &str,
        newest: Option<&str>,
        target: Option<&Release>,
        reason: Option<&str>,
    ) {
        self.publish(self.status(settings, state, newest, target, reason));
    }

    fn publish(&self, status: AgentStatus) {
        // Only a wait for the window has a next window to show (set after this report).
        self.node.journal.counters.next_window(None);
        *self.node.agent.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    fn status(
        &self,
        settings: &UpdateSettings,
        state: &str,
        newest: Option<&str>,
        target: Option<&Release>,
        reason: Option<&str>,
    ) -> AgentStatus {
        AgentStatus {
            strategy: strategy_name(settings).into(),
            channel: settings.channel.clone(),
            image: settings.image.clone(),
            newest_available: newest.map(str::to_owned),
            target: target.map(|r| r.version.clone()),
            state: state.into(),
            reason: reason.map(str::to_owned),
            skipped: self.record.failures.skipped(),
        }
    }
}

fn strategy_name(settings: &UpdateSettings) -> &'static str {
    match settings.strategy {
        Strategy::Immediate => "immediate",
        Strategy::Periodic => "periodic",
        Strategy::FleetLock => "fleet-lock",
        Strategy::Operator => "operator",
    }
}

fn fetch_index(image: &str, options: &Options) -> Result<Option<ReleaseIndex>, String> {
    let repository = Reference::parse(image).map_err(|e| e.to_string())?;
    slate_transport::fetch_release_index(&repository, options)
        .map_err(|e| slate_sequencer::error_chain(&e))
}

/// `interval` plus up to a tenth more, so a fleet configured alike does not poll in step.
fn jittered(interval: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    let fraction = (hasher.finish() % 1000) as f64 / 10_000.0;
    interval + interval.mul_f64(fraction)
}
