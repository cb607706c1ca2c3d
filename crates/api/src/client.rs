//! The blocking client used by the `slate` CLI: one HTTPS/1.1 connection per call.

use std::net::IpAddr;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use crate::body::{collect, next_chunk, Body, CollectError};
use crate::certs::{self, CertError};
use crate::routes::{route_of, Endpoint};
use crate::server::DEFAULT_PORT;
use crate::tls;
use crate::types::{ApiError, ErrorCode, Role, UploadedBundle};
use crate::upload::{ChannelWriter, UPLOAD_CHANNEL};

mod endpoints;
mod shared;
pub use shared::ClientTls;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_RESPONSE: usize = 16 << 20;

/// Errors of [`Client`] calls.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid node address {0:?} (expected HOST, HOST:PORT or [IPv6]:PORT)")]
    Address(String),
    #[error(transparent)]
    Config(#[from] CertError),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// The TLS handshake failed or the node refused this client's certificate.
    #[error("TLS failure with {addr}: {message}")]
    Tls { addr: String, message: String },
    #[error("{addr} did not answer within {0:?}", .timeout)]
    Timeout { addr: String, timeout: Duration },
    /// HTTP 409: another sequence holds the node's lock.
    #[error("the node is locked: {0}")]
    Locked(String),
    /// HTTP 403: this client's role may not do that.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// HTTP 400 `invalid_argument`.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// HTTP 400 `unsupported`.
    #[error("not supported by the node: {0}")]
    Unsupported(String),
    /// HTTP 404 `not_found`: no such endpoint, or a service has no such resource.
    #[error("not found: {0}")]
    NotFound(String),
    /// Any other error answer.
    #[error("the node answered HTTP {status} ({code:?}): {message}")]
    Server {
        status: u16,
        code: ErrorCode,
        message: String,
    },
    /// The connection broke or the answer could not be understood.
    #[error("protocol error with {addr}: {message}")]
    Protocol { addr: String, message: String },
}

