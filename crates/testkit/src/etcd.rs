//! A real etcd cluster on loopback, for the FleetLock etcd tests and benchmark: N members of
//! Debian's `etcd` (etcd-server), each on its own free client and peer port, data and logs in a
//! temporary directory. Members can be killed (SIGKILL: a crash) and restarted, and the cluster
//! asked who leads. Every child is killed when the cluster is dropped; a drop during a panic
//! first prints the tail of each member's log, so that a failed test shows what etcd did.
//!
//! ```no_run
//! # fn t() -> Result<(), slate_testkit::etcd::EtcdError> {
//! if !slate_testkit::etcd::require_etcd() {
//!     return Ok(());
//! }
//! let cluster = slate_testkit::etcd::EtcdCluster::start(3)?;
//! let endpoints = cluster.endpoints(); // ["http://127.0.0.1:PORT", ...]
//! # Ok(()) }
//! ```
//!
//! Elections are fast (heartbeat 50 ms, election timeout 500 ms), so a test can kill the
//! leader and see a new one within about a second. The ports are chosen free when the cluster
//! starts; a system etcd on 2379/2380 never matters.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::{find_tool, require_tool};

/// How long a member (or the whole cluster) may take to answer after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of each log a failure shows.
const LOG_TAIL_BYTES: u64 = 4096;
/// Attempts at starting a cluster: a port found free may be taken by someone else before
/// etcd binds it.
const START_ATTEMPTS: usize = 3;

