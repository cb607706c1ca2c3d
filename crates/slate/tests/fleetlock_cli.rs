//! `slate fleetlock serve | status | release` end to end: the built binary serving real HTTP on
//! 127.0.0.1, spoken to with hand-written HTTP/1.1 requests (so that a request can be wrong in
//! exactly one way), over the file store in a temporary directory.

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ok, s, slate};
use slate_testkit::fleetlock::{check_exclusion, Hold};

/// A `slate fleetlock serve` process, killed (SIGKILL: a crash, not a shutdown) on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(store: &Path, groups: &[&str], log: &Path) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_slate"));
        cmd.args([
            "fleetlock",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            s(store),
        ]);
        for g in groups {
            cmd.args(["--group", g]);
        }
        // The log goes to a file: a pipe nobody reads would fill and stall the server.
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
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!(
                    "no address in {line:?}; log: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            });
        Server {
            child,
            addr,
            log: log.to_path_buf(),
        }
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer: status, headers (lower-case names), body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The error body's kind and value; fails unless the body is exactly those two strings.
    fn kind_value(&self) -> (String, String) {
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 2, "{self:?}");
        (
            obj["kind"].as_str().unwrap().to_owned(),
            obj["value"].as_str().unwrap().to_owned(),
        )
    }
}

/// One request on its own connection.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    protocol: Option<&str>,
    body: &[u8],
) -> Reply {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(value) = protocol {
        head.push_str(&format!("fleet-lock-protocol: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).unwrap();
    // The server may answer (and close) before taking a body it refuses anyway.
    let _ = tcp.write_all(body);
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a whole HTTP answer");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect::<Vec<_>>();
    let reply = Reply {
        status,
        headers,
        body: body.to_owned(),
    };
    let len: usize = reply.header("content-length").unwrap().parse().unwrap();
    assert_eq!(len, reply.body.len(), "{reply:?}");
    reply
}

fn body(id: &str, group: &str) -> Vec<u8> {
    format!(r#"{{"client_params":{{"id":"{id}","group":"{group}"}}}}"#).into_bytes()
}

/// What zincati sends: pretty-printed.
fn zincati_body(id: &str, group: &str) -> Vec<u8> {
    format!(
        "{{\n  \"client_params\": {{\n    \"id\": \"{id}\",\n    \"group\": \"{group}\"\n  }}\n}}"
    )
    .into_bytes()
}

fn lock(addr: SocketAddr, id: &str, group: &str) -> Reply {
    request(
        addr,
        "POST",
        "/v1/pre-reboot",
        Some("true"),
        &body(id, group),
    )
}

fn unlock(addr: SocketAddr, id: &str, group: &str) -> Reply {
    request(
        addr,
        "POST",
        "/v1/steady-state",
        Some("true"),
        &body(id, group),
    )
}

fn assert_ok(reply: &Reply) {
    assert_eq!((reply.status, reply.body.as_str()), (200, ""), "{reply:?}");
}

/// `slate fleetlock status --output json`: group → (total_slots, holders).
fn holders(store: &Path) -> Vec<(String, u64, Vec<String>)> {
    let out = ok(&[
        "fleetlock",
        "status",
        "--store",
        s(store),
        "--output",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["group"].as_str().unwrap().to_owned(),
                g["total_slots"].as_u64().unwrap(),
                g["holders"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect()
}

fn held(store: &Path, group: &str) -> Vec<String> {
    holders(store)
        .into_iter()
        .find(|(g, _, _)| g == group)
        .map(|(_, _, h)| h)
        .unwrap_or_default()
}

#[test]
fn every_protocol_row_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = Server::start(&store, &["default=1", "workers=2"], &dir.path().join("log"));
    let addr = server.addr;
    let lock_path = "/v1/pre-reboot";
    let invalid = |reply: Reply, text: &str| {
        assert_eq!(reply.status, 400, "{reply:?}");
        let (kind, value) = reply.kind_value();
        assert_eq!(kind, "invalid_client_identity");
        assert!(
            value.starts_with("failed to validate client identity: "),
            "{value}"
        );
        assert!(value.contains(text), "{value}");
    };

    // Header: missing, `false`, wrong case.
    invalid(
        request(addr, "POST", lock_path, None, &body("a", "default")),
        "wrong 'fleet-lock-protocol' header",
    );
    invalid(
        request(
            addr,
            "POST",
            lock_path,
            Some("false"),
            &body("a", "default"),
        ),
        "wrong 'fleet-lock-protocol' header",
    );
    invalid(
        request(addr, "POST", lock_path, Some("True"), &body("a", "default")),
        "wrong 'fleet-lock-protocol' header",
    );
    // Body.
    invalid(
        request(
            addr,
            "POST",
            lock_path,
            Some("true"),
            b"{\"client_params\":",
        ),
        "not a FleetLock request",
    );
    invalid(
        request(addr, "POST", lock_path, Some("true"), b""),
        "not a FleetLock request",
    );
    invalid(lock(addr, "", "default"), "empty client ID");
    invalid(lock(addr, "a", ""), "empty client group");
    invalid(lock(addr, "a", "a/b"), "must match ^[a-zA-Z0-9.-]+$");
    invalid(
        request(
            addr,
            "POST",
            lock_path,
            Some("true"),
            br#"{"client_params":{"id":"a"}}"#,
        ),
        "missing field `group`",
    );
    let big = request(addr, "POST", lock_path, Some("true"), &vec![b' '; 9000]);
    assert_eq!(
        (big.status, big.kind_value().0.as_str()),
        (413, "body_too_large")
    );

    let unknown = lock(addr, "a", "nope");
    assert_eq!(unknown.status, 400);
    assert_eq!(
        unknown.kind_value(),
        ("unknown_group".into(), "unknown group \"nope\"".into())
    );

    let get = request(addr, "GET", lock_path, Some("true"), b"");
    assert_eq!((get.status, get.header("allow")), (405, Some("POST")));
    assert_eq!(get.kind_value().0, "method_not_allowed");
    let put = request(
        addr,
        "PUT",
        "/v1/steady-state",
        Some("true"),
        &body("a", "default"),
    );
    assert_eq!(put.status, 405);
    for path in ["/", "/v1/pre-reboot/", "/v1/unlock", "/base/v1/pre-reboot"] {
        let r = request(addr, "POST", path, Some("true"), &body("a", "default"));
        assert_eq!(
            (r.status, r.kind_value().0.as_str()),
            (404, "not_found"),
            "{path}"
        );
    }
    assert!(
        holders(&store).is_empty(),
        "no refused request wrote anything"
    );

    // Recursive lock: 200 twice, one holder. zincati's pretty body.
    let zincati = zincati_body("de35106b6ec24688b63afddaa156679b", "default");
    for _ in 0..2 {
        assert_ok(&request(addr, "POST", lock_path, Some("true"), &zincati));
    }
    assert_eq!(
        held(&store, "default"),
        ["de35106b6ec24688b63afddaa156679b"]
    );
    // Full: airlock's kind and text.
    let full = lock(addr, "other", "default");
    assert_eq!(full.status, 500);
    assert_eq!(
        full.kind_value(),
        (
            "failed_lock".into(),
            "all 1 semaphore slots currently locked".into()
        )
    );
    // Unlock by a non-holder: 200, holder unchanged; ids are case-sensitive.
    assert_ok(&unlock(addr, "other", "default"));
    assert_ok(&unlock(addr, "DE35106B6EC24688B63AFDDAA156679B", "default"));
    assert_eq!(
        held(&store, "default"),
        ["de35106b6ec24688b63afddaa156679b"]
    );
    // Unlock: 200, and again 200.
    assert_ok(&request(
        addr,
        "POST",
        "/v1/steady-state",
        Some("true"),
        &zincati,
    ));
    assert_ok(&request(
        addr,
        "POST",
        "/v1/steady-state",
        Some("true"),
        &zincati,
    ));
    assert!(held(&store, "default").is_empty());
    assert_ok(&lock(addr, "other", "default"));

    // Groups are separate semaphores with their own slots.
    assert_ok(&lock(addr, "w1", "workers"));
    assert_ok(&lock(addr, "w2", "workers"));
    assert_eq!(lock(addr, "w3", "workers").status, 500);
    assert_eq!(
        holders(&store),
        [
            ("default".into(), 1, vec!["other".into()]),
            ("workers".into(), 2, vec!["w1".into(), "w2".into()]),
        ]
    );
    let log = server.log();
    assert!(
        log.contains("lock workers/w3: all 2 semaphore slots currently locked -> 500"),
        "{log}"
    );
}

#[test]
fn status_and_release() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = Server::start(&store, &["default=1", "workers=2"], &dir.path().join("log"));
    let text = ok(&["fleetlock", "status", "--store", s(&store)]);
    assert!(text.starts_with("no groups in"), "{text}");
    assert_ok(&lock(server.addr, "node-a", "workers"));
    assert_ok(&lock(server.addr, "node-b", "default"));
    let text = ok(&["fleetlock", "status", "--store", s(&store)]);
    assert_eq!(
        text,
        "GROUP       HELD  HOLDERS\ndefault      1/1  node-b\nworkers      1/2  node-a\n"
    );

    let fails = |args: &[&str], text: &str| {
        let out = slate(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(text),
            "{args:?}: {err}"
        );
    };
    let st = s(&store);
    fails(
        &[
            "fleetlock",
            "release",
            "--store",
            st,
            "--group",
            "nope",
            "--id",
            "node-b",
        ],
        "group nope has no semaphore",
    );
    fails(
        &[
            "fleetlock",
            "release",
            "--store",
            st,
            "--group",
            "default",
            "--id",
            "node-a",
        ],
        "holds no slot in group default (holders: node-b)",
    );
    fails(
        &[
            "fleetlock",
            "release",
            "--store",
            st,
            "--group",
            "a/b",
            "--id",
            "x",
        ],
        "must match",
    );
    fails(
        &[
            "fleetlock",
            "status",
            "--store",
            s(&dir.path().join("missing")),
        ],
        "opening the store",
    );

    let dry = ok(&[
        "fleetlock",
        "release",
        "--store",
        st,
        "--group",
        "default",
        "--id",
        "node-b",
        "--dry-run",
    ]);
    assert_eq!(
        dry,
        "would release node-b from group default (1/1 slots held)\n"
    );
    assert_eq!(
        lock(server.addr, "node-c", "default").status,
        500,
        "a dry run changes nothing"
    );
    let done = ok(&[
        "fleetlock",
        "release",
        "--store",
        st,
        "--group",
        "default",
        "--id",
        "node-b",
    ]);
    assert_eq!(
        done,
        "released node-b from group default (0/1 slots held)\n"
    );
    // The running server sees the admin's change.
    assert_ok(&lock(server.addr, "node-c", "default"));
    assert_eq!(held(&store, "default"), ["node-c"]);
}

#[test]
fn a_restarted_server_keeps_its_holders() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let log = dir.path().join("log");
    let server = Server::start(&store, &[], &log);
    assert_ok(&lock(server.addr, "node-a", "default"));
    server.kill();

    // A crash loses nothing: node-a still holds the only slot.
    let server = Server::start(&store, &[], &log);
    let full = lock(server.addr, "node-b", "default");
    assert_eq!(
        (full.status, full.kind_value().0.as_str()),
        (500, "failed_lock")
    );
    assert_eq!(held(&store, "default"), ["node-a"]);
    // Until the holder unlocks (as zincati does on every start)…
    assert_ok(&unlock(server.addr, "node-a", "default"));
    assert_ok(&lock(server.addr, "node-b", "default"));
    server.kill();

    // …or an admin releases it. A restart with more slots applies them at the next lock.
    let server = Server::start(&store, &["default=2"], &log);
    assert_ok(&lock(server.addr, "node-c", "default"));
    assert_eq!(
        holders(&store),
        [("default".into(), 2, vec!["node-b".into(), "node-c".into()])]
    );
    server.kill();
    let server = Server::start(&store, &["workers=1"], &log);
    assert!(
        server
            .log()
            .contains("group default is not configured but still has 2 holder(s): node-b, node-c"),
        "{}",
        server.log()
    );
    assert_eq!(
        lock(server.addr, "node-d", "default").status,
        400,
        "unknown group now"
    );
    ok(&[
        "fleetlock",
        "release",
        "--store",
        s(&store),
        "--group",
        "default",
        "--id",
        "node-b",
    ]);
    assert_eq!(held(&store, "default"), ["node-c"]);
}

#[test]
fn a_corrupt_record_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = Server::start(&store, &[], &dir.path().join("log"));
    // Two holders in a one-slot semaphore: not a state slate writes.
    let bad = "{\"version\":4,\"semaphore\":{\"total_slots\":1,\"holders\":[\"a\",\"b\"]}}\n";
    std::fs::write(store.join("default.json"), bad).unwrap();
    for reply in [
        lock(server.addr, "a", "default"),
        unlock(server.addr, "a", "default"),
    ] {
        assert_eq!(reply.status, 500, "{reply:?}");
        let (kind, value) = reply.kind_value();
        assert_eq!(kind, "failed_sem_init");
        assert!(value.contains("2 holders but only 1 slots"), "{value}");
    }
    let out = slate(&["fleetlock", "status", "--store", s(&store)]);
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read_to_string(store.join("default.json")).unwrap(),
        bad
    );
}

/// `clients` threads race for the 2 slots of `race`, spread over `servers` servers sharing one
/// store. Each client's observed holding interval (200 received → unlock sent) lies inside its
/// real one, so more than 2 overlapping observed intervals would prove the server admitted a
/// third holder.
fn race(servers: usize, clients: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let servers: Vec<Server> = (0..servers)
        .map(|i| Server::start(&store, &["race=2"], &dir.path().join(format!("log{i}"))))
        .collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let events = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let threads: Vec<_> = (0..clients)
        .map(|n| {
            let events = events.clone();
            let addr = addrs[n % addrs.len()];
            std::thread::spawn(move || {
                let id = format!("node-{n:02}");
                let mut tries = 0u32;
                loop {
                    let r = lock(addr, &id, "race");
                    if r.status == 200 {
                        events.lock().unwrap().push(Hold::Acquired(n));
                        break;
                    }
                    let (kind, value) = r.kind_value();
                    assert_eq!((r.status, kind.as_str()), (500, "failed_lock"), "{value}");
                    assert!(Instant::now() < deadline, "{id} never got a slot");
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(2 + u64::from(tries % 5)));
                }
                std::thread::sleep(Duration::from_millis(15));
                events.lock().unwrap().push(Hold::Releasing(n));
                loop {
                    let r = unlock(addr, &id, "race");
                    if r.status == 200 {
                        break;
                    }
                    // Only a lost compare-and-swap race may fail an unlock.
                    assert_eq!(r.kind_value().1, "conflict on semaphore detected, aborting");
                    assert!(Instant::now() < deadline, "{id} could not unlock");
                }
                tries
            })
        })
        .collect();
    let retries: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();

    let events = events.lock().unwrap().clone();
    let most = check_exclusion(&events, clients, 2);
    assert_eq!(holders(&store), [("race".into(), 2, vec![])]);
    // Each id was admitted exactly once, by whichever server it spoke to.
    let locked: usize = servers
        .iter()
        .map(|s| s.log().matches(": locked (").count())
        .sum();
    assert_eq!(locked, clients);
    eprintln!(
        "{clients} clients over {} server(s): {retries} refused lock attempts, at most {most} holders",
        servers.len()
    );
}

#[test]
fn fifty_clients_race_for_two_slots() {
    race(1, 50);
}

#[test]
fn two_servers_share_one_store() {
    race(2, 50);
}

#[test]
fn a_stray_directory_is_skipped_by_name_and_disguised_ids_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = Server::start(&store, &["default=1"], &dir.path().join("log"));
    assert_ok(&lock(server.addr, "node-a", "default"));
    // The id reads "node-a" followed by a reversed tail: refused, never stored or printed.
    let disguised = lock(server.addr, "node-b\u{202E}a-edon", "default");
    assert_eq!(disguised.status, 400, "{disguised:?}");
    assert!(disguised.kind_value().1.contains("U+202E"), "{disguised:?}");
    std::fs::create_dir(store.join("old.json")).unwrap();
    std::fs::create_dir(store.join("backup")).unwrap();
    let out = slate(&["fleetlock", "status", "--store", s(&store)]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stdout,
        "GROUP       HELD  HOLDERS\ndefault      1/1  node-a\n"
    );
    assert!(
        stderr.contains(&format!(
            "warning: skipping {}: a directory, not a group record",
            store.join("old.json").display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("backup"), "{stderr}");
}
