//! A hostile client: raw HTTP/1.1 over mutual TLS (blocking rustls), sending whatever a test
//! writes — a 400 KB method, a declared gigabyte trickled a byte at a time — and reading what
//! comes back, with a deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use slate_api::{client_cert_file, client_key_file, Role, CA_CERT};

/// One TLS connection to the server under test.
pub struct Raw {
    pub tls: StreamOwned<ClientConnection, TcpStream>,
}

fn config(dir: &Path, role: Role) -> Arc<ClientConfig> {
    let path = |name: String| dir.join(name);
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path(CA_CERT.to_owned())).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_file_iter(path(client_cert_file(role)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(path(client_key_file(role))).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    Arc::new(config)
}

impl Raw {
    /// Connects and completes the handshake as `role` (certificates from `gen_certs` in
    /// `dir`).
    pub fn connect(dir: &Path, addr: SocketAddr, role: Role) -> Raw {
        Raw::handshake(config(dir, role), addr)
    }

    /// Connects without a client certificate (as a client of a node in maintenance mode does),
    /// trusting the server's self-signed certificate `server_cert_pem`.
    pub fn connect_anonymous(addr: SocketAddr, server_cert_pem: &[u8]) -> Raw {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(server_cert_pem) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Raw::handshake(Arc::new(config), addr)
    }

    fn handshake(config: Arc<ClientConfig>, addr: SocketAddr) -> Raw {
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let conn = ClientConnection::new(config, name).unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut tls = StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).unwrap();
        }
        Raw { tls }
    }

    /// Writes `data`; false when the server closed or reset the connection.
    pub fn send(&mut self, data: &[u8]) -> bool {
        self.tls.write_all(data).is_ok() && self.tls.flush().is_ok()
    }

    /// Reads one answer's head and body (by `Content-Length`), or what arrived until the
    /// server closed the connection or `within` passed. The status, 0 when none came.
    pub fn answer(&mut self, within: Duration) -> (u16, String) {
        let deadline = Instant::now() + within;
        let mut data = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Some(done) = complete(&data) {
                data.truncate(done);
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.tls.sock.set_read_timeout(Some(left)).unwrap();
            match self.tls.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => data.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&data).into_owned();
        let status = text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|t| t.get(..3))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    /// Whether the server closed the connection within `within` (reading and discarding).
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.tls.sock.set_read_timeout(Some(left)).unwrap();
            match self.tls.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}

/// The length of a whole answer at the start of `data`, if it is all there.
fn complete(data: &[u8]) -> Option<usize> {
    let head = data.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = String::from_utf8_lossy(&data[..head]).to_ascii_lowercase();
    let length = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    (data.len() >= head + length).then_some(head + length)
}

/// A request head: `METHOD PATH HTTP/1.1` with a host and the given extra header lines.
pub fn head(method: &str, path: &str, extra: &[&str]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: node\r\n");
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}
