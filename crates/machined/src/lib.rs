//! machined: the real PID 1 of a slate node.
//!
//! It reaps orphans, runs Initialize → Install → Boot under the priority lock, then serves the
//! node API and runs what the API asks for (reboot, reset) as sequences of their own. A sequence
//! that asks for a reboot unwinds as a typed error to [`handler::reboot`]; any other fatal error
//! goes to [`handler::fatal`]; Locked and Cancelled are swallowed and the node keeps running.
//! SIGTERM, SIGPWR, ctrl-alt-del and the ACPI power button ask for a shutdown or a reboot the
//! same way the API does ([`power_events`]).

// Layers, each importing only those below it (ARCHITECTURE.md, "machined"): `base`, then
// `settle`, then `boot`; the top is this file and the modules that serve the running node.
mod base;
mod boot;
mod settle;

mod agent;
mod backend;
mod handler;
mod power_events;

/// The seed a pull derives from a new slate binary, for `xtask bench-delta` to count what a
/// node fetches with the node's own code.
pub use boot::upgrade::pull::derived::root_copy;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Result};
use slate_api::{EventKind, ServerConfig, Stage};
use slate_host::KmsgLogger;
use slate_metrics::node_counters as kept;
use slate_sequencer::{
    run_boot, BootOutcome, Disposition, RebootMode, Sequence, SequenceError, TaskError,
};

use backend::Backend;
use base::journal::Journal;
use base::node::{Host, Node, Request};
use boot::facts::Facts;
use boot::{health, machine, sequences, upgrade, watchdog};
use settle::decision::{HealthOutcome, Phase};
use settle::{transaction, SettleError};

pub fn run() -> Result<()> {
    if !slate_host::is_pid1() {
        bail!(
            "machined runs as PID 1 of a slate node, or as a systemd service with \
             --under-systemd on a systemd image"
        );
    }
    start(Host::Pid1)
}

/// machined as an ordinary service of systemd on a systemd image (`slate-machined.service`):
/// the node API, the update agent, health checks and the commit; init and systemd have set up
/// the volumes, /etc, the network and the services, and systemd takes the machine down.
pub fn run_under_systemd() -> Result<()> {
    if slate_host::is_pid1() {
        bail!("--under-systemd: machined is PID 1 here; run it as slate-machined.service");
    }
    if !Path::new("/run/systemd/system").is_dir() {
        bail!("--under-systemd: systemd is not running here (no /run/systemd/system)");
    }
    start(Host::Systemd)
}

/// `slate health-check N` (`slate-check@N.service` on a systemd image).
pub fn health_check_unit(index: usize) -> Result<()> {
    boot::under_systemd::health_check_unit(index)
}

fn start(host: Host) -> Result<()> {
    // Before any thread starts: a thread that does not block them would drop them. Under
    // systemd, SIGTERM stops the service the default way (its stop job), not the machine.
    let signals = (host == Host::Pid1).then(power_events::block_signals);
    let journal = Arc::new(Journal::new(match host {
        Host::Pid1 => {
            let _ = slate_host::disable_kmsg_ratelimit();
            KmsgLogger::open("machined")
        }
        // stdout is the journal (and the console, as the unit says).
        Host::Systemd => KmsgLogger::stderr("machined"),
    }));
    journal.boot.milestone("machined started");
    journal.info(format_args!("starting slate {}", env!("CARGO_PKG_VERSION")));
    if host == Host::Pid1 {
        slate_host::spawn_reaper(Duration::from_secs(1));
    }
    let cmdline = slate_host::kernel_cmdline().unwrap_or_default();
    let (node, requests) = Node::new(journal, &cmdline);
    let _ = slate_host::mount_efivarfs();
    let node = node.with_boot_facts(
        host,
        transaction::booted_entry_at_start(
            &cmdline,
            slate_host::read_loader_string("LoaderEntrySelected"),
        ),
        base::snapshot_root::detect(),
    );

    let panic_journal = node.journal.clone();
    std::panic::set_hook(Box::new(move |info| {
        panic_journal.error(format_args!("panic: {info}"));
    }));
    if let Some(signals) = signals {
        power_events::start(&node, signals);
    }
    // The image's health checks and watchdog. The watchdog is armed now and fed only once the
    // boot is committed, so a boot that hangs before its commit is reset by the hardware.
    let config = match health::load_config(Path::new(health::NODE_CONFIG)) {
        Ok(config) => config,
        Err(err) => handler::fatal(&node, AsRef::<dyn std::error::Error>::as_ref(&err)),
    };
    let watchdog = watchdog::arm(&node, &config);
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        boot_and_serve(&node, requests, &config, watchdog.as_ref())
    }));
    let error: Box<dyn std::error::Error> = match result {
        Ok(err) => Box::new(err),
        Err(_) => "machined panicked".into(),
    };
    handler::fatal(&node, error.as_ref())
}

