//! The crash reproduction of issue 19 against a real node: reader-role connections sending
//! requests with huge methods, as many as the old node took before it ran out of memory
//! (2,123), while an admin asks for status. Raw HTTP/1.1 over mutual TLS (rustls), since no
//! well-behaved client sends such heads.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use slate_api::{client_cert_file, client_key_file, Role, CA_CERT};

/// A method just under hyper's 64 KiB head limit: the request reaches the routes (405) and is
/// logged, cut.
const LOGGED_METHOD: usize = 60_000;
/// The method of the original report: over the head limit, refused by the parser (431) and
/// the connection closed.
const REFUSED_METHOD: usize = 400_000;
/// Every this many requests on a connection, one with the [`REFUSED_METHOD`], which ends it.
const REFUSED_EVERY: usize = 10;

/// What the flood did.
#[derive(Debug, Default)]
pub(super) struct Flood {
    pub(super) requests: usize,
    /// Answers by status (0: none came, the connection was cut).
    pub(super) answers: std::collections::BTreeMap<u16, usize>,
    pub(super) connections: usize,
    pub(super) took: Duration,
}

fn client_config(pki: &Path, role: Role) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.join(CA_CERT)).context("the demo CA")? {
        roots.add(cert?)?;
    }
    let chain = CertificateDer::pem_file_iter(pki.join(client_cert_file(role)))?
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(pki.join(client_key_file(role)))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(Arc::new(
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?,
    ))
}

fn connect(
    config: &Arc<ClientConfig>,
    name: &str,
    port: u16,
) -> Result<StreamOwned<ClientConnection, TcpStream>> {
    let conn = ClientConnection::new(config.clone(), ServerName::try_from(name.to_owned())?)?;
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut tls = StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// One answer's status, reading its head and its `Content-Length` body; 0 when the
/// connection ended first.
fn answer(tls: &mut StreamOwned<ClientConnection, TcpStream>) -> u16 {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(head_end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if data.len() >= head_end + 4 + length {
                return head
                    .strip_prefix("http/1.1 ")
                    .and_then(|t| t.get(..3))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
        }
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => return 0,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
}

/// `requests` requests from `connections` reader connections at once, each connection sending
/// [`LOGGED_METHOD`] requests and every [`REFUSED_EVERY`]th a [`REFUSED_METHOD`] one (then a
/// new connection).
/// `name` is what the node's certificate names (it is reached through a port forward).
pub(super) fn flood(
    pki: &Path,
    name: &str,
    port: u16,
    connections: usize,
    requests: usize,
) -> Result<Flood> {
    let config = client_config(pki, Role::Reader)?;
    let logged = format!(
        "{} /v1/status HTTP/1.1\r\nhost: node\r\n\r\n",
        "A".repeat(LOGGED_METHOD)
    );
    let refused = format!(
        "{} /v1/status HTTP/1.1\r\nhost: node\r\n\r\n",
        "A".repeat(REFUSED_METHOD)
    );
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<Result<Flood>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                scope.spawn(|| -> Result<Flood> {
                    let mut mine = Flood::default();
                    let mut tls = None;
                    let mut on_this = 0;
                    while next.fetch_add(1, Ordering::SeqCst) < requests {
                        let stream = match &mut tls {
                            Some(stream) => stream,
                            None => {
                                mine.connections += 1;
                                on_this = 0;
                                tls.insert(connect(&config, name, port)?)
                            }
                        };
                        on_this += 1;
                        let last = on_this % REFUSED_EVERY == 0;
                        let request = if last { &refused } else { &logged };
                        // The parser refuses an over-long head before it is all sent: the
                        // rest then meets a closed connection, and the 431 may be lost.
                        let _ = stream
                            .write_all(request.as_bytes())
                            .and_then(|()| stream.flush());
                        let status = answer(stream);
                        *mine.answers.entry(status).or_default() += 1;
                        mine.requests += 1;
                        if last || status == 0 {
                            tls = None;
                        }
                    }
                    Ok(mine)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a flood thread panicked")))
            })
            .collect()
    });
    let mut total = Flood {
        took: started.elapsed(),
        ..Flood::default()
    };
    for result in results {
        let one = result?;
        total.requests += one.requests;
        total.connections += one.connections;
        for (status, n) in one.answers {
            *total.answers.entry(status).or_default() += n;
        }
    }
    Ok(total)
}
