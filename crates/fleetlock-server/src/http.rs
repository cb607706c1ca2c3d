//! FleetLock over HTTP/1.1 (hyper on a current-thread tokio runtime, on the listener the node
//! API runs on: `slate-https`), plain or inside TLS ([`Tls`]: the listener then speaks TLS
//! only, mutual with a client CA). The path and method are judged before the body is read; the
//! body is read up to the cap; the store is called on tokio's blocking pool (a swap waits on
//! `flock` and fsync).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use slate_fleetlock::request::{MAX_BODY_LEN, PROTOCOL_HEADER};
use slate_fleetlock::{route, Answer, ErrorKind, Refusal, RequestError, SemaphoreStore, Service};
use slate_https::{Accept, Bound, Connection, Drain, Handler, StartError};
use tokio::sync::watch;

use crate::metrics::LockMetrics;
use crate::tls::Tls;

/// The server's name: its thread's, and `<name>-worker` for its runtime's blocking threads.
const THREAD: &str = "slate-fleetlock";
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// A body of at most 8 KiB that has not arrived in this time is not coming.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a refused request's body is read and dropped before the connection closes.
const DISCARD_LIMIT: usize = 1 << 20;
const DISCARD_TIME: Duration = Duration::from_secs(2);

/// Where the server's one-line-per-request log goes.
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the FleetLock server: {0}")]
    Runtime(std::io::Error),
    #[error("the FleetLock server thread panicked")]
    Panicked,
}

/// A bound listening socket; nothing is served until [`Server::run`] or [`Server::spawn`].
#[derive(Debug)]
pub struct Server {
    bound: Bound,
    tls: Option<Tls>,
    metrics: Arc<LockMetrics>,
}

/// A server on its own thread (tests, embedding). Dropping it detaches the thread.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl ServerHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets open requests finish for up to 2 s, waits for the thread.
    pub fn shutdown(self) -> Result<(), ServerError> {
        self.shutdown.send_replace(true);
        self.thread.join().map_err(|_| ServerError::Panicked)
    }
}

impl Server {
    /// Binds `addr` (port 0: any free port; see [`Server::local_addr`]).
    pub fn bind(addr: SocketAddr) -> Result<Self, ServerError> {
        let bound = Bound::bind(addr).map_err(|source| ServerError::Bind { addr, source })?;
        Ok(Server {
            bound,
            tls: None,
            metrics: Arc::default(),
        })
    }

    /// Counts into `metrics` (shared with the store's [`crate::Counted`], whose errors and
    /// lost swaps it then shows) rather than a registry of its own.
    pub fn with_metrics(mut self, metrics: Arc<LockMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Serves TLS only on this listener (a plain-HTTP request fails its handshake).
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.bound.local_addr()
    }

    /// Serves on the calling thread, until the process ends.
    pub fn run<S: SemaphoreStore + 'static>(
        self,
        service: Arc<Service<S>>,
        log: Log,
    ) -> Result<(), ServerError> {
        let rt = slate_https::runtime(THREAD).map_err(ServerError::Runtime)?;
        let addr = self.local_addr();
        let accept = self.accept();
        let listener = self
            .bound
            .listen(&rt)
            .map_err(|source| ServerError::Bind { addr, source })?;
        let (_never, shutdown) = watch::channel(false);
        let metrics = self.metrics.clone();
        let lock = Arc::new(Lock {
            service,
            log,
            metrics,
        });
        rt.block_on(slate_https::run(listener, accept, lock, stopped(shutdown)));
        Ok(())
    }

    /// Serves on a new thread until [`ServerHandle::shutdown`].
    pub fn spawn<S: SemaphoreStore + 'static>(
        self,
        service: Arc<Service<S>>,
        log: Log,
    ) -> Result<ServerHandle, ServerError> {
        let local_addr = self.local_addr();
        let accept = self.accept();
        let (shutdown, signal) = watch::channel(false);
        let metrics = self.metrics.clone();
        let lock = Arc::new(Lock {
            service,
            log,
            metrics,
        });
        let thread = self
            .bound
            .spawn(THREAD, accept, lock, stopped(signal))
            .map_err(|e| match e {
                StartError::Runtime(e) => ServerError::Runtime(e),
                StartError::Listen(source) => ServerError::Bind {
                    addr: local_addr,
                    source,
                },
            })?;
        Ok(ServerHandle {
            local_addr,
            shutdown,
            thread,
        })
    }

    fn accept(&self) -> Accept {
        self.tls.as_ref().map_or_else(Accept::plain, Tls::accept)
    }
}

