//! A real OCI registry for the VM scenarios and benchmarks: Debian's `docker-registry` serving
//! a scratch directory on a free 127.0.0.1 port, stopped when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

#[derive(Debug)]
pub struct Registry {
    /// `127.0.0.1:PORT`
    pub host: String,
    child: Child,
}

fn answers(host: &str) -> bool {
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
    answer.starts_with(b"HTTP/1.1 200")
}

impl Registry {
    /// Start it with its storage and log under `dir`.
    pub fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {host}\n",
                dir.join("storage").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!("starting {REGISTRY_BIN} (scripts/install-deps installs it)")
            })?;
        let mut registry = Registry { host, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if answers(&registry.host) {
                return Ok(registry);
            }
            if registry.child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "docker-registry did not answer on {}: {}",
            registry.host,
            std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
        )
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
