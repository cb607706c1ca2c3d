//! A fake node backend and helpers to run the real server over TLS on 127.0.0.1.

#![allow(dead_code)]

pub mod raw;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slate_api::{
    ApplyConfigRequest, ApplyConfigResult, BackendError, Client, Event, EventKind, EventStream,
    Failure, Limits, LineStream, Mode, NodeBackend, RebootMode, Role, ServerConfig, ServerHandle,
    Stage, Status, UpgradeRequest, UploadedBundle, VersionInfo,
};
use tempfile::TempDir;

/// A node that records what it is asked and can be told to be locked or slow.
#[derive(Debug, Default)]
pub struct Fake {
    /// Every mutating call answers Locked.
    pub locked: AtomicBool,
    /// The sequence lock: upgrade holds it for `upgrade_hold` and answers Locked when taken.
    pub sequence: Mutex<()>,
    pub upgrade_hold: Duration,
    pub reboots: Mutex<Vec<RebootMode>>,
    /// Entries asked to boot once, with the mode.
    pub reboots_once: Mutex<Vec<(String, RebootMode)>>,
    pub resets: AtomicUsize,
    pub shutdowns: AtomicUsize,
    /// Uploads that reached `receive_bundle`.
    pub received: AtomicUsize,
    pub upgrades: Mutex<Vec<UpgradeRequest>>,
    /// Lines of `logs`, produced `log_gap` apart; the production instants are recorded.
    pub log_lines: Vec<String>,
    pub log_gap: Duration,
    pub produced: Arc<Mutex<Vec<Instant>>>,
    /// Live events sent after the backlog (follow), then the sender is dropped.
    pub live_events: Vec<EventKind>,
    /// Lines given to `log_api`.
    pub api_log: Mutex<Vec<String>>,
    /// Documents given to `apply_config`.
    pub configs: Mutex<Vec<ApplyConfigRequest>>,
    /// How long `log_api` takes per KiB of line: a serial console (115200 baud) takes about
    /// 90 ms.
    pub log_cost_per_kib: Duration,
}

impl Fake {
    pub fn api_log(&self) -> Vec<String> {
        self.api_log.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) for a line of the API log containing `needle`: the server logs on
    /// a thread of its own, after the answer.
    pub fn wait_log(&self, needle: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.api_log();
            if log.iter().any(|l| l.contains(needle)) {
                return log;
            }
            assert!(Instant::now() < deadline, "no {needle:?} in {log:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn check_lock(&self) -> Result<(), BackendError> {
        if self.locked.load(Ordering::SeqCst) {
            return Err(BackendError::Locked("sequence Upgrade is running".into()));
        }
        Ok(())
    }
}

pub fn version() -> VersionInfo {
    VersionInfo {
        version: "1.2.3".into(),
        arch: "amd64".into(),
        booted_entry: Some("slate-1.2.3+3.efi".into()),
        kernel: None,
    }
}

pub fn status() -> Status {
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
        version: "1.2.3".into(),
        booted_entry: Some("slate-1.2.3+3.efi".into()),
        stage: Stage::Running,
        running_sequence: None,
        mode: Mode::Metal,
        staged_image: None,
        last_failure: Some(Failure {
            version: "1.3.0".into(),
            reason: "task mountState failed".into(),
        }),
        node_name: Some("node1".into()),
        hostname: Some("node1".into()),
        machine_id: None,
        agent: None,
    }
}

impl NodeBackend for Fake {
    fn version(&self) -> VersionInfo {
        version()
    }

    fn status(&self) -> Status {
        status()
    }

    fn reboot(&self, mode: RebootMode) -> Result<(), BackendError> {
        self.check_lock()?;
        self.reboots.lock().unwrap().push(mode);
        Ok(())
    }

    fn reboot_once_into(&self, entry: &str, mode: RebootMode) -> Result<(), BackendError> {
        self.check_lock()?;
        self.reboots_once
            .lock()
            .unwrap()
            .push((entry.to_owned(), mode));
        Ok(())
    }

