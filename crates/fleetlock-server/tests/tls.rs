//! TLS and mutual TLS on the lock server's listener, seen from the outside: a client (ureq on
//! rustls, the node's lock client stack) that trusts the test CA locks and unlocks over https;
//! plain HTTP on the TLS port gets no HTTP answer; with a client CA, no client certificate or
//! one from another CA fails the handshake and takes no slot; a client that connects and says
//! nothing is dropped after the handshake timeout; bad files are refused naming the file.
//! Certificates are made here with rcgen (ECDSA P-256, as `slate gen certs` makes them).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use slate_fleetlock::{GroupName, Groups, SemaphoreStore, Service};
use slate_fleetlock_server::{FileStore, Server, ServerHandle, Tls, TlsError};
use tempfile::TempDir;
use ureq::tls::{ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};

/// A CA and the PEM files it issued, in a temporary directory.
struct Pki {
    dir: PathBuf,
    name: &'static str,
    cert: Certificate,
    key: KeyPair,
}

impl Pki {
    fn new(dir: &Path, name: &'static str) -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).unwrap();
        let pki = Pki {
            dir: dir.to_owned(),
            name,
            cert,
            key,
        };
        std::fs::write(pki.ca_path(), pki.cert.pem()).unwrap();
        pki
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.crt", self.name))
    }

    fn ca_pem(&self) -> Vec<u8> {
        self.cert.pem().into_bytes()
    }

