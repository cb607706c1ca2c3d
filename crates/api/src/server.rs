//! The HTTPS server shared by the node API and services: mutual TLS, the role from the client
//! certificate, connections per client and the limits below, on the listener every slate
//! server shares (`slate-https`: the accept loop, handshake and header timeouts, graceful
//! shutdown). What is served over it is a `Site` (`http.rs`): the node routes here, a
//! `JsonService` in `service.rs`.
//!
//! # What a client can make the server hold
//!
//! No client, of any role, grows the server's memory without bound (issue 19: a reader's
//! 400 KB methods, kept and printed whole, took a node down). With the default [`Limits`]:
//!
//! - at most [`MAX_CONNECTIONS`] (64) connections, half of them at most in their TLS handshake
//!   (10 s), [`CONNECTIONS_PER_CLIENT`] (8) per client certificate; more are closed or
//!   answered 429 at once;
//! - per connection: hyper's read buffer, which holds the request head, at most
//!   [`MAX_HEAD_BYTES`] (64 KiB; a longer head is refused with 431 by the parser), as much for
//!   its write buffer, rustls' buffers (about 100 KiB: records in and out), and the request
//!   being served: a JSON body of at most 64 KiB (node), 640 KiB (a machine configuration,
//!   admin) or 1 MiB (a service), or an upload's channel of 16 chunks of at most 64 KiB
//!   (admin), or a log or event stream's 64 queued lines plus the backend's batch (machined:
//!   64 journal lines of at most 4 KiB), 512 KiB;
//! - the log queue: 256 lines of at most 1 KiB (`logq.rs`), whatever the site does with them;
//!
//! so at most 64 × (64 + 64 + 100 + 1024) KiB ≈ 80 MiB, reached only with admins' bodies; a
//! reader holds at most 8 × (228 + 512) KiB ≈ 6 MiB per certificate (following logs it does
//! not read). machined's journal adds its own bound (1 MiB of lines of at most 4 KiB,
//! `crates/machined/src/base/journal.rs`), and each stream a thread of its own. Time is bounded
//! too: a head within [`Limits::header_timeout`], a body at [`Limits::body_min_rate`] with no
//! gap longer than [`Limits::body_timeout`]; a refusal is answered before a body of declared
//! length is read (a chunked one, as slate's client streams uploads, is read out first, within
//! those timeouts).

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sha2::Digest as _;
use slate_https::{Accept, Bound, Connection, Drain, Handler, Refusal, StartError};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::backend::NodeBackend;
use crate::certs::{self, CertError};
use crate::handlers::NodeSite;
use crate::http::{handle, Served, Site};
use crate::limits::{more, refuse_over_limit, ClientKey, PerClient, Quiet};
pub use crate::limits::{
    Limits, BODY_MIN_RATE, BODY_TIMEOUT, CONNECTIONS_PER_CLIENT, HEADER_TIMEOUT, MAX_CONNECTIONS,
    MAX_HEAD_BYTES,
};
use crate::logq::LogQueue;
use crate::metrics::ApiMetrics;
use crate::tls;

/// The port the node API listens on by default (Talos' apid port).
pub const DEFAULT_PORT: u16 = 50000;

/// The server's name: its thread's, and `<name>-worker` for its runtime's blocking threads.
const THREAD: &str = "slate-api";
/// At most one log line per this interval for each kind of refusal a flood repeats.
const QUIET: Duration = Duration::from_secs(10);

/// Where and with which certificates the server listens.
#[derive(Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// The client CA: client certificates must chain to it (PEM); their `O=os:<role>` is
    /// their role.
    pub ca_pem: Vec<u8>,
    /// A server that hears from nodes (the rollout operator): the fleet CA, whose chains
    /// (through a node's issuing CA) are callers of [`crate::Role::Node`] and nothing more.
    pub node_ca_pem: Option<Vec<u8>>,
    /// The node's certificate chain (PEM), serverAuth.
    pub cert_pem: Vec<u8>,
    /// The node's private key (PEM).
    pub key_pem: Vec<u8>,
    /// Maintenance mode: no client certificate is asked for (`ca_pem` is unused) and only
    /// requests carrying this token reach the maintenance endpoints.
    pub maintenance_token: Option<String>,
    /// Timeouts, sizes and connection counts ([`Limits::default`] unless changed).
    pub limits: Limits,
}

