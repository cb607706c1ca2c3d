//! The dashboard's pages over the operator API's mutual TLS, against a real three-member etcd
//! holding a small fleet with hostile text in it: everything from nodes and etcd is escaped;
//! hostile query parameters, a node that does not exist and a huge `limit` get clear answers
//! and bounded work; a reader sees the page and is refused the buttons' routes; a cross-site
//! post is refused even with an operator's certificate. Run with `CI=true` to make a missing
//! etcd or openssl a failure.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_api::{client_cert_file, client_key_file, Role};
use slate_operator::etcd::{EtcdState, Expect, DEFAULT_PREFIX};
use slate_operator::{state, OperatorMetrics, OperatorService, ReleaseSource};
use slate_release::{Channel, Release, ReleaseIndex};
use slate_rollout::{
    Event, EventKind, FailureReport, NodeProgress, NodeRecord, NodeReport, Rollout, RolloutState,
    Step, Strategy,
};

const HOSTILE: &str = "<script>alert('x')</script>";

struct Fixed(ReleaseIndex);

impl ReleaseSource for Fixed {
    fn index(&self) -> Result<ReleaseIndex, String> {
        Ok(self.0.clone())
    }
}

fn release(version: &str) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        created: "2026-12-01T00:00:00Z".into(),
        channel: Channel::Stable,
        official: true,
        min_from: None,
        yanked: None,
    }
}

fn report(id: &str, version: &str) -> NodeReport {
    NodeReport {
        sent_at_ms: 1,
        ..NodeReport::settled(id, "web", "127.0.0.1:9".into(), version)
    }
}

