//! A toy service served with `spawn_service`/`serve_service` over real TLS on 127.0.0.1: the
//! node API's mutual TLS, roles, refusals and error mapping, through `Client::call`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use slate_api::{
    BackendError, Caller, Client, ClientError, ErrorCode, JsonService, Role, ServerConfig,
    ServerError, ServerHandle, ServiceRoute, CA_CERT, CA_KEY, CLIENT_CA_CERT, MAX_SERVICE_BODY,
};
use tempfile::TempDir;

const ROUTES: &[ServiceRoute] = &[
    ServiceRoute::new("GET", "/v1/items", Role::Reader),
    ServiceRoute::new("POST", "/v1/items", Role::Admin),
    // `?kind=` names the BackendError to answer.
    ServiceRoute::new("GET", "/v1/fail", Role::Reader),
    // Who called, as the server saw it: nodes may.
    ServiceRoute::new("POST", "/v1/whoami", Role::Node),
];

/// Records what reaches it; answers the items posted so far.
#[derive(Default)]
struct Toy {
    posted: Mutex<Vec<(Role, Vec<u8>)>>,
    log: Mutex<Vec<String>>,
}

impl Toy {
    fn posted(&self) -> Vec<(Role, Vec<u8>)> {
        self.posted.lock().unwrap().clone()
    }

