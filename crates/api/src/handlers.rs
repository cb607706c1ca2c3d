//! Request handling: routing, the role check, backend calls, streams.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::backend::{BackendError, LineStream, NodeBackend};
use crate::body::{collect, next_chunk, Body, CollectError};
use crate::routes::{self, Endpoint, Match, Route};
use crate::types::{
    Accepted, ApiError, ApplyConfigRequest, ErrorCode, Event, RebootRequest, Role, UpgradeRequest,
    UploadedBundle,
};
use crate::upload::{ChannelReader, MAX_UPLOAD_BYTES, UPLOAD_CHANNEL};

const MAX_REQUEST_BODY: usize = 64 * 1024;
/// A machine configuration (at most 256 KiB of TOML) as a JSON string, escapes included.
const MAX_CONFIG_BODY: usize = 640 * 1024;
/// The header that carries the maintenance token.
pub const MAINTENANCE_TOKEN_HEADER: &str = "x-slate-maintenance-token";
/// Chunks buffered per streaming response before the producer waits for the client.
const STREAM_BUFFER: usize = 256;

/// What a request handler knows about its connection.
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    /// From the verified client certificate; `None` when it names no role.
    pub(crate) role: Option<Role>,
    pub(crate) backend: Arc<dyn NodeBackend>,
    /// Set in maintenance mode: the connection presented no certificate, and a request is
    /// admitted (as admin, to [`routes::MAINTENANCE_ENDPOINTS`] only) when it carries this token.
    pub(crate) maintenance_token: Option<Arc<str>>,
}

impl Peer {
    /// The role this request acts with.
    fn role_for(&self, req: &Request<Incoming>, route: &Route) -> Result<Option<Role>, Reject> {
        let Some(token) = &self.maintenance_token else {
            return Ok(self.role);
        };
        if !routes::MAINTENANCE_ENDPOINTS.contains(&route.endpoint) {
            return Err(Reject::new(
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied,
                "the node is in maintenance mode (it has no machine configuration yet): it only \
                 takes `slate apply-config --insecure --token TOKEN`",
            ));
        }
        let given = req
            .headers()
            .get(MAINTENANCE_TOKEN_HEADER)
            .map(HeaderValue::as_bytes)
            .unwrap_or_default();
        if constant_time_eq(given, token.as_bytes()) {
            Ok(Some(Role::Admin))
        } else {
            Err(Reject::new(
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied,
                "the maintenance token is missing or wrong (the node prints it on its console)",
            ))
        }
    }
}

/// Compares without an early exit, so the time taken says nothing about the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An error answer not yet rendered.
struct Reject {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl Reject {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Reject {
            status,
            code,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument, message)
    }

    fn into_response(self) -> Response<Body> {
        error(self.status, self.code, self.message)
    }
}

pub(crate) async fn handle(
    req: Request<Incoming>,
    peer: Arc<Peer>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let response = match routes::lookup(&method, &path) {
        Match::NotFound => error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("no endpoint {path}"),
        ),
        Match::WrongMethod(allowed) => {
            let mut r = error(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                format!("{path} does not take {method}"),
            );
            if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                r.headers_mut().insert(ALLOW, v);
            }
            r
        }
        Match::Found(route) => match peer.role_for(&req, route) {
            Err(reject) => {
                if route.endpoint == Endpoint::UploadBundle {
                    drain(req.into_body()).await;
                }
                reject.into_response()
            }
            Ok(Some(role)) if role >= route.role => dispatch(route, req, &peer).await,
            Ok(role) => {
                if route.endpoint == Endpoint::UploadBundle {
                    // The client is still sending: read it out, or it sees a broken pipe
                    // instead of this answer.
                    drain(req.into_body()).await;
                }
                error(
                    StatusCode::FORBIDDEN,
                    ErrorCode::PermissionDenied,
                    format!(
                        "{method} {path} requires role {} or higher; this client's certificate \
                     grants {}",
                        route.role,
                        role.map_or("no role".to_owned(), |r| format!("role {r}")),
                    ),
                )
            }
        },
    };
    let status = response.status();
    if method != "GET" || status.is_client_error() || status.is_server_error() {
        let role = peer.role.map_or("no role", Role::as_str);
        let line = format!(
            "api: {} ({role}) {method} {path} -> {}",
            peer.addr,
            status.as_u16()
        );
        peer.backend.log_api(&line);
    }
    Ok(response)
}