/// One request over mutual TLS with `role`'s certificate (`openssl s_client`, so that any
/// method, header and query can be sent as written): the status, the head and the body.
fn https(addr: &str, certs: &Path, role: Role, request: &str) -> (u16, String, String) {
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-verify_return_error",
            "-connect",
            addr,
        ])
        .arg("-CAfile")
        .arg(certs.join(slate_api::CA_CERT))
        .arg("-cert")
        .arg(certs.join(client_cert_file(role)))
        .arg("-key")
        .arg(certs.join(client_key_file(role)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(request.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_owned(), body.to_owned())
}

fn get(addr: &str, certs: &Path, role: Role, path: &str) -> (u16, String, String) {
    https(
        addr,
        certs,
        role,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}

fn post(addr: &str, certs: &Path, role: Role, path: &str, extra: &str) -> (u16, String) {
    let body = r#"{"group":"web","reason":"test"}"#;
    let (status, _, answer) = https(
        addr,
        certs,
        role,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    (status, answer)
}

#[test]
fn pages_escape_what_they_show_and_refuse_bad_input_clearly() {
    let _serial = slate_testkit::etcd::one_at_a_time();
    if !slate_testkit::require_tool("openssl") {
        return;
    }
    let Some(cluster) = slate_testkit::etcd::three_members() else {
        return;
    };
    let state = Arc::new(EtcdState::connect(&cluster.endpoints(), DEFAULT_PREFIX).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[]).unwrap();

    // A fleet of three: one with a hostile version and failure, in a paused rollout whose
    // events carry hostile text.
    let mut hostile = report("n-2", HOSTILE);
    hostile.last_failure = Some(FailureReport {
        version: "2".into(),
        reason: HOSTILE.into(),
    });
    for r in [report("n-1", "1"), hostile, report("n-3", "2")] {
        let record = NodeRecord {
            report: r,
            last_seen: slate_operator::leader::now_unix(),
        };
        state::put_node_if(&state, &record, Expect::Absent).unwrap();
    }
    state
        .commit(&slate_operator::etcd::Commit {
            puts: vec![(
                state::POLICIES.into(),
                b"[[policy]]\nname = \"fleet\"\nwaves = [{ percent = 50, soak = \"1s\" }, { percent = 100 }]\nfailure_budget = 2\n".to_vec(),
            )],
            ..Default::default()
        })
        .unwrap();
    let now = slate_operator::leader::now_unix();
    let mut nodes = BTreeMap::new();
    nodes.insert(
        "n-2".to_owned(),
        NodeProgress {
            from: Some("1".into()),
            started: Some(now),
            strategy: Strategy::InPlace,
            step: Step::Failed {
                at: now,
                reason: HOSTILE.into(),
            },
        },
    );
    let rollout = Rollout {
        id: 1,
        group: "web".into(),
        target: "2".into(),
        image: "registry.invalid/slate/os:2".into(),
        created: now - 10,
        state: RolloutState::Paused {
            reason: HOSTILE.into(),
            since: now,
        },
        nodes,
        recent_starts: Vec::new(),
        acknowledged: Default::default(),
    };
    let event = |n: usize| Event {
        at: now - 10 + n as u64,
        group: "web".into(),
        rollout: 1,
        node: Some("n-2".into()),
        kind: EventKind::Failed,
        detail: format!("{HOSTILE} #{n}"),
    };
    let mut changed = BTreeMap::new();
    changed.insert("web".to_owned(), rollout);
    let events: Vec<Event> = (0..30).map(event).collect();
    state::commit_rollouts(&state, None, &changed, &BTreeMap::new(), &events, 1).unwrap();

    let mut index = ReleaseIndex::default();
    index.publish(release("1")).unwrap();
    index.publish(release("2")).unwrap();
    let service = OperatorService {
        state: state.clone(),
        releases: Arc::new(Fixed(index)),
        repository: "registry.invalid/slate/os".into(),
        stale_after: Duration::from_secs(3600),
        log: Arc::new(|_| {}),
        heartbeats: Default::default(),
        metrics: Arc::new(OperatorMetrics::new()),
        // The nodes' endpoints lead nowhere: the node page says the node did not answer.
        node_certs: Some(certs.clone()),
        nodes: None,
    };
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = slate_api::ServerConfig::from_dir(listen, &certs).unwrap();
    let server = slate_api::spawn_service(config, Arc::new(service)).unwrap();
    let addr = listen.to_string();

    // The overview, as a reader: escaped, with its policy and its numbers.
    let (status, head, page) = get(&addr, &certs, Role::Reader, "/ui");
    assert_eq!(status, 200, "{page}");
    assert!(
        head.to_lowercase().contains("content-type: text/html"),
        "{head}"
    );
    assert!(head.contains("script-src 'sha256-"), "{head}");
    assert!(!page.contains(HOSTILE), "unescaped: {page}");
    assert!(
        page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        page.contains("data-field=\"state\">paused</span>"),
        "{page}"
    );
    assert!(page.contains("data-role=\"reader\""), "{page}");
    // One script, the page's own: nothing a node sent became one.
    assert_eq!(page.matches("<script>").count(), 1);

    // A huge limit is clamped, and the page says so; a small one is honoured.
    let start = Instant::now();
    let huge = "9".repeat(200);
    let (status, _, page) = get(&addr, &certs, Role::Reader, &format!("/ui?events={huge}"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("data-clamped=\"events\""), "{page}");
    assert!(page.contains("a page lists at most 1000"), "{page}");
    assert!(start.elapsed() < Duration::from_secs(10));
    let (status, _, page) = get(&addr, &certs, Role::Reader, "/ui?events=5");
    assert_eq!(status, 200, "{page}");
    let section = page.split("id=\"events\"").nth(1).unwrap();
    assert_eq!(
        section.matches("class=\"event-failed\"").count(),
        5,
        "{section}"
    );

    // Hostile query parameters: 400 with what was wrong, as an escaped page.
    for (path, want) in [
        ("/ui?x=1", "unknown parameter"),
        ("/ui?events=1&events=2", "more than once"),
        ("/ui?events=-1", "not a whole number"),
        ("/ui?events=0", "not a whole number"),
        ("/ui?nodes=%ff", "percent-encoded UTF-8"),
        ("/ui?group=..%2Fetc", "not a group name"),
        ("/ui?group=%3Cscript%3E", "not a group name"),
        ("/ui/node", "which node?"),
        ("/ui/node?id=%3Cb%3Ex", "is not a node id"),
        ("/ui/node?id=n-1&limit=5", "unknown parameter"),
    ] {
        let (status, _, page) = get(&addr, &certs, Role::Reader, path);
        assert_eq!(status, 400, "{path}: {page}");
        assert!(page.contains(want), "{path}: {page}");
        assert!(
            !page.contains("<script>") && !page.contains("<b>x"),
            "{path}: {page}"
        );
    }
    let long = format!("/ui?group={}", "a".repeat(3000));
    let (status, _, page) = get(&addr, &certs, Role::Reader, &long);
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("a page takes at most 2048"), "{page}");

    // What does not exist: 404, named.
    let (status, _, page) = get(&addr, &certs, Role::Reader, "/ui/node?id=no-such-node");
    assert_eq!(status, 404, "{page}");
    assert!(
        page.contains("no node &quot;no-such-node&quot; in the inventory"),
        "{page}"
    );
    let (status, _, page) = get(&addr, &certs, Role::Reader, "/ui?group=nothing");
    assert_eq!(status, 404, "{page}");
    assert!(page.contains("no group"), "{page}");

    // A node's page: its report, its failure, its events; the node itself is unreachable.
    let (status, _, page) = get(&addr, &certs, Role::Reader, "/ui/node?id=n-2");
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains(HOSTILE), "unescaped: {page}");
    assert!(page.contains("data-field=\"unreachable\""), "{page}");
    assert!(
        page.contains("data-field=\"last failure\">2: &lt;script&gt;"),
        "{page}"
    );
    assert_eq!(
        page.matches("class=\"event-failed\"").count(),
        30,
        "its events"
    );

    // The buttons' routes: refused to a reader with the role it lacks, and to a cross-site
    // post even with an operator's certificate.
    let (status, answer) = post(&addr, &certs, Role::Reader, "/v1/fleet/resume", "");
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer.contains("requires role operator or higher"),
        "{answer}"
    );
    let (status, answer) = post(
        &addr,
        &certs,
        Role::Operator,
        "/v1/fleet/abort",
        "Origin: https://evil.example\r\n",
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("cross-site request is refused"), "{answer}");
    let rollouts = state::rollouts(&state).unwrap();
    assert_eq!(
        rollouts["web"].value.state.name(),
        "paused",
        "nothing changed"
    );
    let (status, answer) = post(
        &addr,
        &certs,
        Role::Operator,
        "/v1/fleet/abort",
        &format!("Origin: https://{addr}\r\n"),
    );
    assert_eq!(status, 200, "same origin: {answer}");
    assert_eq!(
        state::rollouts(&state).unwrap()["web"].value.state.name(),
        "aborted"
    );
    server.shutdown().unwrap();
}
