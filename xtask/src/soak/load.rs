//! The status clients of the loaded upgrade: each its own reader certificate, each request
//! retried while the node turns it away, and what their answers measured.

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use slate_api::{Client, Role};

use super::{CLIENTS, REQUEST_TIMEOUT};
use crate::vm_test::demo_pki;

/// One status request of a loaded client.
#[derive(Debug)]
pub(super) struct Sample {
    /// From the first attempt to the answer.
    pub(super) latency: Duration,
    pub(super) ended: Instant,
    /// Why it went unanswered (the last attempt's error).
    pub(super) error: Option<String>,
    /// Attempts the node turned away before this one was answered: connections it closed
    /// during the TLS handshake (over its 32 concurrent handshakes, or its 64 connections) or
    /// answered 429 (over 8 connections of one certificate).
    pub(super) refused: Vec<String>,
}

/// Sleep `time`, or less when `stop` is set meanwhile.
pub(super) fn pause(time: Duration, stop: &AtomicBool) {
    let until = Instant::now() + time;
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
    }
}

/// One status request as a client with retries asks it: attempts the node turns away are
/// tried again (50 ms, doubling to 1 s) until answered, [`REQUEST_TIMEOUT`] passes, or `stop`.
pub(super) fn ask(client: &StatusClient, stop: &AtomicBool) -> Sample {
    let asked = Instant::now();
    let mut refused = Vec::new();
    let mut pause = Duration::from_millis(50);
    loop {
        match client.status() {
            Ok(_) => {
                return Sample {
                    latency: asked.elapsed(),
                    ended: Instant::now(),
                    error: None,
                    refused,
                }
            }
            Err(error) => {
                if stop.load(Ordering::SeqCst) || asked.elapsed() > REQUEST_TIMEOUT {
                    return Sample {
                        latency: asked.elapsed(),
                        ended: Instant::now(),
                        error: Some(error),
                        refused,
                    };
                }
                refused.push(error);
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// What the loaded upgrade measured.
#[derive(Debug)]
pub(super) struct Load {
    pub(super) answered: usize,
    /// Failures after the installer finished (the node going down for its reboot).
    pub(super) after_stop: usize,
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) max: Duration,
    /// The longest time no answer came back (a deadlock would show here).
    pub(super) longest_gap: Duration,
    pub(super) window: Duration,
    /// Attempts turned away and tried again, by error.
    pub(super) refused: std::collections::BTreeMap<String, usize>,
    /// Answered requests that needed more than one attempt.
    pub(super) retried: usize,
}

/// One of the status clients: its own reader certificate of the demo CA (the node allows one
/// client certificate [`slate_api::CONNECTIONS_PER_CLIENT`] connections).
pub(super) struct StatusClient {
    addr: String,
    /// The node's name, which its certificate carries (the address is a port forward).
    name: String,
    ca: String,
    cert: String,
    key: String,
    /// With `--reuse-clients`, one [`Client`] for all the requests.
    kept: Option<Client>,
}

impl StatusClient {
    /// `GET /v1/status`. By default through a new [`Client`] each time, dropped after the
    /// answer, as each `slate status` process does; with `--reuse-clients` through one kept
    /// `Client`, as a long-lived poller does (each call a connection of its own, closed when
    /// answered).
    fn status(&self) -> Result<(), String> {
        let fresh;
        let client = match &self.kept {
            Some(kept) => kept,
            None => {
                fresh = self.client().map_err(|e| e.to_string())?;
                &fresh
            }
        };
        client.status().map(drop).map_err(|e| e.to_string())
    }

    fn client(&self) -> Result<Client> {
        Ok(Client::new(
            &self.addr,
            self.ca.as_bytes(),
            self.cert.as_bytes(),
            self.key.as_bytes(),
        )?
        .with_server_name(&self.name)?
        .with_timeout(REQUEST_TIMEOUT))
    }
}

/// [`CLIENTS`] status clients of the node at `port`, each with a reader certificate of its own.
pub(super) fn clients(port: u16, name: &str, reuse: bool) -> Result<Vec<StatusClient>> {
    let pki = demo_pki();
    let read = |name: &str| -> Result<String> {
        fs::read_to_string(pki.join(name)).with_context(|| format!("reading {name}"))
    };
    let ca = read(slate_api::CA_CERT)?;
    let (client_ca, client_ca_key) = (
        read(slate_api::CLIENT_CA_CERT)?,
        read(slate_api::CLIENT_CA_KEY)?,
    );
    (0..CLIENTS)
        .map(|i| {
            let key = slate_api::generate_key_pem()?;
            let cert = slate_api::issue_client_cert(
                &client_ca,
                &client_ca_key,
                &key,
                Role::Reader,
                &format!("soak-client-{i}"),
                Duration::from_secs(24 * 3600),
            )?;
            let mut client = StatusClient {
                addr: format!("127.0.0.1:{port}"),
                name: name.to_owned(),
                ca: ca.clone(),
                cert,
                key,
                kept: None,
            };
            if reuse {
                client.kept = Some(client.client()?);
            }
            Ok(client)
        })
        .collect()
}

/// An error message with the client's address (`127.0.0.1:PORT`) taken out, so that the
/// same refusal counts as one kind.
pub(super) fn without_port(error: &str) -> String {
    match error.split_once("127.0.0.1:") {
        Some((before, after)) => {
            format!(
                "{before}the node{}",
                after.trim_start_matches(|c: char| c.is_ascii_digit())
            )
        }
        None => error.to_owned(),
    }
}

pub(super) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}
