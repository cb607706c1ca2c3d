//! The HTTPS server shared by the node API and services: mutual TLS, handshake and header
//! timeouts, the role from the client certificate, connections and graceful shutdown. What is
//! served over it is a `Site` (`http.rs`): the node routes here, a `JsonService` in
//! `service.rs`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::backend::NodeBackend;
use crate::certs::{self, CertError};
use crate::handlers::NodeSite;
use crate::http::{handle, Site};
use crate::tls;

/// The port the node API listens on by default (Talos' apid port).
pub const DEFAULT_PORT: u16 = 50000;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long open connections get to finish after shutdown before they are cut.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Where and with which certificates the server listens.
#[derive(Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// The CA that client certificates must chain to (PEM).
    pub ca_pem: Vec<u8>,
    /// The node's certificate chain (PEM), serverAuth.
    pub cert_pem: Vec<u8>,
    /// The node's private key (PEM).
    pub key_pem: Vec<u8>,
    /// Maintenance mode: no client certificate is asked for (`ca_pem` is unused) and only
    /// requests carrying this token reach the maintenance endpoints.
    pub maintenance_token: Option<String>,
}

impl ServerConfig {
    /// Reads `ca.crt`, `node.crt` and `node.key` from `dir` (as written by
    /// [`crate::gen_certs`]).
    pub fn from_dir(listen: SocketAddr, dir: &Path) -> Result<Self, CertError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| CertError::Io { path, source })
        };
        Ok(ServerConfig {
            listen,
            ca_pem: read(certs::CA_CERT)?,
            cert_pem: read(certs::NODE_CERT)?,
            key_pem: read(certs::NODE_KEY)?,
            maintenance_token: None,
        })
    }

    /// Mutual TLS: clients must present a certificate that chains to `client_ca_pem`.
    pub fn new(listen: SocketAddr, client_ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Self {
        ServerConfig {
            listen,
            ca_pem: client_ca_pem.to_vec(),
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
            maintenance_token: None,
        }
    }

    /// Maintenance mode (a node without a machine configuration): a self-signed certificate,
    /// no client certificates, and `token` required for the maintenance endpoints.
    pub fn maintenance(listen: SocketAddr, cert_pem: &[u8], key_pem: &[u8], token: &str) -> Self {
        ServerConfig {
            listen,
            ca_pem: Vec::new(),
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
            maintenance_token: Some(token.to_owned()),
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("key_pem", &"<redacted>")
            .field("maintenance", &self.maintenance_token.is_some())
            .finish_non_exhaustive()
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] CertError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the API server: {0}")]
    Runtime(std::io::Error),
    #[error("the API server thread panicked")]
    Panicked,
    /// A service was given something only the node API has (a maintenance token), or routes
    /// that cannot be served.
    #[error("cannot serve this service: {0}")]
    Service(String),
}

/// A shutdown flag that any thread can raise and the server awaits. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the flag (idempotent; callable from any thread, sync or async).
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once the flag is raised.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|raised| *raised).await;
    }
}

/// A server running on its own thread, from [`spawn`].
///
/// Dropping the handle detaches the server (it keeps running); call
/// [`ServerHandle::shutdown`] to stop it.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    shutdown: Shutdown,
    thread: std::thread::JoinHandle<()>,
}

