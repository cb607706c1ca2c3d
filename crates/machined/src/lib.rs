//! machined: the real PID 1 of a slate node.
//!
//! It reaps orphans, runs Initialize → Install → Boot under the priority lock, then serves the
//! node API and runs what the API asks for (reboot, reset) as sequences of their own. A sequence
//! that asks for a reboot unwinds as a typed error to [`handler::reboot`]; any other fatal error
//! goes to [`handler::fatal`]; Locked and Cancelled are swallowed and the node keeps running.

mod backend;
mod handler;
mod health;
mod journal;
mod node;
mod sequences;
mod transaction;
mod upgrade;
mod watchdog;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Result};
use slate_api::{EventKind, ServerConfig, Stage};
use slate_host::KmsgLogger;
use slate_sequencer::{run_boot, BootOutcome, Disposition, Sequence, SequenceError, TaskError};

use backend::Backend;
use journal::Journal;
use node::{Node, Request};
use sequences::Facts;

/// Where the image carries the node's API identity.
const PKI_DIR: &str = "/etc/slate/pki";

pub fn run() -> Result<()> {
    if !slate_host::is_pid1() {
        bail!("machined runs as PID 1 of a slate node only");
    }
    let _ = slate_host::disable_kmsg_ratelimit();
    let journal = Arc::new(Journal::new(KmsgLogger::open("machined")));
    journal.info(format_args!("starting slate {}", env!("CARGO_PKG_VERSION")));
    slate_host::spawn_reaper(Duration::from_secs(1));
    let cmdline = slate_host::kernel_cmdline().unwrap_or_default();
    let (node, requests) = Node::new(journal, &cmdline);
    let _ = slate_host::mount_efivarfs();
    let node = node.with_booted_entry(slate_host::read_loader_string("LoaderEntrySelected"));

    let panic_journal = node.journal.clone();
    std::panic::set_hook(Box::new(move |info| {
        panic_journal.error(format_args!("panic: {info}"));
    }));
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
    let facts = Facts::default();
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
            if let Err(failure) = health::check(node, config) {
                return SequenceError::Fatal {
                    sequence: slate_sequencer::SequenceKind::Boot,
                    phase: "health".into(),
                    task: "healthChecks".into(),
                    source: failure.into(),
                };
            }
            if let Err(err) = transaction::commit_booted(node) {
                return SequenceError::Fatal {
                    sequence: slate_sequencer::SequenceKind::Boot,
                    phase: "commit".into(),
                    task: "commitUpgrade".into(),
                    source: err.into(),
                };
            }
            _feeder = watchdog.map(|dog| watchdog::feed(node, dog));
        }
        Ok(other) => node
            .journal
            .info(format_args!("boot ended early: {other:?}; serving")),
        Err(err) => {
            if let Some(fatal) = dispose(node, err) {
                return fatal;
            }
        }
    }
    while let Ok(request) = requests.recv() {
        let (sequence, guard) = match request {
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

/// Run a sequence whose lock the API already took.
fn run_held(
    node: &Node,
    sequence: Sequence<'_>,
    guard: &slate_sequencer::SequenceGuard,
) -> Option<SequenceError> {
    let name = sequence.kind().to_string();
    node.publish(EventKind::SequenceStarted {
        sequence: name.clone(),
    });
    let result = sequence.run(guard.token(), node.journal.as_ref());
    node.publish(EventKind::SequenceFinished {
        sequence: name,
        error: result.as_ref().err().map(|e| e.to_string()),
    });
    match result {
        Ok(()) => None,
        Err(err) => dispose(node, err),
    }
}

/// An upgrade that fails before its reboot leaves the running version the default (the
/// installer's write order guarantees it), so the failure is reported and the node keeps
/// running; only the reboot at its end, or a panic, leaves this function.
fn run_upgrade(node: &Node, sequence: Sequence<'_>, guard: &slate_sequencer::SequenceGuard) {
    let name = sequence.kind().to_string();
    node.publish(EventKind::SequenceStarted {
        sequence: name.clone(),
    });
    let result = sequence.run(guard.token(), node.journal.as_ref());
    node.publish(EventKind::SequenceFinished {
        sequence: name,
        error: result.as_ref().err().map(|e| e.to_string()),
    });
    let Err(err) = result else { return };
    if let Disposition::Reboot(mode) = err.disposition() {
        handler::reboot(node, mode);
    }
    node.journal.error(format_args!("upgrade failed: {err}"));
    *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::Failure {
        version: node.version.clone(),
        reason: format!("upgrade failed: {err}"),
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

fn start_api(node: &Arc<Node>) -> Result<slate_api::ServerHandle, TaskError> {
    let listen: SocketAddr = node
        .config
        .api_listen
        .parse()
        .map_err(|e| TaskError::msg(format!("slate.api.listen: {e}")))?;
    let config = ServerConfig::from_dir(listen, Path::new(PKI_DIR))?;
    Ok(slate_api::spawn(config, Arc::new(Backend(node.clone())))?)
}