    /// A leaf certificate and key, written as `<name>-<leaf>.crt` / `.key`; (cert, key) paths.
    /// It names `leaf` too (a node's certificate names the node).
    fn issue(&self, leaf: &str, purpose: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            leaf.to_owned(),
        ];
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, leaf);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![purpose];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        let cert_path = self.dir.join(format!("{}-{leaf}.crt", self.name));
        let key_path = self.dir.join(format!("{}-{leaf}.key", self.name));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    fn server(&self) -> (PathBuf, PathBuf) {
        self.issue("server", ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self, leaf: &str) -> (PathBuf, PathBuf) {
        self.issue(leaf, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// A running server on a file store with the group `default` of 1 slot, and its log.
struct Running {
    handle: ServerHandle,
    store: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Running {
    fn start(tmp: &Path, tls: Tls) -> Running {
        let store = tmp.join("store");
        let service = Arc::new(Service::new(
            Groups::default(),
            FileStore::create(&store).unwrap(),
        ));
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let handle = Server::bind("127.0.0.1:0".parse().unwrap())
            .unwrap()
            .with_tls(tls)
            .spawn(
                service,
                Arc::new(move |line: &str| sink.lock().unwrap().push(line.to_owned())),
            )
            .unwrap();
        Running { handle, store, log }
    }

    fn addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr())
    }

    /// The holders of the group `default` as stored (none before its first lock).
    fn holders(&self) -> Vec<String> {
        let store = FileStore::open(&self.store).unwrap();
        let group: GroupName = "default".parse().unwrap();
        store
            .load(&group)
            .unwrap()
            .map(|(_, sem)| sem.holders().to_vec())
            .unwrap_or_default()
    }

    /// The log lines containing `needle`, once there are `count` of them (or after 5 s: the
    /// server logs a refused handshake around when the client sees it fail).
    fn wait_for_log(&self, needle: &str, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let lines: Vec<String> = (self.log.lock().unwrap().iter())
                .filter(|l| l.contains(needle))
                .cloned()
                .collect();
            if lines.len() >= count || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A client trusting `ca_pem` only, presenting `identity` (certificate and key files) if given.
fn agent(ca_pem: &[u8], identity: Option<&(PathBuf, PathBuf)>) -> ureq::Agent {
    let ca = ureq::tls::Certificate::from_pem(ca_pem).unwrap();
    let mut tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::new_with_certs(&[ca]));
    if let Some((cert, key)) = identity {
        let cert = ureq::tls::Certificate::from_pem(&std::fs::read(cert).unwrap()).unwrap();
        let key = PrivateKey::from_pem(&std::fs::read(key).unwrap()).unwrap();
        tls = tls.client_cert(Some(ClientCert::new_with_certs(&[cert], key)));
    }
    ureq::Agent::config_builder()
        .tls_config(tls.build())
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
}

/// POSTs a FleetLock request; the status and body, or the error (with its sources) as text.
fn post(agent: &ureq::Agent, url: &str, id: &str) -> Result<(u16, String), String> {
    let body = format!(r#"{{"client_params":{{"id":"{id}","group":"default"}}}}"#);
    let mut resp = agent
        .post(url)
        .header("fleet-lock-protocol", "true")
        .content_type("application/json")
        .send(body.as_bytes())
        .map_err(|e| chain(&e))?;
    let text = resp.body_mut().read_to_string().map_err(|e| chain(&e))?;
    Ok((resp.status().as_u16(), text))
}

fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        text.push_str(&format!(": {e}"));
        cur = e.source();
    }
    text
}

const LOCK: &str = "/v1/pre-reboot";
const UNLOCK: &str = "/v1/steady-state";

#[test]
fn tls_lock_and_unlock_over_https_and_plain_http_is_refused() {
    let tmp = TempDir::new().unwrap();
    let pki = Pki::new(tmp.path(), "fleet");
    let (cert, key) = pki.server();
    let tls = Tls::from_files(&cert, &key, None).unwrap();
    assert!(!tls.mutual());
    let server = Running::start(tmp.path(), tls);

    // A TCP probe (connect, close before a byte: a `tcp` health check of the port) offers no
    // handshake, so none is refused and nothing is logged.
    for _ in 0..3 {
        drop(TcpStream::connect(server.addr()).unwrap());
    }
    std::thread::sleep(Duration::from_millis(200));

    // Plain HTTP on the TLS port: the server reads it as a broken TLS record and answers with
    // a TLS alert record (type 21, TLS 1.2 framing, 2 bytes: fatal, decode_error), then
    // closes; never an HTTP answer.
    let mut tcp = TcpStream::connect(server.addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = r#"{"client_params":{"id":"plain","group":"default"}}"#;
    write!(
        tcp,
        "POST {LOCK} HTTP/1.1\r\nHost: x\r\nfleet-lock-protocol: true\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = Vec::new();
    // A clean close, not a reset: the server read what was sent before closing.
    assert_eq!(tcp.read_to_end(&mut reply).unwrap(), 7);
    assert_eq!(
        reply,
        [21, 3, 3, 0, 2, 2, 50],
        "not a TLS alert: {:?}",
        String::from_utf8_lossy(&reply)
    );
    let refused = server.wait_for_log("TLS handshake refused", 1);
    assert!(refused[0].ends_with("InvalidContentType"), "{refused:?}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        server.wait_for_log("TLS handshake", 1).len(),
        1,
        "the probes were logged"
    );
    assert!(server.holders().is_empty(), "{:?}", server.holders());

    // A client that trusts the CA: lock, a second id finds the one slot taken, unlock, and
    // the second id gets it.
    let client = agent(&pki.ca_pem(), None);
    assert_eq!(
        post(&client, &server.url(LOCK), "node-1"),
        Ok((200, String::new()))
    );
    assert_eq!(server.holders(), ["node-1"]);
    let (status, body) = post(&client, &server.url(LOCK), "node-2").unwrap();
    assert_eq!(status, 500);
    assert!(body.contains(r#""kind":"failed_lock""#), "{body}");
    assert_eq!(
        post(&client, &server.url(UNLOCK), "node-1"),
        Ok((200, String::new()))
    );
    assert!(server.holders().is_empty());
    assert_eq!(
        post(&client, &server.url(LOCK), "node-2"),
        Ok((200, String::new()))
    );
    assert_eq!(server.holders(), ["node-2"]);

    // A client that trusts another CA refuses this server.
    let other = Pki::new(tmp.path(), "other");
    let err = post(&agent(&other.ca_pem(), None), &server.url(LOCK), "node-3").unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert_eq!(server.holders(), ["node-2"]);

    server.handle.shutdown().unwrap();
}

#[test]
fn mtls_refuses_clients_without_a_certificate_from_the_client_ca() {
    let tmp = TempDir::new().unwrap();
    let pki = Pki::new(tmp.path(), "fleet");
    let other = Pki::new(tmp.path(), "other");
    let (cert, key) = pki.server();
    let tls = Tls::from_files(&cert, &key, Some(&pki.ca_path())).unwrap();
    assert!(tls.mutual());
    let server = Running::start(tmp.path(), tls);

    // No client certificate: the server answers the handshake with certificate_required.
    let err = post(&agent(&pki.ca_pem(), None), &server.url(LOCK), "anon").unwrap_err();
    assert!(err.contains("CertificateRequired"), "{err}");
    assert_eq!(server.wait_for_log("TLS handshake refused", 1).len(), 1);

    // A client certificate from another CA (the client still trusts the server): unknown_ca.
    let stranger = other.client("stranger");
    let err = post(
        &agent(&pki.ca_pem(), Some(&stranger)),
        &server.url(LOCK),
        "stranger",
    )
    .unwrap_err();
    assert!(err.contains("UnknownCA"), "{err}");
    assert_eq!(server.wait_for_log("TLS handshake refused", 2).len(), 2);

    // The server's own certificate is not a client certificate (serverAuth only).
    let err = post(
        &agent(&pki.ca_pem(), Some(&pki.server())),
        &server.url(LOCK),
        "srv",
    )
    .unwrap_err();
    assert!(err.contains("UnsupportedCertificate"), "{err}");

    // The server says why, one line per refused handshake.
    let refused = server.wait_for_log("TLS handshake refused", 3);
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(
        refused[0].ends_with("peer sent no certificates"),
        "{refused:?}"
    );
    assert!(refused[1].ends_with("UnknownIssuer"), "{refused:?}");
    assert!(refused[2].contains("extended key usage"), "{refused:?}");
    // None of the refused requests reached the store.
    assert!(server.holders().is_empty(), "{:?}", server.holders());

    // A certificate from the client CA: the lock works for the id it names, and the slot is
    // held; for another id it is refused, and nothing is taken.
    let good = agent(&pki.ca_pem(), Some(&pki.client("node-1")));
    assert_eq!(
        post(&good, &server.url(LOCK), "node-2"),
        Ok((
            400,
            "{\"kind\":\"invalid_client_identity\",\"value\":\"the client certificate does not \
             name \\\"node-2\\\": a client acts for itself only\"}"
                .to_owned()
        ))
    );
    assert!(server.holders().is_empty(), "{:?}", server.holders());
    assert_eq!(
        post(&good, &server.url(LOCK), "node-1"),
        Ok((200, String::new()))
    );
    assert_eq!(server.holders(), ["node-1"]);
    assert_eq!(
        post(&good, &server.url(UNLOCK), "node-1"),
        Ok((200, String::new()))
    );
    assert!(server.holders().is_empty());

    server.handle.shutdown().unwrap();
}

/// Reads from `tcp` until the server closes it, with nothing sent first (no alert); how long
/// that took.
fn time_until_closed(tcp: &mut TcpStream) -> Duration {
    let start = Instant::now();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 256];
    match tcp.read(&mut buf) {
        Ok(0) => start.elapsed(),
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
}

#[test]
fn a_client_that_never_completes_the_handshake_is_dropped_after_the_timeout() {
    let tmp = TempDir::new().unwrap();
    let pki = Pki::new(tmp.path(), "fleet");
    let (cert, key) = pki.server();
    let timeout = Duration::from_millis(600);
    let tls = Tls::from_files(&cert, &key, None)
        .unwrap()
        .with_handshake_timeout(timeout);
    let server = Running::start(tmp.path(), tls);

    // One client sends nothing; another the 5-byte header of a handshake record and then
    // nothing (the timeout covers the whole handshake, not only its first byte).
    let mut silent = TcpStream::connect(server.addr()).unwrap();
    let mut partial = TcpStream::connect(server.addr()).unwrap();
    partial.write_all(&[22, 3, 1, 0, 200]).unwrap();

    // Meanwhile, the server serves others.
    let client = agent(&pki.ca_pem(), None);
    assert_eq!(
        post(&client, &server.url(LOCK), "node-1"),
        Ok((200, String::new()))
    );

    let silent_after = time_until_closed(&mut silent);
    let partial_after = time_until_closed(&mut partial);
    // Measured from after the lock above, so only the upper bound is checked here; the lower
    // bound on a fresh connection below.
    assert!(silent_after < Duration::from_secs(10), "{silent_after:?}");
    assert!(partial_after < Duration::from_secs(10), "{partial_after:?}");

    let start = Instant::now();
    let mut late = TcpStream::connect(server.addr()).unwrap();
    time_until_closed(&mut late);
    let waited = start.elapsed();
    assert!(
        waited >= timeout,
        "closed after {waited:?}, before the timeout"
    );
    assert!(
        waited < Duration::from_secs(10),
        "closed only after {waited:?}"
    );
    assert_eq!(server.wait_for_log("TLS handshake timed out", 3).len(), 3);

    // The slot taken above is still served normally.
    assert_eq!(server.holders(), ["node-1"]);
    server.handle.shutdown().unwrap();
}

#[test]
fn shutdown_does_not_wait_for_handshakes_in_progress() {
    let tmp = TempDir::new().unwrap();
    let pki = Pki::new(tmp.path(), "fleet");
    let (cert, key) = pki.server();
    let tls = Tls::from_files(&cert, &key, None)
        .unwrap()
        .with_handshake_timeout(Duration::from_secs(60));
    let server = Running::start(tmp.path(), tls);
    let mut silent = TcpStream::connect(server.addr()).unwrap();
    // Let the server accept it before shutting down.
    std::thread::sleep(Duration::from_millis(200));

    let start = Instant::now();
    server.handle.shutdown().unwrap();
    let took = start.elapsed();
    // Open requests get 2 s of grace; a handshake has none to finish.
    assert!(took < Duration::from_millis(1500), "shutdown took {took:?}");
    assert!(time_until_closed(&mut silent) < Duration::from_secs(5));
}

#[test]
fn bad_files_are_refused_naming_the_file() {
    let tmp = TempDir::new().unwrap();
    let pki = Pki::new(tmp.path(), "fleet");
    let (cert, key) = pki.server();
    let (other_cert, _) = pki.client("node-1");
    let garbage = tmp.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all\n").unwrap();
    let missing = tmp.path().join("missing.crt");
    let shown = |p: &Path| p.display().to_string();

    let err = Tls::from_files(&missing, &key, None).unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains(&shown(&missing)), "{err}");

    let err = Tls::from_files(&garbage, &key, None).unwrap_err();
    assert!(matches!(err, TlsError::Invalid { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("{}: no CERTIFICATE block in the PEM data", shown(&garbage))
    );

    // A certificate where the key should be.
    let err = Tls::from_files(&cert, &cert, None).unwrap_err();
    assert!(matches!(err, TlsError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().starts_with(&shown(&cert)), "{err}");
    assert!(err.to_string().contains("private key"), "{err}");

    // A key that is not the certificate's.
    let err = Tls::from_files(&other_cert, &key, None).unwrap_err();
    assert!(matches!(err, TlsError::Pair { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "{} with key {}: the private key is not the certificate's",
            shown(&other_cert),
            shown(&key)
        )
    );

    let err = Tls::from_files(&cert, &key, Some(&garbage)).unwrap_err();
    assert!(err.to_string().starts_with(&shown(&garbage)), "{err}");
    let err = Tls::from_files(&cert, &key, Some(&missing)).unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains(&shown(&missing)), "{err}");
}