/// Runs until a fatal error (returned) or a reboot (does not return).
fn boot_and_serve(
    node: &Arc<Node>,
    requests: Receiver<Request>,
    config: &slate_profile::NodeConfig,
    watchdog: Option<&Arc<slate_host::Watchdog>>,
) -> SequenceError {
    let facts = Facts {
        watchdog: watchdog.cloned(),
        image_services: config.services.clone(),
        image_var: config.var.clone().unwrap_or_default().mode,
        ..Facts::default()
    };
    let api = Mutex::new(None);
    // Feeds the watchdog from the commit on, for as long as this main loop runs.
    let mut _feeder = None;
    let outcome = run_boot(
        &node.lock,
        node.journal.as_ref(),
        sequences::initialize(node, &facts),
        || sequences::install(node, &facts),
        || {
            sequences::boot(node, &facts, |_ctx| {
                let handle = start_api(node)?;
                let addr = handle.local_addr();
                *api.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
                Ok(addr)
            })
        },
    );
    match outcome {
        Ok(BootOutcome::Booted) => {
            node.set_stage(Stage::Running);
            // Under systemd the image's checks are units that boot-complete.target requires.
            let assessed = match node.host {
                Host::Pid1 => health::check(node, config).map_err(|f| f.to_string()),
                Host::Systemd => boot::under_systemd::boot_complete(node),
            };
            let health = match assessed {
                Ok(()) => HealthOutcome::Passed,
                Err(failure) => HealthOutcome::Failed(failure),
            };
            if let Err(err) = transaction::settle(node, Phase::Running { health }) {
                return not_committed(err);
            }
            node.journal.count(&[(kept::BOOTS, "committed")]);
            node.set_committed();
            _feeder = watchdog.map(|dog| watchdog::feed(node, dog));
            settle::boot_options::ensure(node);
            agent::start(node.clone());
        }
        Ok(other) => node
            .journal
            .info(format_args!("boot ended early: {other:?}; serving")),
        Err(err) => {
            let refused = facts
                .var_refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            match refused {
                // Not the fatal path: a reboot would find the same volume and TPM, and a
                // revert would blame a version for a machine's TPM.
                Some(why) => {
                    if let Some(fatal) = locked(node, &facts, &api, &why) {
                        return fatal;
                    }
                    _feeder = watchdog.map(|dog| watchdog::feed(node, dog));
                }
                None => {
                    if let Some(fatal) = dispose(node, err) {
                        return fatal;
                    }
                }
            }
        }
    }
    while let Ok(request) = requests.recv() {
        let (sequence, guard) = match request {
            Request::Reboot(RebootMode::PowerOff, guard) => (sequences::shutdown(node), guard),
            Request::Reboot(mode, guard) => (sequences::reboot(node, mode), guard),
            Request::Reset(guard) => (sequences::reset(node), guard),
            Request::Upgrade(plan, guard) => {
                let version = plan.version.clone();
                let sequence = if plan.stage {
                    upgrade::stage_sequence(node, plan)
                } else {
                    upgrade::sequence(node, plan)
                };
                run_upgrade(node, sequence, &guard);
                drop(guard);
                node.journal.info(format_args!(
                    "the upgrade to {version} did not happen; still running {}",
                    node.version
                ));
                continue;
            }
        };
        if let Some(fatal) = run_held(node, sequence, &guard) {
            return fatal;
        }
    }
    SequenceError::Fatal {
        sequence: slate_sequencer::SequenceKind::Boot,
        phase: "serve".into(),
        task: "requests".into(),
        source: "the API's request channel closed".into(),
    }
}

/// /var was refused: say so (console, journal, `slate status`'s last failure), then bring up
/// the network and the API and wait for the operator (the request loop serves reboot and
/// reset). Returns a fatal error only when that fails too.
fn locked(
    node: &Arc<Node>,
    facts: &Facts,
    api: &Mutex<Option<slate_api::ServerHandle>>,
    why: &str,
) -> Option<SequenceError> {
    let reason = format!("/var is locked: {why}");
    node.journal.error(format_args!("{reason}"));
    *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::Failure {
        version: node.version.clone(),
        reason,
    });
    node.set_stage(Stage::Failed);
    let sequence = sequences::locked(node, facts, |_ctx| {
        let handle = start_api(node)?;
        let addr = handle.local_addr();
        *api.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(addr)
    });
    match node.lock.run(sequence, node.journal.as_ref()) {
        Ok(()) => None,
        Err(err) => dispose(node, err),
    }
}

