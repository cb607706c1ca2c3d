//! bench-operator's operator replicas, each a process of its own (xtask started again with
//! the hidden `bench-operator-replica` task): so that its resident memory is the operator's
//! alone, read from `/proc/<pid>/status` beside ten thousand simulated nodes in the bench's
//! process, and so that a leader can be killed mid-rollout like a crashed machine.
//!
//! A replica prints one line per event on stdout, which the bench reads: `tick READ DECIDE
//! COMMIT ENCODE SEND NODES ORDERS ANSWERS GROUPING WAVE_ORDER VIEWS DECISIONS ON_CPU QUEUED`
//! (durations in microseconds) after each of its ticks as leader, and `log TEXT`
//! for each line of the operator's log.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use slate_api::Role;
use slate_operator::{EtcdState, LeaderConfig, Operator, ReleaseSource, TickTiming};
use slate_release::{Channel, Release, ReleaseIndex};

pub const TICK: Duration = Duration::from_secs(1);

/// A release index that never changes (the benches' fleets roll out to fixed versions).
pub(crate) struct Fixed(pub(crate) ReleaseIndex);

impl ReleaseSource for Fixed {
    fn index(&self) -> Result<ReleaseIndex, String> {
        Ok(self.0.clone())
    }
}

pub(crate) fn release(version: &str) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{}", "cd".repeat(32)),
        created: "2026-12-01T00:00:00Z".into(),
        channel: Channel::Stable,
        official: true,
        min_from: None,
        yanked: None,
    }
}

/// The hidden task: one replica, releases 1 and 2 published, until killed.
pub fn serve(etcd: &str, listen: SocketAddr, certs: &Path, name: &str) -> Result<()> {
    let endpoints: Vec<String> = etcd.split(',').map(str::to_owned).collect();
    let state = Arc::new(EtcdState::connect(&endpoints, "/slate/operator/")?);
    let mut index = ReleaseIndex::default();
    index.publish(release("1"))?;
    index.publish(release("2"))?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let say = {
        let out = out.clone();
        move |line: String| {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    let said = say.clone();
    let op = Operator {
        state,
        leader: LeaderConfig {
            name: name.into(),
            repository: "registry.invalid/slate/os".into(),
            tick: TICK,
            stale_after: Duration::from_secs(90),
            lease_ttl: Duration::from_secs(5),
            release_refresh: Duration::from_secs(10),
            parallel_orders: 32,
            // `slate fleet operator`'s default: nothing is old enough to prune during a run.
            event_retention: Duration::from_secs(7 * 24 * 3600),
        },
        listen,
        certs: certs.to_owned(),
        releases: Arc::new(Fixed(index)),
        log: Arc::new(move |line: &str| said(format!("log {line}"))),
        observer: Some(Arc::new(move |t: &TickTiming| {
            let us = |d: Duration| d.as_micros();
            let parts: Vec<String> = t.parts.iter().map(|d| us(*d).to_string()).collect();
            say(format!(
                "tick {} {} {} {} {} {} {} {} {} {} {}",
                us(t.read),
                us(t.decide),
                us(t.commit),
                us(t.encode),
                us(t.send),
                t.nodes,
                t.orders,
                t.answers,
                parts.join(" "),
                us(t.on_cpu),
                us(t.queued),
            ));
        })),
    };
    static STOP: AtomicBool = AtomicBool::new(false);
    slate_operator::run(op, &STOP).map_err(anyhow::Error::msg)
}

/// What the bench has heard from a replica.
#[derive(Default)]
pub struct Heard {
    /// Each tick as leader and when it was reported.
    pub ticks: Vec<(Instant, TickTiming)>,
    /// When the replica said it leads.
    pub leads_since: Option<Instant>,
    /// Its last log lines (for an error message).
    pub last_lines: Vec<String>,
}

/// A replica process.
pub struct Replica {
    pub name: String,
    pub addr: SocketAddr,
    child: Child,
    pub heard: Arc<Mutex<Heard>>,
}

impl Replica {
    pub fn start(etcd: &[String], certs: &Path, name: &str) -> Result<Replica> {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench-operator-replica", "--etcd", &etcd.join(",")])
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--certs")
            .arg(certs)
            .args(["--name", name])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .context("starting an operator replica")?;
        let stdout = child.stdout.take().context("the replica's stdout")?;
        let heard: Arc<Mutex<Heard>> = Arc::default();
        let into = heard.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut heard = into.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(rest) = line.strip_prefix("tick ") {
                    if let Some(t) = parse_tick(rest) {
                        heard.ticks.push((Instant::now(), t));
                    }
                } else if let Some(rest) = line.strip_prefix("log ") {
                    if rest.ends_with(" is the leader") {
                        heard.leads_since = Some(Instant::now());
                    }
                    if heard.last_lines.len() >= 20 {
                        heard.last_lines.remove(0);
                    }
                    heard.last_lines.push(rest.to_owned());
                }
            }
        });
        Ok(Replica {
            name: name.to_owned(),
            addr,
            child,
            heard,
        })
    }

    /// Waits until the replica says it leads.
    pub fn wait_leading(&mut self, within: Duration) -> Result<Instant> {
        let since = Instant::now();
        loop {
            if let Some(at) = self.heard.lock().unwrap().leads_since {
                return Ok(at);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "replica {} ended ({status}): {:?}",
                    self.name,
                    self.heard.lock().unwrap().last_lines
                );
            }
            if since.elapsed() > within {
                bail!("replica {} did not lead within {within:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `VmRSS` (now) and `VmHWM` (the most so far) in MiB.
    pub fn memory_mib(&self) -> Result<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> Result<f64> {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .with_context(|| format!("no {name} in /proc/{}/status", self.child.id()))?;
            let kib: f64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .context("a memory figure")?;
            Ok(kib / 1024.0)
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// The TLS handshakes its API completed so far, full and resumed (its `/metrics`, read
    /// with the reader certificate of `certs`).
    pub fn handshakes(&self, certs: &Path) -> Result<(u64, u64)> {
        let reader = slate_api::Client::from_dir(&self.addr.to_string(), certs, Role::Reader)?;
        let text = reader.get_text("/metrics")?;
        let count = |kind: &str| -> Result<u64> {
            let series = format!("slate_api_tls_handshakes_total{{kind=\"{kind}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .and_then(|v| v.trim().parse().ok())
                .with_context(|| format!("no {series}in replica {}'s /metrics", self.name))
        };
        Ok((count("full")?, count("resumed")?))
    }

    /// SIGKILL, as a machine that dies.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

fn parse_tick(rest: &str) -> Option<TickTiming> {
    let v: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [read, decide, commit, encode, send, nodes, orders, answers, grouping, waves, views, decisions, on_cpu, queued] =
        v[..]
    else {
        return None;
    };
    let us = Duration::from_micros;
    Some(TickTiming {
        read: us(read),
        decide: us(decide),
        commit: us(commit),
        encode: us(encode),
        send: us(send),
        nodes: nodes as usize,
        orders: orders as usize,
        answers: answers as usize,
        parts: [us(grouping), us(waves), us(views), us(decisions)],
        on_cpu: us(on_cpu),
        queued: us(queued),
    })
}