/// Resolves when the flag is raised, or when its sender is gone.
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// The lock server's side of the listener's connections.
struct Lock<S: SemaphoreStore> {
    service: Arc<Service<S>>,
    log: Log,
    metrics: Arc<LockMetrics>,
}

impl<S: SemaphoreStore + 'static> Handler for Lock<S> {
    fn serve(self: Arc<Self>, conn: Connection, drain: Drain) -> impl Future<Output = ()> + Send {
        serve_http(conn, self, drain)
    }

    fn refused(&self, refusal: slate_https::Refusal<'_>) {
        (self.log)(&format!("fleetlock: {refusal}"));
    }
}

/// With a client certificate, a request for an id the certificate does not name (as a DNS
/// name: a node's certificate names the node) is refused: one node's credentials must not
/// take or free another's slot. A body that does not parse is the service's to refuse.
fn not_its_own(client: Option<&Vec<u8>>, body: &[u8]) -> Option<Refusal> {
    let der = client?;
    let params = slate_fleetlock::parse_body(body).ok()?;
    let id = params.id.as_str();
    let names_it =
        webpki::EndEntityCert::try_from(&rustls_pki_types::CertificateDer::from(der.as_slice()))
            .ok()
            .zip(rustls_pki_types::ServerName::try_from(id).ok())
            .is_some_and(|(cert, name)| cert.verify_is_valid_for_subject_name(&name).is_ok());
    (!names_it).then(|| {
        Refusal::new(
            ErrorKind::InvalidClientIdentity,
            format!("the client certificate does not name {id:?}: a client acts for itself only"),
        )
    })
}

/// HTTP/1.1 on a plain or TLS stream until the client closes, a timeout, or shutdown. With
/// mutual TLS, the client's certificate (DER) must name every id the connection takes or frees
/// a slot for.
async fn serve_http<S: SemaphoreStore + 'static>(
    conn: Connection,
    lock: Arc<Lock<S>>,
    mut drain: Drain,
) {
    let Connection { stream, peer } = conn;
    let client = stream
        .peer_certificates()
        .and_then(<[_]>::first)
        .map(|der| Arc::new(der.as_ref().to_vec()));
    let svc = service_fn(move |req| {
        let (lock, client) = (lock.clone(), client.clone());
        async move {
            let started = Instant::now();
            let (operation, outcome, resp) = if req.uri().path() == slate_metrics::PATH {
                scrape(req, &lock).await
            } else {
                let service = lock.service.clone();
                handle(req, peer, client, service, lock.log.clone()).await
            };
            lock.metrics.request(operation, outcome, started.elapsed());
            Ok::<_, Infallible>(resp)
        }
    });
    let http = slate_https::http1(HEADER_TIMEOUT);
    let _ = slate_https::serve_http1(&http, stream, svc, &mut drain).await;
}