/// A boot that could not be committed fails as a Boot task would: in phase `health` when a
/// check failed, else in phase `commit` (the names the console shows and the VM tests read).
fn not_committed(err: SettleError) -> SequenceError {
    let (phase, task, reason) = match err {
        SettleError::Unhealthy(report) => ("health", "healthChecks", report),
        SettleError::Failed(reason) => ("commit", "commitUpgrade", reason),
    };
    SequenceError::Fatal {
        sequence: slate_sequencer::SequenceKind::Boot,
        phase: phase.into(),
        task: task.into(),
        source: reason.into(),
    }
}

/// Run `sequence` under `guard`, announcing its start and its end (with the error, if any) on
/// the node's event stream.
fn run_published(
    node: &Node,
    sequence: Sequence<'_>,
    guard: &slate_sequencer::SequenceGuard,
) -> Result<(), SequenceError> {
    let name = sequence.kind().to_string();
    node.publish(EventKind::SequenceStarted {
        sequence: name.clone(),
    });
    let result = sequence.run(guard.token(), node.journal.as_ref());
    // An upgrade that did its work ends by asking for the reboot into the new version.
    let ok = matches!(result, Ok(()) | Err(SequenceError::Reboot { .. }));
    node.journal
        .not_kept(node.journal.counters.finished(&name, ok));
    node.publish(EventKind::SequenceFinished {
        sequence: name,
        error: result.as_ref().err().map(|e| e.to_string()),
    });
    result
}

/// Run a sequence whose lock the API already took.
fn run_held(
    node: &Node,
    sequence: Sequence<'_>,
    guard: &slate_sequencer::SequenceGuard,
) -> Option<SequenceError> {
    match run_published(node, sequence, guard) {
        Ok(()) => None,
        Err(err) => dispose(node, err),
    }
}

/// An upgrade that fails before its reboot leaves the running version the default (the
/// installer's write order guarantees it), so the failure is reported and the node keeps
/// running; only the reboot at its end, or a panic, leaves this function.
fn run_upgrade(node: &Node, sequence: Sequence<'_>, guard: &slate_sequencer::SequenceGuard) {
    let Err(err) = run_published(node, sequence, guard) else {
        return;
    };
    if let Disposition::Reboot(mode) = err.disposition() {
        handler::reboot(node, mode);
    }
    // Drained before the installer ran: the node runs on as it was, workload included.
    if let Some(services) = node.services.get() {
        services.start_all();
    }
    // The whole chain: the task's own words say why (a signature, a Secure Boot refusal, a
    // policy), and `slate status` is where an operator reads them.
    let reason = format!("upgrade failed: {}", slate_sequencer::error_chain(&err));
    node.journal.error(&reason);
    *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::Failure {
        version: node.version.clone(),
        reason,
    });
    node.set_stage(Stage::Running);
}

/// Reboot (does not return), swallow (`None`), or hand back a fatal error.
fn dispose(node: &Node, err: SequenceError) -> Option<SequenceError> {
    match err.disposition() {
        Disposition::Reboot(mode) => handler::reboot(node, mode),
        Disposition::Swallow => {
            node.journal
                .info(format_args!("{err}; the node keeps running"));
            None
        }
        Disposition::Fatal => Some(err),
    }
}

/// The node API with the node's own identity: its key and a serving certificate issued from
/// the machine configuration's CA for its name, hostname and addresses; clients must present
/// a certificate of the configuration's client CA.
fn start_api(node: &Arc<Node>) -> Result<slate_api::ServerHandle, TaskError> {
    let config = node
        .machine
        .current()
        .ok_or_else(|| TaskError::msg("no machine configuration"))?;
    let listen: SocketAddr = match config.api.listen {
        Some(listen) => listen,
        None => node.config.listen().map_err(TaskError::msg)?,
    };
    let addresses = node.machine.addresses();
    let (cert, key, issued) = machine::identity(&base::paths::state_dir(), &config, &addresses)
        .map_err(TaskError::msg)?;
    let fingerprint = slate_api::fingerprint(&cert).map_err(|e| TaskError::msg(e.to_string()))?;
    node.journal.info(format_args!(
        "API identity: serving certificate sha256 {fingerprint} ({})",
        if issued { "issued now" } else { "kept" }
    ));
    let interrupted = upgrade::tidy_received();
    if interrupted > 0 {
        node.journal.info(format_args!(
            "removed {interrupted} interrupted upload(s) from {}",
            upgrade::BUNDLES_DIR
        ));
    }
    let server = ServerConfig::new(
        listen,
        config.api.client_ca.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
    )
    // Uploads land under /var (EPHEMERAL): one whose declared length exceeds its free space is
    // refused (507) before a byte is read.
    .with_limits(slate_api::Limits {
        upload_dir: Some("/var".into()),
        ..slate_api::Limits::default()
    });
    Ok(slate_api::spawn(server, Arc::new(Backend(node.clone())))?)
}