/// A blocking client of one node. Each call opens a connection; streaming calls hold theirs
/// until the stream ends or the callback breaks. Calls block the thread: do not use from
/// inside an async runtime.
pub struct Client {
    /// Shared by the clients of one [`ClientTls`]; a client of its own otherwise.
    rt: Arc<tokio::runtime::Runtime>,
    connector: TlsConnector,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    request_timeout: Duration,
    /// Maintenance mode: sent with every request.
    maintenance_token: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.addr())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the node at `addr` (`HOST`, `HOST:PORT`, `[IPv6]:PORT`; the port defaults
    /// to [`DEFAULT_PORT`]), trusting `ca_pem` and presenting the certificate `cert_pem`/`key_pem`
    /// (whose `O=os:<role>` decides what it may do). The node's certificate must name `HOST`.
    pub fn new(
        addr: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, ClientError> {
        Self::build(addr, tls::client_config(ca_pem, Some((cert_pem, key_pem)))?)
    }

    /// A client presenting no certificate: the node refuses it at the handshake. Only useful
    /// to check exactly that.
    pub fn without_certificate(addr: &str, ca_pem: &[u8]) -> Result<Self, ClientError> {
        Self::build(addr, tls::client_config(ca_pem, None)?)
    }

    /// [`Client::new`] with `ca.crt` and `<role>.crt`/`<role>.key` from `dir` (as written by
    /// [`crate::gen_certs`]).
    pub fn from_dir(addr: &str, dir: &Path, role: Role) -> Result<Self, ClientError> {
        let read = |name: &str| {
            let path = dir.join(name);
            certs::read_pem(&path).map_err(|source| CertError::Io {
                path,
                cause: source,
            })
        };
        let ca = read(certs::CA_CERT)?;
        let cert = read(&certs::client_cert_file(role))?;
        let key = read(&certs::client_key_file(role))?;
        Self::new(addr, &ca, &cert, &key)
    }

    fn build(addr: &str, config: rustls::ClientConfig) -> Result<Self, ClientError> {
        let (host, port) = parse_addr(addr).ok_or_else(|| ClientError::Address(addr.into()))?;
        let server_name =
            ServerName::try_from(host.clone()).map_err(|_| ClientError::Address(addr.into()))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Protocol {
                addr: addr.into(),
                message: format!("cannot start the I/O runtime: {e}"),
            })?;
        Ok(Client {
            rt: Arc::new(rt),
            connector: TlsConnector::from(Arc::new(config)),
            host,
            port,
            server_name,
            request_timeout: REQUEST_TIMEOUT,
            maintenance_token: None,
        })
    }

    /// A client of a node in maintenance mode: no client certificate, the token the node
    /// printed on its console, and its self-signed certificate accepted when its SHA-256
    /// fingerprint is `pin` (any certificate when `pin` is `None`: `--insecure`).
    pub fn maintenance(
        addr: &str,
        token: &str,
        pin: Option<[u8; 32]>,
    ) -> Result<Self, ClientError> {
        let mut client = Self::build(addr, tls::maintenance_client_config(pin)?)?;
        client.maintenance_token = Some(token.to_owned());
        Ok(client)
    }

    /// Verify the node's certificate against `name` instead of the host of the address (e.g.
    /// when connecting through a port forward).
    pub fn with_server_name(mut self, name: &str) -> Result<Self, ClientError> {
        self.server_name =
            ServerName::try_from(name.to_owned()).map_err(|_| ClientError::Address(name.into()))?;
        Ok(self)
    }

    /// The time limit of non-streaming calls (default 120 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// `HOST:PORT` as connected to.
    pub fn addr(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }

    /// `POST /v1/bundles` (admin): upload an installer bundle. `write_tar` writes the tar stream
    /// of its OCI layout on a thread of its own while the request streams it to the node (no
    /// copy on disk on either side); `on_progress` gets the bytes sent so far.
    pub fn upload_bundle(
        &self,
        write_tar: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send + 'static,
        on_progress: impl Fn(u64) + Send + 'static,
    ) -> Result<UploadedBundle, ClientError> {
        let route = route_of(Endpoint::UploadBundle);
        let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_CHANNEL);
        let producer = std::thread::spawn(move || {
            let mut writer = ProgressWriter {
                inner: ChannelWriter::new(tx),
                on_progress,
            };
            write_tar(&mut writer)?;
            std::io::Write::flush(&mut writer)
        });
        let answer = self.rt.block_on(async {
            let (mut resp, conn) = self
                .send(
                    route.method,
                    route.path,
                    Body::Stream(rx),
                    Some("application/x-tar"),
                )
                .await?;
            let data = collect(resp.body_mut(), MAX_RESPONSE).await;
            close(conn).await;
            let data = data.map_err(|_| self.protocol("the upload's answer broke".into()))?;
            serde_json::from_slice::<UploadedBundle>(&data)
                .map_err(|e| self.protocol(format!("cannot decode the answer: {e}")))
        });
        let produced = producer
            .join()
            .map_err(|_| self.protocol("the bundle writer panicked".into()))?;
        let uploaded = answer?;
        produced.map_err(|e| self.protocol(format!("writing the bundle: {e}")))?;
        Ok(uploaded)
    }

    fn unary<T: DeserializeOwned, B: Serialize>(
        &self,
        endpoint: Endpoint,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let route = route_of(endpoint);
        self.call(route.method, route.path, body)
    }

    /// `METHOD PATH` of a service served with [`crate::serve_service`] (or a node route):
    /// `body` sent as JSON, the answer decoded as `T`, error answers as for the node calls
    /// (`()` takes an answer of `null`; [`serde_json::Value`] takes anything). Bounded by
    /// [`Client::with_timeout`].
    pub fn call<T: DeserializeOwned, B: Serialize>(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        if !path_and_query.starts_with('/') {
            return Err(self.protocol(format!(
                "{path_and_query:?} is not a path (it must start with /)"
            )));
        }
        let body = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| self.protocol(e.to_string()))?,
            None => Vec::new(),
        };
        let timeout = self.request_timeout;
        self.rt.block_on(async {
            let call = async {
                let content_type = (!body.is_empty()).then_some("application/json");
                let (mut resp, conn) = self
                    .send(method, path_and_query, Body::full(body), content_type)
                    .await?;
                let data = collect(resp.body_mut(), MAX_RESPONSE).await;
                close(conn).await;
                let data = match data {
                    Ok(data) => data,
                    Err(CollectError::TooLarge) => {
                        return Err(self.protocol("answer too large".into()))
                    }
                    Err(CollectError::Body(e)) => return Err(self.broken(&e)),
                };
                serde_json::from_slice(&data)
                    .map_err(|e| self.protocol(format!("cannot decode the answer: {e}")))
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Timeout {
                        addr: self.addr(),
                        timeout,
                    })
                })
        })
    }

    /// `GET path` of a route answered in text (`/metrics`): the body, which must be UTF-8;
    /// error answers as for [`Client::call`].
    pub fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let timeout = self.request_timeout;
        self.rt.block_on(async {
            let call = async {
                let (mut resp, conn) = self.send("GET", path, Body::full(Vec::new()), None).await?;
                let data = collect(resp.body_mut(), MAX_RESPONSE).await;
                close(conn).await;
                match data {
                    Ok(data) => String::from_utf8(data)
                        .map_err(|_| self.protocol("the answer is not UTF-8".into())),
                    Err(CollectError::TooLarge) => Err(self.protocol("answer too large".into())),
                    Err(CollectError::Body(e)) => Err(self.broken(&e)),
                }
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Timeout {
                        addr: self.addr(),
                        timeout,
                    })
                })
        })
    }

    fn lines(
        &self,
        endpoint: Endpoint,
        follow: bool,
        mut on_line: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(), ClientError> {
        let route = route_of(endpoint);
        let path = format!("{}?follow={follow}", route.path);
        self.rt.block_on(async {
            let (mut resp, conn) = self
                .send(route.method, &path, Body::full(Vec::new()), None)
                .await?;
            let mut pending: Vec<u8> = Vec::new();
            let result = loop {
                let chunk = match next_chunk(resp.body_mut()).await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(self.broken(&e)),
                };
                pending.extend_from_slice(&chunk);
                let mut stop = false;
                while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=i).collect();
                    let line = String::from_utf8_lossy(&line[..i]);
                    if on_line(line.trim_end_matches('\r')).is_break() {
                        stop = true;
                        break;
                    }
                }
                if stop {
                    pending.clear();
                    break Ok(());
                }
            };
            close(conn).await;
            if result.is_ok() && !pending.is_empty() {
                let _ = on_line(&String::from_utf8_lossy(&pending));
            }
            result
        })
    }

    /// Connects, sends one request and returns the response once its head is in (an error
    /// status already turned into its [`ClientError`]), with the connection's task.
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Body,
        content_type: Option<&'static str>,
    ) -> Result<(Response<Incoming>, JoinHandle<Result<(), hyper::Error>>), ClientError> {
        let addr = self.addr();
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((&*self.host, self.port)),
        )
        .await
        .map_err(|_| ClientError::Timeout {
            addr: addr.clone(),
            timeout: CONNECT_TIMEOUT,
        })?
        .map_err(|source| ClientError::Connect {
            addr: addr.clone(),
            source,
        })?;
        let _ = tcp.set_nodelay(true);
        let handshake = self.connector.connect(self.server_name.clone(), tcp);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| ClientError::Timeout {
                addr: addr.clone(),
                timeout: CONNECT_TIMEOUT,
            })?
            .map_err(|e| self.broken(&e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.broken(&e))?;
        let conn = tokio::spawn(conn);

        let method =
            Method::from_bytes(method.as_bytes()).map_err(|e| self.protocol(e.to_string()))?;
        let mut req = Request::new(body);
        *req.method_mut() = method;
        *req.uri_mut() = path.parse().map_err(|e| self.protocol(format!("{e}")))?;
        let headers = req.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&addr) {
            headers.insert(HOST, host);
        }
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/plain"),
        );
        if let Some(content_type) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        }
        if let Some(token) = &self.maintenance_token {
            let value = HeaderValue::from_str(token)
                .map_err(|_| self.protocol("the maintenance token is not a header value".into()))?;
            headers.insert(crate::handlers::MAINTENANCE_TOKEN_HEADER, value);
        }
        let resp = match sender.send_request(req).await {
            Ok(resp) => resp,
            Err(e) => {
                // The connection's own error carries the cause (e.g. the TLS alert).
                let mut conn = conn;
                let conn_err = match tokio::time::timeout(Duration::from_secs(1), &mut conn).await {
                    Ok(Ok(Err(conn_err))) => Some(conn_err),
                    Ok(_) => None,
                    Err(_) => {
                        close(conn).await;
                        None
                    }
                };
                return Err(match conn_err {
                    Some(ce) if tls::explain(&ce).is_some() => self.broken(&ce),
                    _ => self.broken(&e),
                });
            }
        };
        if resp.status().is_success() {
            return Ok((resp, conn));
        }
        let status = resp.status();
        let mut resp = resp;
        let data = collect(resp.body_mut(), MAX_RESPONSE)
            .await
            .unwrap_or_default();
        close(conn).await;
        Err(self.status_error(status, &data))
    }

    fn status_error(&self, status: StatusCode, data: &[u8]) -> ClientError {
        let Ok(ApiError { code, message }) = serde_json::from_slice::<ApiError>(data) else {
            return ClientError::Server {
                status: status.as_u16(),
                code: ErrorCode::Unknown,
                message: String::from_utf8_lossy(data).into_owned(),
            };
        };
        match code {
            ErrorCode::Locked => ClientError::Locked(message),
            ErrorCode::PermissionDenied => ClientError::PermissionDenied(message),
            ErrorCode::InvalidArgument => ClientError::InvalidArgument(message),
            ErrorCode::Unsupported => ClientError::Unsupported(message),
            ErrorCode::NotFound => ClientError::NotFound(message),
            code => ClientError::Server {
                status: status.as_u16(),
                code,
                message,
            },
        }
    }

    /// A failed connection: a TLS error when that is the cause, else a protocol error.
    fn broken(&self, err: &(dyn std::error::Error + 'static)) -> ClientError {
        if let Some(message) = tls::explain(err) {
            return ClientError::Tls {
                addr: self.addr(),
                message,
            };
        }
        self.protocol(slate_sequencer::error_chain(err))
    }

    fn protocol(&self, message: String) -> ClientError {
        ClientError::Protocol {
            addr: self.addr(),
            message,
        }
    }
}