async fn handle<S: SemaphoreStore + 'static>(
    req: Request<Incoming>,
    peer: SocketAddr,
    client: Option<Arc<Vec<u8>>>,
    service: Arc<Service<S>>,
    log: Log,
) -> (&'static str, &'static str, Response<Body>) {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let header = req
        .headers()
        .get(PROTOCOL_HEADER)
        .map(|v| v.as_bytes().to_vec());
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = req.into_body();
    let operation = route(&method, &path).map_or("other", |op| op.name());
    let (answer, refused_early) = match route(&method, &path) {
        Err(e) => {
            let shown: String = path.chars().take(100).collect();
            let summary = format!("{method} {shown}: refused");
            (Answer::refused(&e.into(), summary), true)
        }
        Ok(op) => match read_body(&mut body, declared).await {
            Err(refusal) => {
                let summary = format!("{}: refused: {}", op.name(), refusal.value);
                (Answer::refused(&refusal, summary), true)
            }
            Ok(bytes) => {
                let blocking = tokio::task::spawn_blocking(move || {
                    if let Some(refusal) = not_its_own(client.as_deref(), &bytes) {
                        let summary = format!("{}: refused: {}", op.name(), refusal.value);
                        return Answer::refused(&refusal, summary);
                    }
                    service.serve(op, header.as_deref(), &bytes)
                });
                match blocking.await {
                    Ok(answer) => (answer, false),
                    Err(e) => {
                        // A bug (a panic in a store): this request failed, the server goes on.
                        let refusal = Refusal::new(ErrorKind::FailedLock, "internal error");
                        let summary = format!("{}: internal error: {e}", op.name());
                        (Answer::refused(&refusal, summary), false)
                    }
                }
            }
        },
    };
    log(&format!(
        "fleetlock: {peer}: {} -> {}",
        answer.summary, answer.status
    ));
    let mut resp = respond(&answer);
    if refused_early {
        // The rest of the body was not wanted. Read and drop a bounded amount of it, so that
        // closing the socket with unread data does not make the kernel answer with a reset
        // that can destroy this answer before the client reads it; then close.
        discard(&mut body).await;
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    (operation, answer.outcome, resp)
}

/// `GET /metrics`: the counters and the groups' slots (read from the store on the blocking
/// pool). Anything else sent there is refused in FleetLock's `{kind,value}` form, with the
/// scrape's own reason; the body, if any, is not read.
async fn scrape<S: SemaphoreStore + 'static>(
    req: Request<Incoming>,
    lock: &Arc<Lock<S>>,
) -> (&'static str, &'static str, Response<Body>) {
    if let Err(e) = slate_metrics::check_scrape(req.method().as_str(), req.uri().query()) {
        let kind = match e {
            slate_metrics::ScrapeError::Method(_) => ErrorKind::MethodNotAllowed,
            slate_metrics::ScrapeError::Query(_) => ErrorKind::InvalidClientIdentity,
        };
        let refusal = Refusal::new(kind, e.to_string());
        let mut resp = respond(&Answer::refused(&refusal, String::new()));
        *resp.status_mut() = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        if kind == ErrorKind::MethodNotAllowed {
            resp.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET"));
        }
        let outcome = match e {
            slate_metrics::ScrapeError::Method(_) => "method_not_allowed",
            slate_metrics::ScrapeError::Query(_) => "bad_query",
        };
        return ("metrics", outcome, resp);
    }
    let (service, metrics) = (lock.service.clone(), lock.metrics.clone());
    match tokio::task::spawn_blocking(move || metrics.scrape(&service)).await {
        Ok(text) => {
            let mut resp = Response::new(Body(Some(Bytes::from(text))));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(slate_metrics::CONTENT_TYPE),
            );
            ("metrics", "ok", resp)
        }
        Err(e) => {
            let refusal = Refusal::new(ErrorKind::FailedSemInit, format!("internal error: {e}"));
            let resp = respond(&Answer::refused(&refusal, String::new()));
            ("metrics", "failed", resp)
        }
    }
}

/// The next data chunk of a body; `Ok(None)` at its end (trailers are skipped).
async fn next_chunk(body: &mut Incoming) -> Result<Option<Bytes>, hyper::Error> {
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            None => return Ok(None),
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// The body, at most [`MAX_BODY_LEN`] bytes of it (`declared`: its `Content-Length`).
async fn read_body(body: &mut Incoming, declared: Option<u64>) -> Result<Vec<u8>, Refusal> {
    if let Some(len) = declared.filter(|len| *len > MAX_BODY_LEN as u64) {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        return Err(RequestError::TooLarge { len }.into());
    }
    let unreadable = || {
        Refusal::new(
            ErrorKind::InvalidClientIdentity,
            "failed to validate client identity: the request body could not be read in time",
        )
    };
    let collect = async {
        let mut buf = Vec::new();
        while let Some(data) = next_chunk(body).await.map_err(|_| unreadable())? {
            if buf.len() + data.len() > MAX_BODY_LEN {
                let len = buf.len() + data.len();
                return Err(RequestError::TooLarge { len }.into());
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf)
    };
    tokio::time::timeout(BODY_TIMEOUT, collect)
        .await
        .map_err(|_| unreadable())?
}

/// Reads and drops up to [`DISCARD_LIMIT`] bytes of an unwanted body, for at most
/// [`DISCARD_TIME`].
async fn discard(body: &mut Incoming) {
    let drain = async {
        let mut total = 0usize;
        while let Ok(Some(data)) = next_chunk(body).await {
            total += data.len();
            if total > DISCARD_LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_TIME, drain).await;
}

fn respond(answer: &Answer) -> Response<Body> {
    let mut resp = Response::new(Body(Some(Bytes::from(answer.body.clone()))));
    *resp.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(ct) = answer.content_type() {
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    if let Some(allow) = answer.allow {
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allow));
    }
    resp
}

/// A whole response body (empty on success).
#[derive(Debug)]
struct Body(Option<Bytes>);

impl HttpBody for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let data = self.get_mut().0.take().filter(|d| !d.is_empty());
        Poll::Ready(data.map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|d| d.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |d| d.len() as u64))
    }
}
