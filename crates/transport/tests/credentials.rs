//! Registry credentials go to the registry's host only (issue 19): a token service on another
//! host gets none unless the user allowed that host, an upload location on another host gets no
//! `Authorization`, and nothing goes in clear (plain HTTP) to a host that is not this machine.
//! Local HTTP servers stand for the registry and the other hosts, and capture what they are
//! sent.
#![cfg(feature = "client")]

mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slate_bundle::Bundle;
use slate_transport::{
    pull_with, push_with, Client, Credentials, Options, Reference, TransportError,
};
use support::fake::honest;
use support::http::{header_value, response, FakeServer, Request};
use support::{noise, write_test_bundle};

/// "user:secret" as basic authentication.
const BASIC: &str = "Basic dXNlcjpzZWNyZXQ=";

fn options() -> Options {
    Options {
        credentials: Some(Credentials {
            username: "user".into(),
            password: "secret".into(),
        }),
        ..Options::default()
    }
}

/// What a server was sent: each request's path and `Authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

fn record(seen: &Seen, req: &Request) {
    seen.lock().unwrap().push((
        req.path.clone(),
        header_value(&req.head, "authorization").map(str::to_owned),
    ));
}

fn authorizations(seen: &Seen) -> Vec<Option<String>> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(_, a)| a.clone())
        .collect()
}

struct Case {
    _work: tempfile::TempDir,
    bundle: PathBuf,
    cache: PathBuf,
}

impl Case {
    fn new() -> Self {
        let work = tempfile::tempdir().unwrap();
        let bundle = work.path().join("bundle");
        write_test_bundle(&bundle, "2.0.0", &noise(1, 2_000), &noise(2, 1_000));
        let cache = work.path().join("cache");
        Case {
            _work: work,
            bundle,
            cache,
        }
    }
}