/// `(host, port)` of `HOST`, `HOST:PORT`, `IPv6`, `[IPv6]` or `[IPv6]:PORT`.
fn parse_addr(addr: &str) -> Option<(String, u16)> {
    let addr = addr.trim();
    if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
        return Some((sa.ip().to_string(), sa.port()));
    }
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Some((ip.to_string(), DEFAULT_PORT));
    }
    if let Some(inner) = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
        let ip: std::net::Ipv6Addr = inner.parse().ok()?;
        return Some((ip.to_string(), DEFAULT_PORT));
    }
    let (host, port) = match addr.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (addr, DEFAULT_PORT),
    };
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    valid.then(|| (host.to_owned(), port))
}

/// Reports the bytes handed to the channel after each chunk.
struct ProgressWriter<F> {
    inner: ChannelWriter,
    on_progress: F,
}

impl<F: Fn(u64)> std::io::Write for ProgressWriter<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let before = self.inner.sent;
        let n = self.inner.write(buf)?;
        if self.inner.sent != before {
            (self.on_progress)(self.inner.sent);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()?;
        (self.on_progress)(self.inner.sent);
        Ok(())
    }
}

/// Ends a connection's task and waits until it is gone. `abort` alone only marks it: on the
/// client's current-thread runtime the task, and the request body it owns, would live on until
/// the runtime next runs, so an upload's writer would wait forever on a channel nobody drains,
/// and a kept [`Client`] would hold its last connection open until its next call.
async fn close(conn: JoinHandle<Result<(), hyper::Error>>) {
    conn.abort();
    let _ = conn.await;
}

#[cfg(test)]
mod tests {
    use super::parse_addr;

    #[test]
    fn addresses() {
        let p = |a: &str| parse_addr(a);
        assert_eq!(p("10.0.0.5"), Some(("10.0.0.5".into(), 50000)));
        assert_eq!(p("10.0.0.5:1234"), Some(("10.0.0.5".into(), 1234)));
        assert_eq!(p("node-1.lan"), Some(("node-1.lan".into(), 50000)));
        assert_eq!(p("localhost:8443"), Some(("localhost".into(), 8443)));
        assert_eq!(p("[::1]:8443"), Some(("::1".into(), 8443)));
        assert_eq!(p("[::1]"), Some(("::1".into(), 50000)));
        assert_eq!(p("::1"), Some(("::1".into(), 50000)));
        assert_eq!(p("host:port"), None);
        assert_eq!(p(""), None);
        assert_eq!(p("a b:1"), None);
    }
}
