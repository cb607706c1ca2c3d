//! `slate fleetlock serve | status | release --etcd` end to end: the built binary over a real
//! three-member etcd cluster on loopback (`slate_testkit::etcd`). A server SIGKILLed while
//! clients hammer it leaves a semaphore that agrees with what the clients were told, and the
//! next server carries on; a holder that never unlocks keeps its slot until an admin releases
//! it.

#![cfg(feature = "etcd")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ok, slate};
use slate_fleetlock::Semaphore;
use slate_testkit::etcd::{one_at_a_time as serial, three_members as cluster, EtcdCluster};
use slate_testkit::fleetlock::{Client, LOCK, UNLOCK};

/// `slate fleetlock serve --etcd …`, SIGKILLed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(etcd: &str, groups: &[&str], log: &Path) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_slate"));
        cmd.args([
            "fleetlock",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--etcd",
            etcd,
        ]);
        for g in groups {
            cmd.args(["--group", g]);
        }
        // A file, not a pipe: a pipe nobody reads would fill and stall the server.
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .expect("start slate fleetlock serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains(&format!("(etcd {etcd}, groups ")), "{line}");
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!("no address in {line:?}: {}", read(log))
            });
        Server {
            child,
            addr,
            log: log.to_owned(),
        }
    }

    /// SIGKILL: a crash, mid-request or not.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn log(&self) -> String {
        read(&self.log)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The group's value as etcdctl reads it (raw bytes: no slate code in between).
