//! Maintenance mode: a node that boots without a machine configuration brings the network up
//! with DHCP, serves only `apply-config` — over TLS with a self-signed certificate, to the
//! holder of a one-time token it prints on the console (or takes from `slate.maintenance.token`)
//! — and goes on booting once a valid configuration is stored.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slate_api::{
    ApplyConfigRequest, ApplyConfigResult, BackendError, EventStream, LineStream, NodeBackend,
    RebootMode, ServerConfig, Stage, Status, UpgradeRequest, VersionInfo,
};
use slate_machine_config::Parsed;
use slate_sequencer::{TaskContext, TaskError};

use crate::base::journal::Journal;
use crate::base::node::Node;
use crate::base::task::failed;
use crate::boot::machine;

struct MaintenanceBackend {
    version: String,
    journal: Arc<Journal>,
    state: std::path::PathBuf,
    configured: Mutex<Option<Sender<Parsed>>>,
}

impl NodeBackend for MaintenanceBackend {
    fn version(&self) -> VersionInfo {
        VersionInfo {
            version: self.version.clone(),
            arch: slate_bundle::NATIVE_ARCH.into(),
            booted_entry: None,
            kernel: None,
        }
    }

    fn status(&self) -> Status {
        Status {
            boot_id: None,
            committed: false,
            last_rollback: None,
            pinned: Vec::new(),
            secure_boot: None,
            var: None,
            boot_times: None,
            memory: None,
            warnings: Vec::new(),
            version: self.version.clone(),
            booted_entry: None,
            stage: Stage::Booting,
            running_sequence: Some("boot".into()),
            mode: slate_api::Mode::Metal,
            staged_image: None,
            last_failure: None,
            node_name: None,
            hostname: None,
            machine_id: None,
            agent: None,
        }
    }

    fn reboot(&self, _: RebootMode) -> Result<(), BackendError> {
        Err(unsupported())
    }

    fn reset(&self) -> Result<(), BackendError> {
        Err(unsupported())
    }

    fn upgrade(&self, _: UpgradeRequest) -> Result<(), BackendError> {
        Err(unsupported())
    }

    fn apply_config(&self, req: ApplyConfigRequest) -> Result<ApplyConfigResult, BackendError> {
        let parsed = machine::check(&req.config)?;
        let result = |outcome: &str| ApplyConfigResult {
            changed: vec!["everything".into()],
            reboot_required: false,
            outcome: outcome.into(),
        };
        if req.dry_run {
            return Ok(result("dry-run"));
        }
        let mut slot = self.configured.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sender) = slot.take() else {
            return Err(BackendError::Locked(
                "a configuration was already applied; the node is booting with it".into(),
            ));
        };
        machine::store(&self.state, &req.config)
            .map_err(|e| BackendError::Failed(format!("writing the machine configuration: {e}")))?;
        self.journal.info(format_args!(
            "maintenance: machine configuration for node {} stored; booting on",
            parsed.config.node.name
        ));
        let _ = sender.send(parsed);
        Ok(result("applied"))
    }

    fn events(&self) -> EventStream {
        mpsc::channel().1
    }

    fn logs(&self, _: bool) -> Result<LineStream, BackendError> {
        Err(unsupported())
    }

    fn dmesg(&self, _: bool) -> Result<LineStream, BackendError> {
        Err(unsupported())
    }

    fn log_api(&self, message: &str) {
        self.journal.info(format_args!("{message}"));
    }
}

fn unsupported() -> BackendError {
    BackendError::Unsupported("the node is in maintenance mode".into())
}

/// A token nobody can guess: 128 random bits as hex.
fn random_token() -> Result<String, TaskError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| failed(format!("reading /dev/urandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Serve `apply-config` until a valid configuration is stored; returns it. The watchdog (armed
/// for hung boots) is fed meanwhile: waiting for the operator is not a hang.
pub fn wait_for_config(
    ctx: &TaskContext<'_>,
    node: &Node,
    watchdog: Option<&Arc<slate_host::Watchdog>>,
) -> Result<Parsed, TaskError> {
    let token = match slate_host::cmdline_value(
        &slate_host::kernel_cmdline().unwrap_or_default(),
        "slate.maintenance.token",
    ) {
        Some(token) if !token.is_empty() => token.to_owned(),
        _ => random_token()?,
    };
    let addresses = node.machine.addresses();
    let key = slate_api::generate_key_pem().map_err(|e| failed(e.to_string()))?;
    let cert = slate_api::self_signed_cert(&key, &slate_api::serving_names(&addresses))
        .map_err(|e| failed(e.to_string()))?;
    let fingerprint = slate_api::fingerprint(&cert).map_err(|e| failed(e.to_string()))?;
    let listen: SocketAddr = node.config.listen().map_err(failed)?;
    let (tx, rx): (Sender<Parsed>, Receiver<Parsed>) = mpsc::channel();
    let backend = MaintenanceBackend {
        version: node.version.clone(),
        journal: node.journal.clone(),
        state: crate::base::paths::state_dir(),
        configured: Mutex::new(Some(tx)),
    };
    let server = slate_api::spawn(
        ServerConfig::maintenance(listen, cert.as_bytes(), key.as_bytes(), &token),
        Arc::new(backend),
    )
    .map_err(|e| failed(format!("starting the maintenance API: {e}")))?;
    ctx.log(&format!(
        "maintenance mode: no machine configuration on STATE; listening on {}",
        server.local_addr()
    ));
    ctx.log(&format!("maintenance token: {token}"));
    ctx.log(&format!("maintenance certificate sha256: {fingerprint}"));
    ctx.log(&format!(
        "configure this node with `slate --node {} apply-config FILE --insecure --token {token}`",
        addresses.first().map_or("ADDRESS", String::as_str)
    ));
    let feed_every = watchdog.map(|dog| crate::boot::watchdog::interval(dog.timeout()));
    let parsed = loop {
        if let Some(dog) = watchdog {
            let _ = dog.keepalive();
        }
        match rx.recv_timeout(
            feed_every
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1)),
        ) {
            Ok(parsed) => break parsed,
            Err(mpsc::RecvTimeoutError::Timeout) => ctx.sleep(Duration::ZERO)?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(failed("the maintenance API stopped"))
            }
        }
    };
    // The answer must leave before the server goes; it is sent before the config is.
    std::thread::sleep(Duration::from_millis(200));
    server
        .shutdown()
        .map_err(|e| failed(format!("stopping the maintenance API: {e}")))?;
    Ok(parsed)
}

/// Where the configuration lives, for log lines.
pub fn config_path() -> std::path::PathBuf {
    Path::new(crate::base::paths::STATE_MOUNT).join(slate_machine_config::STATE_PATH)
}