#[derive(Debug, Error)]
pub enum EtcdError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The cluster or a member did not get ready; the text carries the logs' tails.
    #[error("{0}")]
    NotReady(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EtcdError {
    let what = what.into();
    move |source| EtcdError::Io { what, source }
}

/// One cluster at a time per test binary: three etcd members per test are plenty for a small
/// machine. Hold the guard for the whole test.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running 3-member cluster, or `None` when etcd is missing outside CI ([`require_etcd`]).
pub fn three_members() -> Option<EtcdCluster> {
    if !require_etcd() {
        return None;
    }
    Some(EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}")))
}

/// `etcd` and `etcdctl` are installed; under `CI=true` their absence fails the test.
#[must_use = "the test must return when its prerequisite is missing"]
#[track_caller]
pub fn require_etcd() -> bool {
    require_tool("etcd") && require_tool("etcdctl")
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// A running cluster; see the module documentation.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    // Last: removed after the children are gone (fields drop in order, after `Drop::drop`).
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `members` members and waits until every one answers a health check (a quorum
    /// read through raft, so a leader exists too).
    pub fn start(members: usize) -> Result<Self, EtcdError> {
        assert!(members > 0, "a cluster has members");
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let mut cluster = Self::spawn_all(members)?;
            match cluster.wait_ready(&(0..members).collect::<Vec<_>>()) {
                Ok(()) => return Ok(cluster),
                Err(e) => {
                    let taken = (0..members)
                        .any(|i| cluster.log_tail(i).contains("address already in use"));
                    if !taken {
                        return Err(e);
                    }
                    // Someone took a port between our probe and etcd's bind: new ports.
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| EtcdError::NotReady("no attempt made".into())))
    }

    fn spawn_all(count: usize) -> Result<Self, EtcdError> {
        let dir = scratch_dir()?;
        // Ports are probed all at once (every probe socket open together) so no two coincide.
        let probes = (0..2 * count)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("finding free loopback ports"))?;
        let ports = probes
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("finding free loopback ports"))?;
        drop(probes);
        let members: Vec<Member> = (0..count)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "slate-test-{}-{}",
            std::process::id(),
            ports.first().copied().unwrap_or_default()
        );
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            token,
            dir,
        };
        for i in 0..count {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), EtcdError> {
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(io(format!("opening {}", m.log.display())))?;
        let log2 = log
            .try_clone()
            .map_err(io(format!("opening {}", m.log.display())))?;
        let etcd = find_tool("etcd").unwrap_or_else(|| PathBuf::from("etcd"));
        let child = Command::new(&etcd)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &m.client_url()])
            .args(["--advertise-client-urls", &m.client_url()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-advertise-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", &self.initial_cluster])
            // Ignored once the data directory exists (a restart rejoins as itself).
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            // Fast elections: a killed leader is replaced within about a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            // Go's runtime would otherwise size itself to every core of a shared machine.
            .env("GOMAXPROCS", "2")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(io(format!(
                "starting {} ({})",
                etcd.display(),
                crate::INSTALL_DEPS
            )))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// The client URLs of every member, running or not, in member order: what a client is
    /// configured with.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].client_url()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// SIGKILLs member `i` and reaps it: a crash, no goodbye to its peers.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory and ports, and waits until it answers.
    pub fn restart(&mut self, i: usize) -> Result<(), EtcdError> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_ready(&[i])
    }

    /// The index of the member that leads, as the running members report it (waiting up to
    /// 30 s for them to agree on one that is running).
    pub fn leader(&self) -> Result<usize, EtcdError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.status() {
                Ok(statuses) => {
                    let leaders: Vec<u64> = statuses.iter().map(|s| s.leader).collect();
                    let agreed = leaders
                        .first()
                        .filter(|l| **l != 0 && leaders.iter().all(|x| x == *l));
                    if let Some(&leader) = agreed {
                        if let Some(s) = statuses.iter().find(|s| s.member_id == leader) {
                            return Ok(s.index);
                        }
                    }
                    last = format!("leaders reported: {leaders:?}");
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(EtcdError::NotReady(format!(
            "no agreed leader among the running members: {last}\n{}",
            self.logs()
        )))
    }

    /// `etcdctl endpoint status` of the running members.
    fn status(&self) -> Result<Vec<Status>, String> {
        let running: Vec<usize> = (0..self.len()).filter(|i| self.is_running(*i)).collect();
        let endpoints: Vec<String> = running.iter().map(|i| self.endpoint(*i)).collect();
        let out = etcdctl(&endpoints, &["endpoint", "status", "-w", "json"])?;
        let value: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| format!("etcdctl endpoint status: {e}: {out}"))?;
        let entries = value
            .as_array()
            .ok_or_else(|| format!("not a list: {out}"))?;
        entries
            .iter()
            .map(|entry| {
                let endpoint = entry["Endpoint"].as_str().unwrap_or_default();
                let index = self
                    .members
                    .iter()
                    .position(|m| m.client_url() == endpoint)
                    .ok_or_else(|| format!("unknown endpoint in {entry}"))?;
                let field =
                    |v: &serde_json::Value| v.as_u64().ok_or_else(|| format!("no ids in {entry}"));
                Ok(Status {
                    index,
                    member_id: field(&entry["Status"]["header"]["member_id"])?,
                    leader: field(&entry["Status"]["leader"])?,
                })
            })
            .collect()
    }

    /// Waits until every member in `which` answers `etcdctl endpoint health` (a linearizable
    /// read: the member is connected to a leader).
    fn wait_ready(&mut self, which: &[usize]) -> Result<(), EtcdError> {
        let endpoints: Vec<String> = which.iter().map(|i| self.endpoint(*i)).collect();
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            for &i in which {
                let exited = match self.members[i].child.as_mut() {
                    Some(child) => child.try_wait().map_err(io("waiting for etcd"))?,
                    None => None,
                };
                if let Some(status) = exited {
                    self.members[i].child = None;
                    return Err(EtcdError::NotReady(format!(
                        "etcd member {i} exited ({status})\n{}",
                        self.logs()
                    )));
                }
            }
            match etcdctl(&endpoints, &["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(EtcdError::NotReady(format!(
            "etcd members {which:?} not healthy after {READY_TIMEOUT:?}: {last}\n{}",
            self.logs()
        )))
    }

    /// The last few KiB of member `i`'s log.
    pub fn log_tail(&self, i: usize) -> String {
        tail(&self.members[i].log)
    }

    /// Every member's log tail, headed by its name and URL.
    pub fn logs(&self) -> String {
        (0..self.len())
            .map(|i| {
                let m = &self.members[i];
                format!(
                    "--- etcd {} ({}, {}) log tail:\n{}",
                    m.name,
                    m.client_url(),
                    if m.child.is_some() {
                        "running"
                    } else {
                        "stopped"
                    },
                    self.log_tail(i)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Where the data directories and logs are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for i in 0..self.len() {
            self.kill(i);
        }
    }
}

#[derive(Debug)]
struct Status {
    index: usize,
    member_id: u64,
    leader: u64,
}

/// Data directories on tmpfs when there is one: etcd fsyncs every write, and on a shared disk
/// that alone can stretch a test past its time budget. The subject of these tests is the
/// protocol over a cluster, not the disk.
fn scratch_dir() -> Result<tempfile::TempDir, EtcdError> {
    let shm = Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix("slate-etcd-");
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return Ok(dir);
        }
    }
    builder
        .tempdir()
        .map_err(io("creating a temporary directory"))
}

/// Runs `etcdctl --endpoints … args`; its stdout, or its stderr as the error.
fn etcdctl(endpoints: &[String], args: &[&str]) -> Result<String, String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["--dial-timeout=2s", "--command-timeout=3s"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running etcdctl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "etcdctl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return "(no log)".into();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}
