//! A real OCI registry for tests: Debian's `docker-registry` (distribution 2.8) serving a
//! temporary directory on a free 127.0.0.1 port — or, over TLS with a given certificate, on
//! another address of this machine ([`TestRegistry::start_tls`]) — stopped when dropped.
//!
//! When the binary is missing the harness installs the package (as root, or with `sudo -n`);
//! only when that fails too does a test skip, saying why. Under `CI=true` it fails instead
//! (slate-testkit).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Why the registry cannot be had, if it cannot.
fn availability() -> &'static Result<(), String> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        if Path::new(REGISTRY_BIN).exists() {
            return Ok(());
        }
        let is_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        let mut cmd = if is_root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "apt-get"]);
            sudo
        };
        let status = cmd
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "docker-registry",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if Path::new(REGISTRY_BIN).exists() {
            Ok(())
        } else {
            Err(format!(
                "{REGISTRY_BIN} is missing and `apt-get install docker-registry` did not provide \
                 it ({status:?}); run scripts/install-deps"
            ))
        }
    })
}

/// A running registry; `host` is `127.0.0.1:<port>`.
#[derive(Debug)]
pub struct TestRegistry {
    pub host: String,
    child: Child,
    dir: tempfile::TempDir,
}

fn free_port(ip: &str) -> u16 {
    TcpListener::bind(format!("{ip}:0"))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// An address of this machine that is not loopback (the source address of its default route;
/// no packet is sent), for a registry that must be spoken to over HTTPS.
#[allow(dead_code)] // this file is included by test crates that need only a plain registry
pub fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("203.0.113.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Whether the server answers like an HTTP server: `GET /v2/` answers 200, or (a TLS port
/// spoken to in plain HTTP) anything at all.
fn answers(host: &str, tls: bool) -> bool {
    let Ok(mut stream) = TcpStream::connect(host) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /v2/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200") || (tls && answer.starts_with(b"HTTP/1."))
}

impl TestRegistry {
    /// Start a registry, or `None` (with the reason printed) when there is none to be had.
    pub fn start() -> Option<Self> {
        Self::start_on("127.0.0.1", None)
    }

    /// A registry on `ip` serving HTTPS with the PEM certificate and key given.
    #[allow(dead_code)] // as `non_loopback_ip`
    pub fn start_tls(ip: &str, cert: &Path, key: &Path) -> Option<Self> {
        Self::start_on(ip, Some((cert, key)))
    }

    fn start_on(ip: &str, tls: Option<(&Path, &Path)>) -> Option<Self> {
        // Skipped, saying why; failed under CI=true.
        let available = availability();
        let why = available.as_ref().err().map_or("", String::as_str);
        if !slate_testkit::require(available.is_ok(), &format!("tool {REGISTRY_BIN}"), why) {
            return None;
        }
        let mut last_log = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let host = format!("{ip}:{}", free_port(ip));
            let tls_config = tls.map_or(String::new(), |(cert, key)| {
                format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    cert.display(),
                    key.display()
                )
            });
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                     http:\n  addr: {host}\n{tls_config}",
                    dir.path().join("storage").display()
                ),
            )
            .expect("the registry config");
            let log = std::fs::File::create(dir.path().join("registry.log")).expect("a log");
            let child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("a log"))
                .stderr(log)
                .spawn()
                .expect("docker-registry starts");
            let mut registry = TestRegistry { host, child, dir };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if answers(&registry.host, tls.is_some()) {
                    return Some(registry);
                }
                if let Ok(Some(_)) = registry.child.try_wait() {
                    break; // the port was taken, most likely: try another
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            last_log = std::fs::read_to_string(registry.log_path()).unwrap_or_default();
        }
        panic!("docker-registry did not come up; its log:\n{last_log}");
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// `host/repository:tag`.
    pub fn image(&self, repository_and_tag: &str) -> String {
        format!("{}/{repository_and_tag}", self.host)
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