/// A token service that records what it is sent and answers `token` — to anyone, or only to
/// a request carrying the credentials.
fn token_service(token: &'static str, only_with_credentials: bool) -> (FakeServer, Seen) {
    let seen: Seen = Arc::default();
    let recorded = seen.clone();
    let server = FakeServer::start(move |req, _| {
        record(&recorded, req);
        let authorized = header_value(&req.head, "authorization") == Some(BASIC);
        if only_with_credentials && !authorized {
            return response(
                "401 Unauthorized",
                &[("Content-Type", "application/json")],
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            );
        }
        response(
            "200 OK",
            &[],
            format!(r#"{{"token":"{token}"}}"#).as_bytes(),
        )
    });
    (server, seen)
}

/// A registry serving the case's bundle as `os` to requests with `Bearer token`, and answering
/// every other request 401 with a challenge naming `realm`.
fn registry(case: &Case, realm: String, token: &'static str) -> (FakeServer, Seen) {
    let seen: Seen = Arc::default();
    let (recorded, bundle) = (seen.clone(), case.bundle.clone());
    let server = FakeServer::start(move |req, _| {
        record(&recorded, req);
        if header_value(&req.head, "authorization") == Some(&format!("Bearer {token}")) {
            return honest(&bundle, req);
        }
        let challenge = format!(r#"Bearer realm="{realm}",service="fake""#);
        response("401 Unauthorized", &[("WWW-Authenticate", &challenge)], b"")
    });
    (server, seen)
}

fn port(host: &str) -> &str {
    host.rsplit(':').next().unwrap()
}

fn reference(server: &FakeServer) -> Reference {
    Reference::parse(&format!("{}/os:2.0.0", server.host)).unwrap()
}

/// issue 19: a registry whose 401 names a token service on another host got the basic
/// credentials sent there. Now the other host is asked for an anonymous token.
#[test]
fn a_token_service_on_another_host_gets_no_credentials() {
    let case = Case::new();
    let (auth, auth_seen) = token_service("anonymous", false);
    // Another host name and port: `localhost` is not the registry's `127.0.0.1`.
    let realm = format!("http://localhost:{}/token", port(&auth.host));
    let (registry, registry_seen) = registry(&case, realm, "anonymous");
    pull_with(&reference(&registry), &case.cache, &options(), &mut |_| {}).unwrap();
    Bundle::open(&case.cache, Some("2.0.0")).unwrap();
    let sent = authorizations(&auth_seen);
    assert!(!sent.is_empty(), "the token service was asked");
    assert!(
        sent.iter().all(Option::is_none),
        "the token service on another host was sent {sent:?}"
    );
    assert!(
        !authorizations(&registry_seen).contains(&Some(BASIC.into())),
        "a bearer challenge is answered with a token"
    );
}

/// A token service on another host that wants credentials: the error says they were kept
/// back, and how to allow that host.
#[test]
fn a_token_service_refusing_anonymous_requests_is_named() {
    let case = Case::new();
    let (auth, auth_seen) = token_service("t0k3n", true);
    let auth_host = format!("localhost:{}", port(&auth.host));
    let (registry, _) = registry(&case, format!("http://{auth_host}/token"), "t0k3n");
    let err = pull_with(&reference(&registry), &case.cache, &options(), &mut |_| {}).unwrap_err();
    assert!(
        matches!(&err, TransportError::CredentialsWithheld { host, .. } if *host == auth_host),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&format!("--auth-host {auth_host}")), "{text}");
    assert!(
        text.contains("UNAUTHORIZED: authentication required"),
        "{text}"
    );
    assert!(authorizations(&auth_seen).iter().all(Option::is_none));
}

/// The user may allow a token service's host: then, and only then, it gets the credentials.
#[test]
fn an_allowed_token_host_gets_the_credentials() {
    let case = Case::new();
    let (auth, auth_seen) = token_service("t0k3n", true);
    let auth_host = format!("localhost:{}", port(&auth.host));
    let (registry, _) = registry(&case, format!("http://{auth_host}/token"), "t0k3n");
    let client = Client {
        credential_hosts: vec![auth_host],
        ..Client::new(options())
    };
    client
        .pull(&reference(&registry), &case.cache, &mut |_| {})
        .unwrap();
    assert!(authorizations(&auth_seen).contains(&Some(BASIC.into())));
}

/// A token service on the registry's own host (and port) is the registry's: it gets the
/// credentials without being named.
#[test]
fn the_registry_host_itself_gets_the_credentials() {
    let case = Case::new();
    let seen: Seen = Arc::default();
    let (recorded, bundle) = (seen.clone(), case.bundle.clone());
    let server = FakeServer::start(move |req, host| {
        record(&recorded, req);
        if req.path.starts_with("/token?") {
            if header_value(&req.head, "authorization") == Some(BASIC) {
                return response("200 OK", &[], br#"{"token":"t0k3n"}"#);
            }
            return response("401 Unauthorized", &[], b"");
        }
        if header_value(&req.head, "authorization") == Some("Bearer t0k3n") {
            return honest(&bundle, req);
        }
        let challenge = format!(r#"Bearer realm="http://{host}/token",service="fake""#);
        response("401 Unauthorized", &[("WWW-Authenticate", &challenge)], b"")
    });
    pull_with(&reference(&server), &case.cache, &options(), &mut |_| {}).unwrap();
    let token_requests: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path.starts_with("/token?"))
        .map(|(_, a)| a.clone())
        .collect();
    assert_eq!(token_requests, [Some(BASIC.into())]);
}

/// Plain HTTP to a host that is not this machine never carries credentials: refused before
/// connecting, naming the host (203.0.113.7 is TEST-NET-3: nothing answers there).
#[test]
fn credentials_never_go_in_clear_to_another_machine() {
    let case = Case::new();
    let (registry, _) = registry(&case, "http://203.0.113.7/token".into(), "t0k3n");
    let client = Client {
        credential_hosts: vec!["203.0.113.7".into()],
        ..Client::new(options())
    };
    let started = Instant::now();
    let err = client
        .pull(&reference(&registry), &case.cache, &mut |_| {})
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "nothing waited on"
    );
    assert!(
        matches!(&err, TransportError::CleartextCredentials { host, .. } if host == "203.0.113.7"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(
            "refusing to send the registry credentials in clear (plain http) to 203.0.113.7"
        ),
        "{err}"
    );
}

/// An upload location on another host gets no `Authorization`: only the registry does.
#[test]
fn an_upload_location_on_another_host_gets_no_authorization() {
    let case = Case::new();
    let elsewhere_seen: Seen = Arc::default();
    let recorded = elsewhere_seen.clone();
    let elsewhere = FakeServer::start(move |req, _| {
        record(&recorded, req);
        response("201 Created", &[], b"")
    });
    let upload = format!("http://localhost:{}/upload", port(&elsewhere.host));
    let registry = FakeServer::start(move |req, _| {
        if header_value(&req.head, "authorization") != Some(BASIC) {
            return response(
                "401 Unauthorized",
                &[("WWW-Authenticate", r#"Basic realm="fake""#)],
                b"",
            );
        }
        match req.method.as_str() {
            "HEAD" => response("404 Not Found", &[], b""),
            "POST" => response("202 Accepted", &[("Location", &upload)], b""),
            "PUT" => response("201 Created", &[], b""),
            _ => response("405 Method Not Allowed", &[], b""),
        }
    });
    push_with(&case.bundle, &reference(&registry), &options(), &mut |_| {}).unwrap();
    let sent = authorizations(&elsewhere_seen);
    assert!(!sent.is_empty(), "the blobs went to the upload location");
    assert!(sent.iter().all(Option::is_none), "{sent:?}");
}
