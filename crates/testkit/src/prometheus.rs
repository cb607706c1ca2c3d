//! A real Prometheus for the metrics tests (Debian's `prometheus`, which ships `promtool`):
//! started on a free loopback port with a generated configuration, asked through its HTTP API,
//! stopped on drop. And `promtool check metrics` over an endpoint's text.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::require_tool;

/// Both tools are there (under `CI=true`, a failure if not).
#[must_use = "the test must return when its prerequisite is missing"]
#[track_caller]
pub fn require_prometheus() -> bool {
    require_tool("prometheus") && require_tool("promtool")
}

/// `promtool check metrics` on `text`: `Err` with what it said when it finds a problem.
pub fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run promtool: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(text.as_bytes())
        .map_err(|e| format!("writing to promtool: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("promtool: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A Prometheus server; killed on drop.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with `scrape_configs` (YAML, the list under `scrape_configs:`,
    /// indented by two spaces), scraping every `interval`; waits until it is ready. Files the
    /// configuration names (certificates) may be put in [`Prometheus::dir`] first: it is
    /// made before the configuration is read.
    pub fn start(
        dir: tempfile::TempDir,
        interval: Duration,
        scrape_configs: &str,
    ) -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let secs = interval.as_secs_f64();
        let config = format!(
            "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\nscrape_configs:\n{scrape_configs}"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(dir.path().join("prometheus.log")).map_err(|e| e.to_string())?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start prometheus: {e}"))?;
        let mut p = Prometheus { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = p.get("/-/ready") {
                return Ok(p);
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!("prometheus exited ({status}): {}", p.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("prometheus not ready in 30 s: {}", p.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` on its HTTP API: the status and the body.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.port
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Ok((status, body))
    }

    /// An instant query (`/api/v1/query`): the result vector's samples as (labels, value).
    pub fn query(&self, promql: &str) -> Result<Vec<(serde_json::Value, f64)>, String> {
        let (status, body) = self
            .get(&format!("/api/v1/query?query={}", encode(promql)))
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{promql}: {body}"));
        }
        let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
        Ok(result
            .into_iter()
            .map(|r| {
                let value = r["value"][1]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                (r["metric"].clone(), value)
            })
            .collect())
    }

    /// Asks `promql` until `accept` takes its samples, or `within` passes: the last answer.
    pub fn wait_for(
        &self,
        promql: &str,
        within: Duration,
        accept: impl Fn(&[(serde_json::Value, f64)]) -> bool,
    ) -> Result<Vec<(serde_json::Value, f64)>, String> {
        let deadline = Instant::now() + within;
        loop {
            let answer = self.query(promql);
            match &answer {
                Ok(samples) if accept(samples) => return answer,
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "{promql}: not as expected within {within:?}; last answer {answer:?}; \
                         targets: {:?}",
                        self.get("/api/v1/targets").map(|(_, b)| b)
                    ))
                }
                _ => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encoding for a query parameter's value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` over mutual TLS with `openssl s_client` (the tests' way to read an endpoint's
/// text as Prometheus would, with its certificate): the status and the body.
pub fn https_get(
    addr: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    path: &str,
) -> Result<(u16, String), String> {
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-verify_return_error",
            "-connect",
            addr,
        ])
        .arg("-CAfile")
        .arg(ca)
        .arg("-cert")
        .arg(cert)
        .arg("-key")
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    // Kept open until the answer is read: s_client may stop at its input's end.
    let out = {
        let out = child.wait_with_output().map_err(|e| e.to_string());
        drop(stdin);
        out?
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "no HTTP answer from {addr}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}