    /// Waits for a log line containing `needle` (the log is written after the answer).
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.log.lock().unwrap().iter().any(|l| l.contains(needle)) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in {:?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl JsonService for Toy {
    fn routes(&self) -> &[ServiceRoute] {
        ROUTES
    }

    fn call(
        &self,
        route: &ServiceRoute,
        caller: &Caller,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<Value, BackendError> {
        let role = caller.role;
        match (route.method, route.path) {
            ("POST", "/v1/whoami") => Ok(json!({
                "role": role.as_str(),
                "node_names": caller.node_names,
            })),
            ("GET", "/v1/items") => Ok(json!({
                "role": role.as_str(),
                "query": query,
                "count": self.posted.lock().unwrap().len(),
            })),
            ("POST", "/v1/items") => {
                let mut posted = self.posted.lock().unwrap();
                posted.push((role, body.to_vec()));
                Ok(json!({ "stored": posted.len() }))
            }
            ("GET", "/v1/fail") => {
                let m = "the toy says no".to_owned();
                Err(match query.unwrap_or_default() {
                    "kind=locked" => BackendError::Locked(m),
                    "kind=invalid" => BackendError::InvalidArgument(m),
                    "kind=unsupported" => BackendError::Unsupported(m),
                    "kind=not_found" => BackendError::NotFound(m),
                    _ => BackendError::Failed(m),
                })
            }
            other => panic!("the server let through {other:?}"),
        }
    }

    fn log_api(&self, message: &str) {
        self.log.lock().unwrap().push(message.to_owned());
    }
}

/// A certificate set from `gen_certs`, and the service's own serving certificate issued from
/// its fleet CA, as a service would get one; it takes clients of the client CA and nodes of
/// the fleet CA, as the rollout operator does.
fn certs() -> (TempDir, ServerConfig) {
    let dir = tempfile::tempdir().unwrap();
    slate_api::gen_certs(dir.path(), &[]).unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let key = slate_api::generate_key_pem().unwrap();
    let names = slate_api::serving_names(&["rollout.example".to_owned()]);
    let cert = slate_api::issue_serving_cert(&read(CA_CERT), &read(CA_KEY), &key, &names).unwrap();
    let listen = "127.0.0.1:0".parse().unwrap();
    let mut config = ServerConfig::new(
        listen,
        read(CLIENT_CA_CERT).as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
    );
    config.node_ca_pem = Some(read(CA_CERT).into_bytes());
    (dir, config)
}

fn start() -> (TempDir, Arc<Toy>, ServerHandle) {
    let (dir, config) = certs();
    let toy = Arc::new(Toy::default());
    let server = slate_api::spawn_service(config, toy.clone()).unwrap();
    (dir, toy, server)
}

fn client(dir: &TempDir, server: &ServerHandle, role: Role) -> Client {
    Client::from_dir(&server.local_addr().to_string(), dir.path(), role).unwrap()
}

/// One raw HTTP/1.1 exchange as `role`, for what `Client` does not show (headers) or does
/// not send (a body that is not JSON): the status, the head and the body.
fn raw(dir: &Path, addr: SocketAddr, role: Role, request: &str) -> (u16, String, String) {
    let roots = {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(dir.join(CA_CERT)).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        roots
    };
    let chain = CertificateDer::pem_file_iter(dir.join(slate_api::client_cert_file(role)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join(slate_api::client_key_file(role))).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(addr).unwrap());
    tls.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    // The server may close without close_notify once the answer is out: keep what came.
    let _ = tls.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

#[test]
fn a_reader_may_get_but_not_post() {
    let (dir, toy, server) = start();
    let reader = client(&dir, &server, Role::Reader);
    let got: Value = reader
        .call("GET", "/v1/items?name=a%20b", None::<&()>)
        .unwrap();
    assert_eq!(
        got,
        json!({"role": "reader", "query": "name=a%20b", "count": 0})
    );
    let err = reader
        .call::<Value, _>("POST", "/v1/items", Some(&json!({"name": "x"})))
        .unwrap_err();
    match &err {
        ClientError::PermissionDenied(m) => assert!(
            m.contains("requires role admin") && m.contains("grants role reader"),
            "{m}"
        ),
        other => panic!("expected permission_denied, got {other:?}"),
    }
    assert!(toy.posted().is_empty());
    toy.wait_log("(reader) POST /v1/items -> 403");
    // An operator is below admin too.
    let err = client(&dir, &server, Role::Operator)
        .call::<Value, ()>("POST", "/v1/items", None)
        .unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    server.shutdown().unwrap();
}

#[test]
fn an_admin_posts_and_the_body_arrives() {
    let (dir, toy, server) = start();
    let admin = client(&dir, &server, Role::Admin);
    let doc = json!({"name": "canary", "nodes": ["n1", "n2"], "note": "ü"});
    let answer: Value = admin.call("POST", "/v1/items", Some(&doc)).unwrap();
    assert_eq!(answer, json!({"stored": 1}));
    // No body at all arrives empty.
    let answer: Value = admin.call("POST", "/v1/items", None::<&()>).unwrap();
    assert_eq!(answer, json!({"stored": 2}));
    let posted = toy.posted();
    assert_eq!(posted[0].0, Role::Admin);
    assert_eq!(serde_json::from_slice::<Value>(&posted[0].1).unwrap(), doc);
    assert_eq!(posted[1], (Role::Admin, Vec::new()));
    // Admin reads too, as itself.
    let got: Value = admin.call("GET", "/v1/items", None::<&()>).unwrap();
    assert_eq!(got, json!({"role": "admin", "query": null, "count": 2}));
    toy.wait_log("(admin) POST /v1/items -> 200");
    server.shutdown().unwrap();
}

#[test]
fn unknown_paths_are_404_and_other_methods_405_with_allow() {
    let (dir, toy, server) = start();
    let reader = client(&dir, &server, Role::Reader);
    let err = reader
        .call::<Value, ()>("GET", "/v1/nothing", None)
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::NotFound(m) if m.contains("/v1/nothing")),
        "{err}"
    );
    // The node's routes are not the service's.
    let err = reader.version().unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err}");
    let err = reader
        .call::<Value, ()>("DELETE", "/v1/items", None)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Server {
                status: 405,
                code: ErrorCode::MethodNotAllowed,
                ..
            }
        ),
        "{err}"
    );
    let (status, head, body) = raw(
        dir.path(),
        server.local_addr(),
        Role::Reader,
        "PUT /v1/fail HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 405, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nallow: get\r\n"),
        "{head}"
    );
    let error: slate_api::ApiError = serde_json::from_str(&body).unwrap();
    assert_eq!(error.code, ErrorCode::MethodNotAllowed);
    let (_, head, _) = raw(
        dir.path(),
        server.local_addr(),
        Role::Reader,
        "PUT /v1/items HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nallow: get, post\r\n"),
        "{head}"
    );
    assert!(toy.posted().is_empty());
    server.shutdown().unwrap();
}