    fn shutdown(&self) -> Result<(), BackendError> {
        self.check_lock()?;
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn reset(&self) -> Result<(), BackendError> {
        self.check_lock()?;
        self.resets.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn upgrade(&self, req: UpgradeRequest) -> Result<(), BackendError> {
        self.check_lock()?;
        let _held = self
            .sequence
            .try_lock()
            .map_err(|_| BackendError::Locked("sequence Upgrade is running".into()))?;
        self.upgrades.lock().unwrap().push(req);
        std::thread::sleep(self.upgrade_hold);
        Ok(())
    }

    /// Reads the whole stream; answers its length and SHA-256, or refuses a body that does not
    /// start like a tar header's "ustar" magic at 257 after reading only that much.
    fn receive_bundle(&self, body: &mut dyn std::io::Read) -> Result<UploadedBundle, BackendError> {
        use sha2::Digest as _;
        self.received.fetch_add(1, Ordering::SeqCst);
        let mut head = vec![0u8; 512];
        body.read_exact(&mut head)
            .map_err(|e| BackendError::InvalidArgument(format!("short upload: {e}")))?;
        if &head[257..262] != b"ustar" {
            return Err(BackendError::InvalidArgument("not a tar stream".into()));
        }
        let mut hasher = sha2::Sha256::new();
        hasher.update(&head);
        let mut size = head.len() as u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = body
                .read(&mut buf)
                .map_err(|e| BackendError::Failed(e.to_string()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        Ok(UploadedBundle {
            id: format!("sha256:{}", hex::encode(hasher.finalize())),
            name: "slate".into(),
            version: "2.0.0".into(),
            size,
        })
    }

    fn events(&self) -> EventStream {
        let (tx, rx) = mpsc::channel();
        tx.send(Event::now(EventKind::Stage {
            stage: Stage::Running,
        }))
        .unwrap();
        let live = self.live_events.clone();
        std::thread::spawn(move || {
            for kind in live {
                std::thread::sleep(Duration::from_millis(50));
                if tx.send(Event::now(kind)).is_err() {
                    return;
                }
            }
        });
        rx
    }

    fn logs(&self, _follow: bool) -> Result<LineStream, BackendError> {
        let (tx, rx) = mpsc::channel();
        let (lines, gap, produced) = (self.log_lines.clone(), self.log_gap, self.produced.clone());
        std::thread::spawn(move || {
            for line in lines {
                std::thread::sleep(gap);
                produced.lock().unwrap().push(Instant::now());
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Box::new(rx.into_iter()))
    }

    fn apply_config(&self, req: ApplyConfigRequest) -> Result<ApplyConfigResult, BackendError> {
        self.configs.lock().unwrap().push(req);
        Ok(ApplyConfigResult {
            changed: vec!["node.name".into()],
            reboot_required: false,
            outcome: "applied".into(),
        })
    }

    fn dmesg(&self, _follow: bool) -> Result<LineStream, BackendError> {
        Err(BackendError::Unsupported(
            "no kernel log in container mode".into(),
        ))
    }

    fn log_api(&self, message: &str) {
        let kib = u32::try_from(message.len() / 1024).unwrap_or(u32::MAX);
        std::thread::sleep(self.log_cost_per_kib * kib);
        self.api_log.lock().unwrap().push(message.to_owned());
    }
}

/// A certificate set from `gen_certs`.
pub fn certs() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    slate_api::gen_certs(dir.path(), &["node-1.example".to_owned()]).unwrap();
    dir
}

/// The real server on 127.0.0.1 (any port) over `fake`, with a fresh certificate set.
pub fn start(fake: Arc<Fake>) -> (TempDir, ServerHandle) {
    start_with(fake, Limits::default())
}

/// [`start`] with other limits (shorter timeouts for a test that waits for them).
pub fn start_with(fake: Arc<Fake>, limits: Limits) -> (TempDir, ServerHandle) {
    let dir = certs();
    let config = ServerConfig::from_dir("127.0.0.1:0".parse().unwrap(), dir.path())
        .unwrap()
        .with_limits(limits);
    let server = slate_api::spawn(config, fake).unwrap();
    (dir, server)
}

pub fn client(dir: &TempDir, server: &ServerHandle, role: Role) -> Client {
    let addr = server.local_addr().to_string();
    Client::from_dir(&addr, dir.path(), role).unwrap()
}

pub fn read(dir: &TempDir, name: &str) -> Vec<u8> {
    std::fs::read(dir.path().join(name)).unwrap()
}

/// What an attacker holding a CA's key (`ca_pem`/`ca_key_pem`: a node's issuing CA, read off
/// its disk) makes of it: a certificate for `sans` (DNS names or IP addresses), a client's
/// (`O=os:<role>`, clientAuth) when `role` is given, else a server's; the chain (certificate,
/// then the CA) and its key, PEM. Built with rcgen directly, so nothing of slate's own issuing
/// (which keeps to the constraints) stands in the way.
pub fn forge(
    ca_pem: &str,
    ca_key_pem: &str,
    sans: &[&str],
    role: Option<Role>,
) -> (String, String) {
    let issuer_key = rcgen::KeyPair::from_pem(ca_key_pem).unwrap();
    let issuer = rcgen::CertificateParams::from_ca_cert_pem(ca_pem)
        .unwrap()
        .self_signed(&issuer_key)
        .unwrap();
    let mut p =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "attacker");
    p.extended_key_usages = match role {
        Some(role) => {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, role.organization());
            vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
        }
        None => vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth],
    };
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut chain = p.signed_by(&key, &issuer, &issuer_key).unwrap().pem();
    chain.push_str(ca_pem);
    (chain, key.serialize_pem())
}