fn etcd_value(cluster: &EtcdCluster, group: &str) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints().join(",")))
        .args(["get", "--print-value-only"])
        .arg(format!("com.coreos.airlock/groups/{group}/v1/semaphore"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

/// `slate fleetlock status --etcd … --output json`: group → holders.
fn status_holders(etcd: &str) -> BTreeMap<String, Vec<String>> {
    let out = ok(&["fleetlock", "status", "--etcd", etcd, "--output", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let holders = g["holders"].as_array().unwrap().iter();
            (
                g["group"].as_str().unwrap().to_owned(),
                holders.map(|h| h.as_str().unwrap().to_owned()).collect(),
            )
        })
        .collect()
}

/// What one client did, in one order across all clients (pushed under one lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    LockSent,
    /// 200: from here the slot is surely held…
    Locked,
    /// …until this is pushed, right before the unlock is sent.
    UnlockSent,
    Unlocked,
    /// A lock refused without a write: every slot taken, or the swap lost 8 times.
    Refused,
    /// A 500 whose write may or may not have happened (the store failed mid-swap).
    Failed,
    /// Sent, and no answer came: the server died with the request.
    NoAnswer,
    /// The test's mark: nothing is sent after it until the next server runs.
    Paused,
}

/// What the clients and the test share.
#[derive(Debug)]
struct Shared {
    addr: Mutex<SocketAddr>,
    log: Mutex<Vec<(usize, Step)>>,
    paused: AtomicBool,
    finish: AtomicBool,
}

impl Shared {
    fn push(&self, n: usize, step: Step) {
        self.log.lock().unwrap().push((n, step));
    }

    /// Records `sent` and answers `true`, unless sending is paused. Checked and pushed under
    /// the log's lock, so no request is sent after the `Paused` mark.
    fn may_send(&self, n: usize, sent: Step) -> bool {
        let mut log = self.log.lock().unwrap();
        if self.paused.load(Ordering::SeqCst) {
            return false;
        }
        log.push((n, sent));
        true
    }

    fn count(&self, step: Step) -> usize {
        let log = self.log.lock().unwrap();
        log.iter().filter(|(_, s)| *s == step).count()
    }
}

/// Client `n`: rounds of lock (until 200), hold 20 ms, unlock (until 200), until `finish` is
/// set after a round. The server's address is read before every request: it changes when a
/// new server takes over.
fn client(n: usize, shared: &Shared) {
    let id = format!("node-{n:02}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut c = Client::new(*shared.addr.lock().unwrap());
    let mut call = |path: &str, sent: Step, done: Step| loop {
        assert!(Instant::now() < deadline, "{id} was not served");
        let now = *shared.addr.lock().unwrap();
        if c.addr() != now {
            c = Client::new(now);
        }
        if !shared.may_send(n, sent) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let step = match c.post(path, &id, "race") {
            Ok((200, _)) => return shared.push(n, done),
            Ok((500, body))
                if body.contains("all 2 semaphore slots") || body.contains("conflict") =>
            {
                Step::Refused
            }
            Ok((500, body)) if body.contains("failed_") => Step::Failed,
            Ok(other) => panic!("{id}: {other:?}"),
            Err(_) => Step::NoAnswer,
        };
        shared.push(n, step);
        std::thread::sleep(Duration::from_millis(2 + (n as u64 % 5)));
    };
    while !shared.finish.load(Ordering::SeqCst) {
        call(LOCK, Step::LockSent, Step::Locked);
        std::thread::sleep(Duration::from_millis(20));
        call(UNLOCK, Step::UnlockSent, Step::Unlocked);
    }
}

#[test]
fn a_server_killed_mid_swap_leaves_a_consistent_semaphore() {
    let _serial = serial();
    let Some(cluster) = cluster() else { return };
    let etcd = cluster.endpoints().join(",");
    let dir = tempfile::tempdir().unwrap();
    let mut first = Server::start(&etcd, &["race=2"], &dir.path().join("first.log"));
    let shared = Arc::new(Shared {
        addr: Mutex::new(first.addr),
        log: Mutex::default(),
        paused: AtomicBool::new(false),
        finish: AtomicBool::new(false),
    });
    let clients = 32;
    let threads: Vec<_> = (0..clients)
        .map(|n| {
            let shared = shared.clone();
            std::thread::spawn(move || client(n, &shared))
        })
        .collect();
    // Once 20 rounds are done and some client holds a slot it was told about (its last step
    // is the lock's 200), stop sending and kill at once: whatever is in flight is cut off
    // mid-way, some of it inside a compare-and-swap.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no progress: {}", first.log());
        let mut log = shared.log.lock().unwrap();
        let rounds = log.iter().filter(|(_, s)| *s == Step::Unlocked).count();
        let told = (0..clients).any(|n| {
            log.iter().rev().find(|(c, _)| *c == n).map(|(_, s)| *s) == Some(Step::Locked)
        });
        if rounds >= 20 && told {
            shared.paused.store(true, Ordering::SeqCst);
            log.push((usize::MAX, Step::Paused));
            break;
        }
        drop(log);
        std::thread::sleep(Duration::from_millis(1));
    }
    first.kill();
    // What the dead server had already sent to etcd lands within milliseconds.
    std::thread::sleep(Duration::from_millis(500));
    let seen = shared.log.lock().unwrap().clone();

    // The value is whole and valid: strict JSON, sorted unique holders, no more than 2.
    let value = etcd_value(&cluster, "race");
    let sem = Semaphore::parse(value.as_bytes()).unwrap_or_else(|e| panic!("{value}: {e}"));
    assert_eq!(sem.total_slots(), 2);
    let holders: BTreeSet<usize> = sem
        .holders()
        .iter()
        .map(|h| h.strip_prefix("node-").unwrap().parse().unwrap())
        .collect();
    // It agrees with what each client was last told: a 200 for its lock means it holds (a 200
    // is durable); a 200 for its unlock, or a refusal, means it does not; no answer (or a
    // failed write) may go either way: committed, and never said.
    let mut must = BTreeSet::new();
    let mut may = BTreeSet::new();
    for n in 0..clients {
        let last = seen.iter().rev().find(|(c, _)| *c == n).map(|(_, s)| *s);
        match last {
            Some(Step::Locked) => {
                must.insert(n);
                may.insert(n);
            }
            Some(Step::NoAnswer | Step::Failed) => {
                may.insert(n);
            }
            Some(Step::Unlocked | Step::Refused) => {}
            other => panic!("client {n} still waits for an answer: {other:?}"),
        }
    }
    assert!(
        must.is_subset(&holders),
        "told 200: {must:?}, holders: {holders:?}"
    );
    assert!(
        holders.is_subset(&may),
        "holders: {holders:?}, may hold: {may:?}"
    );
    // The kill did cut requests off (nothing else fails before it).
    let cut = seen.iter().filter(|(_, s)| *s == Step::NoAnswer).count();
    assert!(cut > 0, "no request was in flight at the kill");

    // A second server carries on from that value: every client finishes its round.
    let second = Server::start(&etcd, &["race=2"], &dir.path().join("second.log"));
    *shared.addr.lock().unwrap() = second.addr;
    shared.finish.store(true, Ordering::SeqCst);
    shared.paused.store(false, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        status_holders(&etcd),
        BTreeMap::from([("race".to_owned(), vec![])])
    );
    // Never more than 2 observed holders, before, across and after the crash.
    let mut holding = BTreeSet::new();
    for (n, step) in shared.log.lock().unwrap().iter() {
        match step {
            Step::Locked => assert!(holding.insert(*n)),
            Step::UnlockSent => {
                holding.remove(n);
            }
            _ => {}
        }
        assert!(holding.len() <= 2, "{holding:?}");
    }
    assert!(second.log().contains("unlock race/"), "{}", second.log());
    eprintln!(
        "killed after {} locks with {cut} requests in flight: holders {holders:?}, told 200: \
         {must:?}, unknown: {:?}; {} locks in all",
        seen.iter().filter(|(_, s)| *s == Step::Locked).count(),
        may.difference(&must).collect::<Vec<_>>(),
        shared.count(Step::Locked)
    );
}

#[test]
fn a_holder_that_never_unlocks_keeps_its_slot_until_released() {
    let _serial = serial();
    let Some(cluster) = cluster() else { return };
    let etcd = cluster.endpoints().join(",");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut server = Server::start(&etcd, &["workers=1"], &log);
    let mut c = Client::new(server.addr);
    assert_eq!(
        c.post(LOCK, "stuck", "workers").unwrap(),
        (200, String::new())
    );
    // The node fails its update and never comes back; the server restarts meanwhile.
    server.kill();
    let server = Server::start(&etcd, &["workers=1"], &log);
    let mut c = Client::new(server.addr);
    let full = r#"{"kind":"failed_lock","value":"all 1 semaphore slots currently locked"}"#;
    for _ in 0..3 {
        assert_eq!(
            c.post(LOCK, "next", "workers").unwrap(),
            (500, full.to_owned())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = ok(&["fleetlock", "status", "--etcd", &etcd]);
    assert_eq!(text, "GROUP       HELD  HOLDERS\nworkers      1/1  stuck\n");

    let release = |id: &str, extra: &[&str]| {
        let mut args = vec![
            "fleetlock",
            "release",
            "--etcd",
            &etcd,
            "--group",
            "workers",
        ];
        args.extend(["--id", id]);
        args.extend(extra);
        slate(&args)
    };
    let out = release("next", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("holds no slot in group workers (holders: stuck)"),
        "{err}"
    );
    let out = release("stuck", &["--dry-run"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "would release stuck from group workers (1/1 slots held)\n"
    );
    assert_eq!(
        c.post(LOCK, "next", "workers").unwrap().0,
        500,
        "a dry run changes nothing"
    );
    let out = release("stuck", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released stuck from group workers (0/1 slots held)\n"
    );
    assert_eq!(
        c.post(LOCK, "next", "workers").unwrap(),
        (200, String::new())
    );
    assert_eq!(
        etcd_value(&cluster, "workers"),
        r#"{"total_slots":1,"holders":["next"]}"#
    );

    // The file store and etcd are one or the other.
    let out = slate(&["fleetlock", "status", "--store", "/tmp", "--etcd", &etcd]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot be used with"),
        "{err}"
    );
    let out = slate(&[
        "fleetlock",
        "release",
        "--etcd",
        &etcd,
        "--group",
        "nope",
        "--id",
        "x",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "group nope has no semaphore in etcd {etcd} (groups: workers)"
        )),
        "{err}"
    );
}