#[test]
fn a_client_without_a_certificate_is_refused_at_the_handshake() {
    let (dir, toy, server) = start();
    let ca = std::fs::read(dir.path().join(CA_CERT)).unwrap();
    let anonymous = Client::without_certificate(&server.local_addr().to_string(), &ca).unwrap();
    let err = anonymous
        .call::<Value, ()>("GET", "/v1/items", None)
        .unwrap_err();
    match &err {
        ClientError::Tls { message, .. } => {
            assert!(message.contains("requires a client certificate"), "{err}")
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }
    toy.wait_log("TLS handshake refused");
    server.shutdown().unwrap();
}

#[test]
fn backend_errors_map_to_their_status_and_code() {
    let (dir, _toy, server) = start();
    let reader = client(&dir, &server, Role::Reader);
    let fail = |kind: &str| {
        reader
            .call::<Value, ()>("GET", &format!("/v1/fail?kind={kind}"), None)
            .unwrap_err()
    };
    let said = |m: &str| m == "the toy says no";
    assert!(matches!(fail("locked"), ClientError::Locked(m) if said(&m)));
    assert!(matches!(fail("invalid"), ClientError::InvalidArgument(m) if said(&m)));
    assert!(matches!(fail("unsupported"), ClientError::Unsupported(m) if said(&m)));
    assert!(matches!(fail("not_found"), ClientError::NotFound(m) if said(&m)));
    let err = fail("failed");
    assert!(
        matches!(&err, ClientError::Server { status: 500, code: ErrorCode::Internal, message } if said(message)),
        "{err:?}"
    );
    // The statuses on the wire, which the client folds into its variants.
    for (kind, status, code) in [
        ("locked", 409, "locked"),
        ("invalid", 400, "invalid_argument"),
        ("unsupported", 400, "unsupported"),
        ("not_found", 404, "not_found"),
        ("failed", 500, "internal"),
    ] {
        let request =
            format!("GET /v1/fail?kind={kind} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let (got, head, body) = raw(dir.path(), server.local_addr(), Role::Reader, &request);
        assert_eq!(got, status, "{head}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body, json!({"code": code, "message": "the toy says no"}));
    }
    server.shutdown().unwrap();
}

#[test]
fn oversized_and_non_json_bodies_are_refused_before_the_service() {
    let (dir, toy, server) = start();
    let admin = client(&dir, &server, Role::Admin);
    let big = "x".repeat(MAX_SERVICE_BODY + 1);
    let err = admin
        .call::<Value, _>("POST", "/v1/items", Some(&big))
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Server {
                status: 413,
                code: ErrorCode::PayloadTooLarge,
                ..
            }
        ),
        "{err}"
    );
    // Just under the limit passes (a JSON string: the quotes count).
    let fits = "x".repeat(MAX_SERVICE_BODY - 2);
    let answer: Value = admin.call("POST", "/v1/items", Some(&fits)).unwrap();
    assert_eq!(answer, json!({"stored": 1}));
    let (status, head, body) = raw(
        dir.path(),
        server.local_addr(),
        Role::Admin,
        "POST /v1/items HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\nconnection: close\r\n\r\nnot json",
    );
    assert_eq!(status, 400, "{head}");
    assert!(body.contains("invalid_argument"), "{body}");
    assert_eq!(toy.posted().len(), 1);
    server.shutdown().unwrap();
}

#[test]
fn shutdown_stops_the_service() {
    let (dir, _toy, server) = start();
    let addr = server.local_addr();
    let reader = client(&dir, &server, Role::Reader);
    let _: Value = reader.call("GET", "/v1/items", None::<&()>).unwrap();
    let started = Instant::now();
    server.shutdown().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(TcpStream::connect(addr).is_err());
    let err = reader
        .call::<Value, ()>("GET", "/v1/items", None)
        .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
}

#[test]
fn serve_service_runs_in_a_runtime_until_its_shutdown_resolves() {
    let (dir, config) = certs();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = ServerConfig { listen, ..config };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(slate_api::serve_service(
            config,
            Arc::new(Toy::default()),
            async move {
                let _ = stopped.await;
            },
        ))
    });
    let reader = Client::from_dir(&listen.to_string(), dir.path(), Role::Reader).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match reader.call::<Value, ()>("GET", "/v1/items", None) {
            Ok(_) => break,
            Err(ClientError::Connect { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    }
    stop.send(()).unwrap();
    server.join().unwrap().unwrap();
    assert!(TcpStream::connect(listen).is_err());
}

#[test]
fn maintenance_mode_and_malformed_tables_are_refused_at_start() {
    let (_dir, config) = certs();
    let maintenance = ServerConfig {
        maintenance_token: Some("t0ken".into()),
        ..config.clone()
    };
    let err = slate_api::spawn_service(maintenance, Arc::new(Toy::default())).unwrap_err();
    assert!(
        matches!(&err, ServerError::Service(m) if m.contains("maintenance")),
        "{err}"
    );

    struct Twice;
    impl JsonService for Twice {
        fn routes(&self) -> &[ServiceRoute] {
            const TWICE: &[ServiceRoute] = &[
                ServiceRoute::new("GET", "/v1/x", Role::Reader),
                ServiceRoute::new("GET", "/v1/x", Role::Admin),
            ];
            TWICE
        }
        fn call(
            &self,
            _: &ServiceRoute,
            _: &Caller,
            _: Option<&str>,
            _: &[u8],
        ) -> Result<Value, BackendError> {
            Ok(Value::Null)
        }
    }
    let err = slate_api::spawn_service(config, Arc::new(Twice)).unwrap_err();
    assert!(
        matches!(&err, ServerError::Service(m) if m.contains("twice")),
        "{err}"
    );
}

/// A client certificate under `ca`/`ca_key` with `O=os:<role>`: what an attacker holding a
/// node's issuing CA key would try.
fn forged_client(ca: &str, ca_key: &str, key: &str, san: &str, role: Role) -> String {
    let issuer_key = rcgen::KeyPair::from_pem(ca_key).unwrap();
    let issuer = rcgen::CertificateParams::from_ca_cert_pem(ca)
        .unwrap()
        .self_signed(&issuer_key)
        .unwrap();
    let mut p = rcgen::CertificateParams::new(vec![san.to_owned()]).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, role.organization());
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::from_pem(key).unwrap();
    let mut pem = p.signed_by(&key, &issuer, &issuer_key).unwrap().pem();
    pem.push_str(ca);
    pem
}