impl ServerConfig {
    /// A fleet service's configuration from a [`crate::gen_certs`] directory: clients of
    /// `client-ca.crt`, nodes of `ca.crt` (the fleet CA), serving `service.crt`/`service.key`.
    pub fn from_dir(listen: SocketAddr, dir: &Path) -> Result<Self, CertError> {
        let read = |name: &str| certs::read_pki_file(dir, name);
        Ok(ServerConfig {
            listen,
            ca_pem: read(certs::CLIENT_CA_CERT)?,
            node_ca_pem: Some(read(certs::CA_CERT)?),
            cert_pem: read(certs::SERVICE_CERT)?,
            key_pem: read(certs::SERVICE_KEY)?,
            maintenance_token: None,
            limits: Limits::default(),
        })
    }

    /// Mutual TLS: clients must present a certificate that chains to `client_ca_pem`.
    pub fn new(listen: SocketAddr, client_ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Self {
        ServerConfig {
            listen,
            ca_pem: client_ca_pem.to_vec(),
            node_ca_pem: None,
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
            maintenance_token: None,
            limits: Limits::default(),
        }
    }

    /// Maintenance mode (a node without a machine configuration): a self-signed certificate,
    /// no client certificates, and `token` required for the maintenance endpoints.
    pub fn maintenance(listen: SocketAddr, cert_pem: &[u8], key_pem: &[u8], token: &str) -> Self {
        ServerConfig {
            listen,
            ca_pem: Vec::new(),
            node_ca_pem: None,
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
            maintenance_token: Some(token.to_owned()),
            limits: Limits::default(),
        }
    }

    /// The same configuration with other [`Limits`].
    pub fn with_limits(self, limits: Limits) -> Self {
        ServerConfig { limits, ..self }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("key_pem", &"<redacted>")
            .field("maintenance", &self.maintenance_token.is_some())
            .field("limits", &self.limits)
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
    let (listening, accept) = Listening::new(&config, site)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    slate_https::run(listener, accept, listening, shutdown).await;
    Ok(())
}

/// [`serve`] for a non-async program: builds a runtime and blocks the calling thread until
/// `shutdown` is triggered (from another thread).
pub fn serve_blocking(
    config: ServerConfig,
    backend: Arc<dyn NodeBackend>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    let rt = slate_https::runtime(THREAD).map_err(ServerError::Runtime)?;
    let result = rt.block_on(serve(config, backend, async move { shutdown.wait().await }));
    slate_https::stop(rt);
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
    let (listening, accept) = Listening::new(&config, site)?;
    let bind_err = |source| ServerError::Bind {
        addr: config.listen,
        source,
    };
    let bound = Bound::bind(config.listen).map_err(bind_err)?;
    let local_addr = bound.local_addr();
    let shutdown = Shutdown::new();
    let signal = shutdown.clone();
    let thread = bound
        .spawn(
            THREAD,
            accept,
            listening,
            async move { signal.wait().await },
        )
        .map_err(|e| match e {
            StartError::Runtime(e) => ServerError::Runtime(e),
            StartError::Listen(e) => bind_err(e),
        })?;
    Ok(ServerHandle {
        local_addr,
        shutdown,
        thread,
    })
}

/// What every connection of one server shares.
struct Listening {
    served: Arc<Served>,
    /// Maintenance mode: no client certificate, so connections are counted per address.
    per_peer: bool,
    /// Who the verified client certificates stand for (none in maintenance mode).
    trust: Option<Arc<tls::ClientTrust>>,
    per_client: Arc<PerClient>,
    quiet: Notes,
}

/// The refusals a flood repeats, each logged at most once per [`QUIET`].
struct Notes {
    full: Quiet,
    handshakes: Quiet,
    over_limit: Quiet,
    refused_tls: Quiet,
    bad_request: Quiet,
}

impl Listening {
    /// The server's side of its connections, and how its listener accepts them.
    fn new(config: &ServerConfig, site: Arc<dyn Site>) -> Result<(Arc<Self>, Accept), ServerError> {
        let trust = match config.maintenance_token {
            Some(_) => None,
            None => Some(Arc::new(tls::ClientTrust::new(
                &config.ca_pem,
                config.node_ca_pem.as_deref(),
            )?)),
        };
        let tls = tls::server_config(trust.clone(), &config.cert_pem, &config.key_pem)?;
        let logged = site.clone();
        let metrics = Arc::new(ApiMetrics::new());
        let log = LogQueue::start(
            Arc::new(move |line: &str| logged.log_api(line)),
            metrics.log_dropped.clone(),
        )
        .map_err(ServerError::Runtime)?;
        let limits = &config.limits;
        let accept = Accept::tls(Arc::new(tls), slate_https::DEFAULT_HANDSHAKE_TIMEOUT)
            .with_limits(limits.max_connections, limits.max_handshakes())
            .handshakes_outlive_shutdown();
        let listening = Listening {
            served: Arc::new(Served {
                site,
                log,
                limits: Arc::new(limits.clone()),
                metrics,
            }),
            per_peer: trust.is_none(),
            trust,
            per_client: Arc::default(),
            quiet: Notes {
                full: Quiet::new(QUIET),
                handshakes: Quiet::new(QUIET),
                over_limit: Quiet::new(QUIET),
                refused_tls: Quiet::new(QUIET),
                bad_request: Quiet::new(QUIET),
            },
        };
        Ok((Arc::new(listening), accept))
    }

    fn log(&self, line: String) {
        self.served.log.push(line);
    }
}

impl Handler for Listening {
    fn serve(self: Arc<Self>, conn: Connection, drain: Drain) -> impl Future<Output = ()> + Send {
        connection(self, conn, drain)
    }

    fn refused(&self, refusal: Refusal<'_>) {
        self.served.metrics.refused(match refusal {
            Refusal::Accept(_) => "accept",
            Refusal::Full { .. } => "connections",
            Refusal::Handshakes { .. } => "handshakes",
            Refusal::Handshake { .. } => "tls",
            Refusal::HandshakeTimedOut { .. } => "handshake_timeout",
        });
        let quiet = match refusal {
            Refusal::Accept(_) => return self.log(format!("api: {refusal}")),
            Refusal::Full { .. } => &self.quiet.full,
            Refusal::Handshakes { .. } => &self.quiet.handshakes,
            Refusal::Handshake { .. } | Refusal::HandshakeTimedOut { .. } => {
                &self.quiet.refused_tls
            }
        };
        if let Some(quiet) = quiet.note() {
            self.log(format!("api: {refusal}{}", more(quiet)));
        }
    }
}

/// A connection past its handshake: its caller, its place among its client's connections (or
/// a 429), then the site's requests.
async fn connection(listening: Arc<Listening>, conn: Connection, mut drain: Drain) {
    let Connection { stream, peer: addr } = conn;
    let limits = listening.served.limits.clone();
    if matches!(stream, slate_https::Stream::Tls(_)) {
        listening.served.metrics.handshake(stream.resumed());
    }
    let peer_certs = stream.peer_certificates();
    let caller = listening
        .trust
        .as_ref()
        .and_then(|trust| trust.caller(peer_certs));
    let role = caller.as_ref().map(|c| c.role);
    let key = match peer_certs.and_then(<[_]>::first) {
        Some(cert) if !listening.per_peer => {
            ClientKey::Certificate(sha2::Sha256::digest(cert.as_ref()).into())
        }
        _ => ClientKey::Peer(addr.ip()),
    };
    let Some(_place) = listening
        .per_client
        .take(key, limits.connections_per_client)
    else {
        listening.served.metrics.refused("per_client");
        if let Some(quiet) = listening.quiet.over_limit.note() {
            listening.log(format!(
                "api: {addr}: refused a connection (429): {key} holds {} already{}",
                limits.connections_per_client,
                more(quiet)
            ));
        }
        refuse_over_limit(TokioIo::new(stream), &limits).await;
        return;
    };
    let served = listening.served.clone();
    let service = service_fn(move |req| handle(req, served.clone(), addr, caller.clone()));
    let mut http = slate_https::http1(limits.header_timeout);
    http.max_buf_size(MAX_HEAD_BYTES);
    let result = slate_https::serve_http1(&http, stream, service, &mut drain).await;
    // A request hyper refused before it reached a route (a head over the limit: 431): the
    // client's text is not logged, only that it happened.
    match result {
        Err(e) if e.is_parse() => {
            if let Some(quiet) = listening.quiet.bad_request.note() {
                let role = role.map_or("no role", crate::types::Role::as_str);
                listening.log(format!(
                    "api: {addr} ({role}): refused a request the HTTP parser did not take: {e}{}",
                    more(quiet)
                ));
            }
        }
        _ => {}
    }
}
