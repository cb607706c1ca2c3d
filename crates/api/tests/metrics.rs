//! `GET /metrics` on the node API: role reader, the text exposition `promtool` accepts, the
//! node's state and the server's own counters in it, and bad requests refused.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::raw::{head, Raw};
use common::{client, start, Fake};
use slate_api::Role;

fn scrape(raw: &mut Raw, request: &[u8]) -> (u16, String) {
    assert!(raw.send(request));
    raw.answer(Duration::from_secs(10))
}

#[test]
fn a_reader_scrapes_what_promtool_accepts() {
    let (dir, server) = start(Arc::new(Fake::default()));
    let addr = server.local_addr();
    // Requests to count: two status reads (the second resumes the first's session), one
    // unknown path.
    let c = client(&dir, &server, Role::Reader);
    c.status().unwrap();
    c.status().unwrap();
    let mut raw = Raw::connect(dir.path(), addr, Role::Reader);
    let (status, _) = scrape(&mut raw, &head("GET", "/v1/nope", &[]));
    assert_eq!(status, 404);

    let mut raw = Raw::connect(dir.path(), addr, Role::Reader);
    let (status, answer) = scrape(&mut raw, &head("GET", "/metrics", &[]));
    assert_eq!(status, 200, "{answer}");
    let (headers, text) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        headers
            .to_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let version = common::status().version;
    for line in [
        format!(
            "slate_node_version_info{{booted_entry=\"{}\",version=\"{version}\"}} 1",
            common::status().booted_entry.unwrap_or_default()
        ),
        "slate_api_requests_total{route=\"/v1/status\",status=\"200\"} 2".to_owned(),
        "slate_api_requests_total{route=\"other\",status=\"404\"} 1".to_owned(),
        "slate_api_connections_refused_total{limit=\"per_client\"} 0".to_owned(),
        "slate_api_tls_handshakes_total{kind=\"full\"} 3".to_owned(),
        "slate_api_tls_handshakes_total{kind=\"resumed\"} 1".to_owned(),
        "slate_api_log_lines_dropped_total 0".to_owned(),
        "slate_node_stage{stage=\"running\"} 1".to_owned(),
    ] {
        assert!(text.contains(&format!("{line}\n")), "{line} in\n{text}");
    }
    if slate_testkit::prometheus::require_prometheus() {
        slate_testkit::prometheus::promtool_check(text).unwrap();
    }
    server.shutdown().unwrap();
}

#[test]
fn other_methods_and_query_parameters_are_refused() {
    let (dir, server) = start(Arc::new(Fake::default()));
    let addr = server.local_addr();
    let cases: [(&[u8], u16, &str); 3] = [
        (
            &head("POST", "/metrics", &["content-length: 0"]),
            405,
            "does not take POST",
        ),
        (
            &head("GET", "/metrics?match[]=up", &[]),
            400,
            "takes no query parameters",
        ),
        (
            &head("GET", "/metrics?", &[]),
            200,
            "slate_node_version_info",
        ),
    ];
    for (request, want, says) in cases {
        let mut raw = Raw::connect(dir.path(), addr, Role::Reader);
        let (status, answer) = scrape(&mut raw, request);
        assert_eq!(status, want, "{answer}");
        assert!(answer.contains(says), "{says} in {answer}");
    }
    server.shutdown().unwrap();
}