#[test]
fn a_node_certificate_is_a_node_caller_and_never_a_role() {
    let (dir, toy, server) = start();
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let (node_ca, node_ca_key) =
        slate_api::issue_node_ca(&read(CA_CERT), &read(CA_KEY), "node7", &["node7".into()])
            .unwrap();
    let key = slate_api::generate_key_pem().unwrap();
    let addr = server.local_addr().to_string();
    let with = |cert: &str| {
        Client::new(
            &addr,
            read(CA_CERT).as_bytes(),
            cert.as_bytes(),
            key.as_bytes(),
        )
        .unwrap()
    };
    let node = with(
        &slate_api::issue_node_client_cert(
            &node_ca,
            &node_ca_key,
            &key,
            "node7",
            Duration::from_secs(3600),
        )
        .unwrap(),
    );
    let seen: Value = node.call("POST", "/v1/whoami", Some(&json!({}))).unwrap();
    assert_eq!(seen, json!({ "role": "node", "node_names": ["node7"] }));
    // A node may do nothing a reader may.
    for (method, path) in [("GET", "/v1/items"), ("POST", "/v1/items")] {
        let err = node
            .call::<Value, _>(method, path, Some(&json!({})))
            .unwrap_err();
        assert!(
            matches!(&err, ClientError::PermissionDenied(m) if m.contains("role node")),
            "{method} {path}: {err}"
        );
    }
    // The node's CA key, stolen, makes a certificate that claims admin: still only a node
    // (the role is read from client-CA certificates alone)…
    let forged = with(&forged_client(
        &node_ca,
        &node_ca_key,
        &key,
        "node7",
        Role::Admin,
    ));
    let err = forged
        .call::<Value, _>("POST", "/v1/items", Some(&json!({"x": 1})))
        .unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    // …and one for another node's name is refused at the handshake (name constraints).
    let forged = with(&forged_client(
        &node_ca,
        &node_ca_key,
        &key,
        "node9",
        Role::Admin,
    ));
    let err = forged
        .call::<Value, _>("POST", "/v1/whoami", Some(&json!({})))
        .unwrap_err();
    assert!(
        err.to_string().contains("refused the TLS handshake"),
        "{err}"
    );
    assert!(toy.posted().is_empty());
    // Clients of the client CA carry their role.
    let admin = client(&dir, &server, Role::Admin);
    admin
        .call::<Value, _>("POST", "/v1/items", Some(&json!({"x": 2})))
        .unwrap();
    assert_eq!(toy.posted()[0].0, Role::Admin);
    let seen: Value = admin.call("POST", "/v1/whoami", Some(&json!({}))).unwrap();
    assert_eq!(seen, json!({ "role": "admin", "node_names": [] }));
    // Another fleet's node is refused at the handshake.
    let other = tempfile::tempdir().unwrap();
    slate_api::gen_certs(other.path(), &[]).unwrap();
    let read_other = |name: &str| std::fs::read_to_string(other.path().join(name)).unwrap();
    let (foreign_ca, foreign_key) = slate_api::issue_node_ca(
        &read_other(CA_CERT),
        &read_other(CA_KEY),
        "node7",
        &["node7".into()],
    )
    .unwrap();
    let intruder = with(
        &slate_api::issue_node_client_cert(
            &foreign_ca,
            &foreign_key,
            &key,
            "node7",
            Duration::from_secs(3600),
        )
        .unwrap(),
    );
    let err = intruder
        .call::<Value, _>("POST", "/v1/whoami", Some(&json!({})))
        .unwrap_err();
    assert!(!matches!(err, ClientError::PermissionDenied(_)), "{err}");
}