#[cfg(test)]
mod tests {
    use slate_sequencer::{error_chain, PhaseListBuilder, SequenceKind, Task};

    use super::*;

    fn failing(kind: SequenceKind, message: &'static str) -> Sequence<'static> {
        PhaseListBuilder::new()
            .append(
                "work",
                [Task::new("job", move |_| Err(TaskError::msg(message)))],
            )
            .into_sequence(kind)
    }

    fn journal_lines(node: &Node) -> Vec<String> {
        node.journal.read_from(0, None).0
    }

    #[test]
    fn an_unhealthy_boot_fails_in_phase_health() {
        let report = "health check `file /ready` failed: missing (1 attempt in 0.0s)";
        let err = not_committed(SettleError::Unhealthy(report.into()));
        assert_eq!(
            error_chain(&err),
            format!("boot sequence: phase health: task healthChecks failed: {report}")
        );
        assert_eq!(err.disposition(), Disposition::Fatal);
    }

    #[test]
    fn a_boot_that_cannot_be_committed_fails_in_phase_commit() {
        let err = not_committed(SettleError::Failed(
            "the boot loader would boot nothing on this disk".into(),
        ));
        assert_eq!(
            error_chain(&err),
            "boot sequence: phase commit: task commitUpgrade failed: \
             the boot loader would boot nothing on this disk"
        );
    }

    #[test]
    fn contention_is_swallowed_and_logged() {
        let (node, _requests) = Node::for_tests("");
        let err = SequenceError::Locked {
            running: SequenceKind::Reset,
        };
        assert!(dispose(&node, err).is_none());
        assert_eq!(
            journal_lines(&node),
            ["locked: the reset sequence is running; the node keeps running"]
        );
    }

    #[test]
    fn a_failed_task_is_handed_back_as_fatal() {
        let (node, _requests) = Node::for_tests("");
        let err = failing(SequenceKind::Reset, "disk gone")
            .run(
                &slate_sequencer::CancelToken::new(),
                &slate_sequencer::NullLogger,
            )
            .unwrap_err();
        let fatal = dispose(&node, err).expect("fatal");
        assert_eq!(
            error_chain(&fatal),
            "reset sequence: phase work: task job failed: disk gone"
        );
    }

    #[test]
    fn a_held_sequence_reports_its_start_and_end_as_events() {
        let (node, _requests) = Node::for_tests("");
        let events = node.subscribe();
        let guard = node.lock.try_lock(SequenceKind::Reset).unwrap();
        let fatal = run_held(&node, failing(SequenceKind::Reset, "disk gone"), &guard);
        assert!(fatal.is_some());
        let kinds: Vec<EventKind> = events.try_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::Stage {
                    stage: Stage::Booting
                },
                EventKind::SequenceStarted {
                    sequence: "reset".into()
                },
                EventKind::SequenceFinished {
                    sequence: "reset".into(),
                    error: Some("reset sequence: phase work: task job failed".into()),
                },
            ]
        );
        let done = PhaseListBuilder::new()
            .append("work", [Task::new("job", |_| Ok(()))])
            .into_sequence(SequenceKind::Reset);
        assert!(run_held(&node, done, &guard).is_none());
    }

    #[test]
    fn a_failed_upgrade_is_reported_and_the_node_keeps_running() {
        let (node, _requests) = Node::for_tests("");
        let guard = node.lock.try_lock(SequenceKind::Upgrade).unwrap();
        run_upgrade(
            &node,
            failing(SequenceKind::Upgrade, "bad signature"),
            &guard,
        );
        let reason = "upgrade failed: upgrade sequence: phase work: task job failed: bad signature";
        assert_eq!(
            *node.last_failure.lock().unwrap(),
            Some(slate_api::Failure {
                version: node.version.clone(),
                reason: reason.into(),
            })
        );
        assert_eq!(node.stage(), Stage::Running);
        assert!(journal_lines(&node).contains(&format!("error: {reason}")));
    }
}