async fn dispatch(route: &Route, req: Request<Incoming>, peer: &Peer) -> Response<Body> {
    let follow = match follow_param(req.uri().query()) {
        Ok(follow) => follow,
        Err(reject) => return reject.into_response(),
    };
    match route.endpoint {
        Endpoint::Version => reply(call(peer, |b| Ok(b.version())).await),
        Endpoint::Status => reply(call(peer, |b| Ok(b.status())).await),
        Endpoint::Reboot => match read_json::<RebootRequest>(req, true, MAX_REQUEST_BODY).await {
            Ok(body) => accepted("reboot", call(peer, move |b| b.reboot(body.mode)).await),
            Err(reject) => reject.into_response(),
        },
        Endpoint::Reset => accepted("reset", call(peer, |b| b.reset()).await),
        Endpoint::Upgrade => {
            match read_json::<UpgradeRequest>(req, false, MAX_REQUEST_BODY).await {
                Ok(body) if body.image.trim().is_empty() => error(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidArgument,
                    "image must not be empty".into(),
                ),
                Ok(body) => accepted("upgrade", call(peer, move |b| b.upgrade(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
        Endpoint::UploadBundle => reply(upload(req, peer).await),
        Endpoint::Events => events(peer, follow).await,
        Endpoint::Logs => lines(peer, follow, |b, f| b.logs(f)).await,
        Endpoint::Dmesg => lines(peer, follow, |b, f| b.dmesg(f)).await,
        Endpoint::ShowConfig => reply(call(peer, |b| b.show_config()).await),
        Endpoint::BootExplain => reply(call(peer, |b| b.boot_explain()).await),
        Endpoint::ApplyConfig => {
            match read_json::<ApplyConfigRequest>(req, false, MAX_CONFIG_BODY).await {
                Ok(body) => reply(call(peer, move |b| b.apply_config(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
    }
}

/// Streams the request body to [`NodeBackend::receive_bundle`] on the blocking pool. If the
/// backend stops reading (it refused the bundle), the rest of the body is not read.
async fn upload(req: Request<Incoming>, peer: &Peer) -> Result<UploadedBundle, BackendError> {
    let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(UPLOAD_CHANNEL);
    let backend = peer.backend.clone();
    let receiving =
        tokio::task::spawn_blocking(move || backend.receive_bundle(&mut ChannelReader::new(rx)));
    let mut body = req.into_body();
    let mut total = 0u64;
    loop {
        let chunk = match next_chunk(&mut body).await {
            Ok(Some(chunk)) => Ok(chunk),
            Ok(None) => break,
            Err(e) => Err(format!("the upload broke: {e}")),
        };
        if let Ok(chunk) = &chunk {
            total += chunk.len() as u64;
        }
        let chunk = if total > MAX_UPLOAD_BYTES {
            Err(format!("the upload exceeds {MAX_UPLOAD_BYTES} bytes"))
        } else {
            chunk
        };
        let stop = chunk.is_err();
        if stop {
            let _ = tx.send(chunk).await;
            break;
        }
        if tx.send(chunk).await.is_err() {
            // The backend refused the bundle and stopped reading; read out the rest so the
            // client gets the answer rather than a broken pipe.
            drain(body).await;
            break;
        }
    }
    drop(tx);
    receiving.await.unwrap_or_else(|e| {
        Err(BackendError::Failed(format!(
            "the node failed to take the upload: {e}"
        )))
    })
}

/// Read and discard what is left of a request body, up to [`MAX_UPLOAD_BYTES`].
async fn drain(mut body: Incoming) {
    let mut total = 0u64;
    while let Ok(Some(chunk)) = next_chunk(&mut body).await {
        total += chunk.len() as u64;
        if total > MAX_UPLOAD_BYTES {
            break;
        }
    }
}

/// Runs a backend call on the blocking pool.
async fn call<T: Send + 'static>(
    peer: &Peer,
    f: impl FnOnce(&dyn NodeBackend) -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    let backend = peer.backend.clone();
    tokio::task::spawn_blocking(move || f(&*backend))
        .await
        .unwrap_or_else(|e| {
            Err(BackendError::Failed(format!(
                "the node failed to answer: {e}"
            )))
        })
}

fn follow_param(query: Option<&str>) -> Result<bool, Reject> {
    let mut follow = false;
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        if key == "follow" {
            follow = match value {
                "true" | "1" | "" => true,
                "false" | "0" => false,
                other => {
                    let message = format!("follow must be true or false, not {other:?}");
                    return Err(Reject::invalid(message));
                }
            };
        }
    }
    Ok(follow)
}

async fn read_json<T: DeserializeOwned>(
    req: Request<Incoming>,
    empty_ok: bool,
    limit: usize,
) -> Result<T, Reject> {
    let mut body = req.into_body();
    let data = match collect(&mut body, limit).await {
        Ok(data) => data,
        Err(CollectError::TooLarge) => {
            return Err(Reject::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!("request body over {limit} bytes"),
            ))
        }
        Err(CollectError::Body(e)) => {
            return Err(Reject::invalid(format!(
                "cannot read the request body: {e}"
            )))
        }
    };
    let data: &[u8] = if data.is_empty() && empty_ok {
        b"{}"
    } else {
        &data
    };
    serde_json::from_slice(data).map_err(|e| Reject::invalid(format!("invalid request body: {e}")))
}

fn reply<T: Serialize>(result: Result<T, BackendError>) -> Response<Body> {
    match result {
        Ok(value) => json(StatusCode::OK, &value),
        Err(e) => backend_error(e),
    }
}

fn accepted(operation: &str, result: Result<(), BackendError>) -> Response<Body> {
    match result {
        Ok(()) => json(
            StatusCode::ACCEPTED,
            &Accepted {
                operation: operation.to_owned(),
            },
        ),
        Err(e) => backend_error(e),
    }
}

fn backend_error(e: BackendError) -> Response<Body> {
    let (status, code, message) = match e {
        BackendError::Locked(m) => (StatusCode::CONFLICT, ErrorCode::Locked, m),
        BackendError::InvalidArgument(m) => {
            (StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument, m)
        }
        BackendError::Unsupported(m) => (StatusCode::BAD_REQUEST, ErrorCode::Unsupported, m),
        BackendError::Failed(m) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, m),
    };
    error(status, code, message)
}

fn error(status: StatusCode, code: ErrorCode, message: String) -> Response<Body> {
    json(status, &ApiError { code, message })
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let (status, body) = match serde_json::to_vec(value) {
        Ok(body) => (status, body),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(r#"{{"code":"internal","message":"cannot encode the answer: {e}"}}"#)
                .into_bytes(),
        ),
    };
    response(status, "application/json", Body::full(body))
}

fn response(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn stream(content_type: &'static str, rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = response(StatusCode::OK, content_type, Body::Stream(rx));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn spawn_pump(f: impl FnOnce() + Send + 'static) -> Result<(), Reject> {
    std::thread::Builder::new()
        .name("slate-api-stream".into())
        .spawn(f)
        .map(drop)
        .map_err(|e| {
            Reject::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                format!("cannot start a stream: {e}"),
            )
        })
}

/// A text stream: each line of the backend's iterator, newline-terminated, sent as produced.
async fn lines(
    peer: &Peer,
    follow: bool,
    open: fn(&dyn NodeBackend, bool) -> Result<LineStream, BackendError>,
) -> Response<Body> {
    let source = match call(peer, move |b| open(b, follow)).await {
        Ok(source) => source,
        Err(e) => return backend_error(e),
    };
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let pumped = spawn_pump(move || {
        for mut line in source {
            line.push('\n');
            if tx.blocking_send(Bytes::from(line)).is_err() {
                break;
            }
        }
    });
    match pumped {
        Ok(()) => stream("text/plain; charset=utf-8", rx),
        Err(reject) => reject.into_response(),
    }
}

/// Newline-delimited JSON events; see [`crate::EventStream`] for `follow`.
async fn events(peer: &Peer, follow: bool) -> Response<Body> {
    let source = match call(peer, |b| Ok(b.events())).await {
        Ok(source) => source,
        Err(e) => return backend_error(e),
    };
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let pumped = spawn_pump(move || {
        let send = |event: &Event| {
            let Ok(mut line) = serde_json::to_vec(event) else {
                return true;
            };
            line.push(b'\n');
            tx.blocking_send(Bytes::from(line)).is_ok()
        };
        if follow {
            loop {
                match source.recv_timeout(Duration::from_secs(1)) {
                    Ok(event) if send(&event) => {}
                    Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) if tx.is_closed() => break,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
        } else {
            while let Ok(event) = source.try_recv() {
                if !send(&event) {
                    break;
                }
            }
        }
    });
    match pumped {
        Ok(()) => stream("application/x-ndjson", rx),
        Err(reject) => reject.into_response(),
    }
}