impl ServerHandle {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The flag that stops this server, for another thread to hold.
    pub fn shutdown_signal(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Stops accepting, gives open requests and streams up to 2 s to finish (a follower of
    /// the log keeps receiving lines meanwhile), cuts what is left and waits for the thread.
    pub fn shutdown(self) -> Result<(), ServerError> {
        self.shutdown.trigger();
        self.join()
    }

    /// Waits for the server thread (until some holder of the signal triggers it).
    pub fn join(self) -> Result<(), ServerError> {
        self.thread.join().map_err(|_| ServerError::Panicked)
    }
}

/// Serves the API on `config.listen` until `shutdown` resolves. Must run inside a tokio runtime
/// (any flavour) with I/O and time enabled; backend calls go to its blocking pool.
pub async fn serve(
    config: ServerConfig,
    backend: Arc<dyn NodeBackend>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let site = node_site(&config, backend);
    serve_site(config, site, shutdown).await
}

fn node_site(config: &ServerConfig, backend: Arc<dyn NodeBackend>) -> Arc<dyn Site> {
    Arc::new(NodeSite {
        backend,
        maintenance_token: config.maintenance_token.as_deref().map(Arc::from),
    })
}

/// [`serve`] for any site.
pub(crate) async fn serve_site(
    config: ServerConfig,
    site: Arc<dyn Site>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let listening = Listening::new(&config, site)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    run(listener, listening, shutdown).await;
    Ok(())
}

/// [`serve`] for a non-async program: builds a runtime and blocks the calling thread until
/// `shutdown` is triggered (from another thread).
pub fn serve_blocking(
    config: ServerConfig,
    backend: Arc<dyn NodeBackend>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    let rt = runtime()?;
    let result = rt.block_on(serve(config, backend, async move { shutdown.wait().await }));
    rt.shutdown_timeout(Duration::from_millis(100));
    result
}

/// Binds, checks the certificates and starts the server on its own thread; errors (bad
/// certificate, address in use) are returned here, before anything runs.
pub fn spawn(
    config: ServerConfig,
    backend: Arc<dyn NodeBackend>,
) -> Result<ServerHandle, ServerError> {
    let site = node_site(&config, backend);
    spawn_site(config, site)
}

/// [`spawn`] for any site.
pub(crate) fn spawn_site(
    config: ServerConfig,
    site: Arc<dyn Site>,
) -> Result<ServerHandle, ServerError> {
    let listening = Listening::new(&config, site)?;
    let bind_err = |source| ServerError::Bind {
        addr: config.listen,
        source,
    };
    let listener = std::net::TcpListener::bind(config.listen).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    let local_addr = listener.local_addr().map_err(bind_err)?;
    let rt = runtime()?;
    let listener = {
        let _guard = rt.enter();
        TcpListener::from_std(listener).map_err(bind_err)?
    };
    let shutdown = Shutdown::new();
    let signal = shutdown.clone();
    let thread = std::thread::Builder::new()
        .name("slate-api".into())
        .spawn(move || {
            rt.block_on(run(listener, listening, signal.wait()));
            rt.shutdown_timeout(Duration::from_millis(100));
        })
        .map_err(ServerError::Runtime)?;
    Ok(ServerHandle {
        local_addr,
        shutdown,
        thread,
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("slate-api-worker")
        .build()
        .map_err(ServerError::Runtime)
}

/// What every connection of one server shares.
#[derive(Clone)]
struct Listening {
    acceptor: TlsAcceptor,
    site: Arc<dyn Site>,
}

impl Listening {
    fn new(config: &ServerConfig, site: Arc<dyn Site>) -> Result<Self, CertError> {
        let client_ca = match config.maintenance_token {
            Some(_) => None,
            None => Some(config.ca_pem.as_slice()),
        };
        let tls = tls::server_config(client_ca, &config.cert_pem, &config.key_pem)?;
        Ok(Listening {
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            site,
        })
    }
}

async fn run(listener: TcpListener, listening: Listening, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    conns.spawn(connection(tcp, peer, listening.clone(), drain_rx.clone()));
                }
                Err(e) => {
                    listening.site.log_api(&format!("api: accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    drain_tx.send_replace(true);
    let drained = async { while conns.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, drained).await;
    conns.abort_all();
}

async fn connection(
    tcp: TcpStream,
    addr: SocketAddr,
    listening: Listening,
    mut drain: watch::Receiver<bool>,
) {
    let Listening { acceptor, site } = listening;
    let _ = tcp.set_nodelay(true);
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp).into_fallible());
    let stream = match handshake.await {
        Ok(Ok(stream)) => stream,
        Ok(Err((e, tcp))) => {
            site.log_api(&format!("api: {addr}: TLS handshake refused: {e}"));
            linger(tcp).await;
            return;
        }
        Err(_) => {
            site.log_api(&format!("api: {addr}: TLS handshake timed out"));
            return;
        }
    };
    let role = tls::role_of(stream.get_ref().1.peer_certificates());
    let service = service_fn(move |req| handle(req, site.clone(), addr, role));
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = drain.wait_for(|d| *d) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// After a refused handshake (the alert is already sent): close our side and read what the
/// client had already sent, so that the kernel does not answer unread data with a reset that
/// could destroy the alert before the client reads it.
async fn linger(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while let Ok(n @ 1..) = tcp.read(&mut buf).await {
            total += n;
            if total > 1 << 20 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}
