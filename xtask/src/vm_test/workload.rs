//! The demo profile's workload, seen from the host: its web service's page through the VM's
//! port forward, and the node's answers about it (`slate services`, `slate service`,
//! `slate logs --service`).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};

use super::Node;

/// `GET path` of the guest's web service through host port `port`: the status line and body.
pub(super) fn get(port: u16, path: &str) -> Result<(String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: node\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    ))
}

/// Waits (up to 60 s: the service starts last in Boot) until the web service answers with the
/// os-release of `version` (the imager's `IMAGE_VERSION=`); returns what it saw.
pub(crate) fn serves_version(port: u16, version: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let want = format!("IMAGE_VERSION={version}");
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        match get(port, "/os-release") {
            Ok((status, body)) if status.contains(" 200 ") && body.lines().any(|l| l == want) => {
                return Ok(format!("web service answers {want}"));
            }
            Ok((status, body)) => {
                last = format!("{status}: {}", body.trim().replace('\n', " | "));
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("the web service never served {version}'s os-release: {last}")
}

/// `slate services` lists `web` running and ready; `slate service restart web` gives it a new
/// process that answers again; `slate logs --service web` holds what machined said of it.
pub(crate) fn services_answer(node: &Node<'_>, web_port: u16) -> Result<String> {
    let listed: serde_json::Value =
        serde_json::from_str(&node.ok(&["services", "--output", "json"])?)?;
    let web = listed["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "web"))
        .with_context(|| format!("no service web: {listed}"))?
        .clone();
    ensure!(
        web["state"] == "running" && web["ready"] == true,
        "web running and ready: {web}"
    );
    let pid = web["pid"].as_u64().context("web has no pid")?;
    let table = node.ok(&["services"])?;
    let restarted: serde_json::Value =
        serde_json::from_str(&node.ok(&["service", "restart", "web", "--output", "json"])?)?;
    ensure!(
        restarted["pid"].as_u64().is_some_and(|p| p != pid),
        "a restart starts a new process: {pid} then {restarted}"
    );
    let dry = node.ok(&["service", "stop", "web", "--dry-run"])?;
    ensure!(dry.contains("would stop service web"), "{dry}");
    let logs = node.ok(&["logs", "--service", "web"])?;
    ensure!(
        logs.contains("service web: stopping (restart asked over the API)")
            // Its own stop signal ended it, within its grace period: no kill was needed.
            && logs.contains("service web: stopped (signal 15)")
            && logs.contains("service web: started, pid")
            && !logs.contains("stage Running"),
        "the web service's log, and only its: {logs}"
    );
    let page = serves_again(web_port)?;
    Ok(format!(
        "`slate services`: {}; restarted (pid {pid} -> {}); {page}",
        table
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        restarted["pid"]
    ))
}

/// The page answers after a restart (readiness comes a moment after the start).
fn serves_again(port: u16) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((status, body)) = get(port, "/") {
            if status.contains(" 200 ") && body.contains("slate demo node") {
                return Ok("the page answers again".into());
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the page never came back after the restart"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// On a boot's console: the drain `why` stopped the web service — its stop asked, then its
/// end. Returns both lines (without the kernel's timestamp).
pub(crate) fn drained(serial: &str, why: &str) -> Result<(String, String)> {
    let asked = format!("service web: stopping ({why})");
    let lines: Vec<&str> = serial.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains(&asked))
        .with_context(|| format!("no {asked:?} on the console"))?;
    let stopped = lines[at..]
        .iter()
        .find(|l| l.contains("service web: stopped ("))
        .with_context(|| format!("the web service never stopped after {asked:?}"))?;
    let plain = |l: &str| {
        l.split_once("] [machined] ")
            .map_or(l, |(_, r)| r)
            .trim()
            .to_owned()
    };
    Ok((plain(lines[at]), plain(stopped)))
}

/// Waits (up to `wait`) until `GET path` answers 200 with a body holding every one of `needles`
/// (each at least as many times as it is listed); returns the body.
pub(super) fn page_with(port: u16, path: &str, needles: &[&str], wait: Duration) -> Result<String> {
    let deadline = Instant::now() + wait;
    loop {
        let last = match get(port, path) {
            Ok((status, body)) if status.contains(" 200 ") => {
                let holds = needles
                    .iter()
                    .all(|n| body.matches(n).count() >= needles.iter().filter(|m| *m == n).count());
                if holds {
                    return Ok(body);
                }
                format!("{status}: {}", body.trim().replace('\n', " | "))
            }
            Ok((status, _)) => status,
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!("{path} never held {needles:?}: {last}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
