//! The request path the node routes and services share, so that both refuse, log and answer
//! errors the same way: matching a route table, the role check, the log line, request bodies
//! (read against the clock and a cap, refusals answered before the rest is read), JSON answers
//! and the mapping of [`BackendError`] to a status and [`ErrorCode`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;

use crate::backend::BackendError;
use crate::body::{response, Body};
use crate::limits::Limits;
use crate::logq::{for_log, LogQueue, MAX_LOGGED_FIELD};
use crate::metrics::ApiMetrics;
use crate::pace::{BodyError, Paced};
use crate::routes::{lookup, route_of, Endpoint, Match, TableRoute};
use crate::types::{ApiError, Caller, ErrorCode, Role};

/// How much of a refused body is read out, after the answer is sent: enough that a client
/// sending a somewhat oversized JSON body reads the answer rather than a reset, not so much
/// that a refused client keeps the connection busy for long (the body timeouts apply too).
pub(crate) const DRAIN_REFUSED: u64 = 16 << 20;

/// The answer of a [`Site`], boxed so that sites can sit behind one `dyn` in the server.
pub(crate) type Answer = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// What one server serves: the node routes over a `NodeBackend`, or a `JsonService`. The
/// server owns TLS, connections and shutdown; the site owns its table and dispatch.
pub(crate) trait Site: Send + Sync + 'static {
    /// Answers one request. `caller` comes from the verified client certificate (`None`: it
    /// names no role, or maintenance mode asked for no certificate).
    fn respond(self: Arc<Self>, req: Request<Incoming>, caller: Option<Caller>) -> Answer;
    /// The site's part of `GET /metrics` (text exposition), on the blocking pool; `None`:
    /// the site keeps none (404).
    fn metrics(&self) -> Option<String>;
    /// The route a path names, as a metric's label (`other` when none does).
    fn route_label(&self, path: &str) -> &'static str;
    /// Called on the server's logging thread (`logq.rs`), one line at a time; a slow log
    /// delays only later lines (a full queue drops them and counts them).
    fn log_api(&self, message: &str);
}

/// What every request of one server shares: the site, its log and its limits.
pub(crate) struct Served {
    pub(crate) site: Arc<dyn Site>,
    pub(crate) log: LogQueue,
    pub(crate) limits: Arc<Limits>,
    pub(crate) metrics: Arc<ApiMetrics>,
}

tokio::task_local! {
    /// The limits of the server a request came to, for the body readers below (a site's
    /// dispatch does not pass them along).
    static LIMITS: Arc<Limits>;
}

/// The limits of the server this request runs in (the defaults outside one).
pub(crate) fn limits() -> Arc<Limits> {
    LIMITS
        .try_with(Arc::clone)
        .unwrap_or_else(|_| Arc::new(Limits::default()))
}

/// Every request of every site: answered by the site, then logged if it changed something or
/// failed (a reader polling status would otherwise flood the log). The method and path are
/// the client's: escaped and cut before they are logged.
pub(crate) async fn handle(
    req: Request<Incoming>,
    served: Arc<Served>,
    addr: SocketAddr,
    caller: Option<Caller>,
) -> Result<Response<Body>, Infallible> {
    let role = caller.as_ref().map(|c| c.role);
    let is_get = req.method() == hyper::Method::GET;
    let method = for_log(req.method().as_str(), MAX_LOGGED_FIELD);
    let path = for_log(req.uri().path(), MAX_LOGGED_FIELD);
    let route = if req.uri().path() == slate_metrics::PATH {
        slate_metrics::PATH
    } else {
        served.site.route_label(req.uri().path())
    };
    let response = if route == slate_metrics::PATH {
        let scrape = scrape(req, served.clone(), caller);
        LIMITS.scope(served.limits.clone(), scrape).await
    } else {
        let answer = served.site.clone().respond(req, caller);
        LIMITS.scope(served.limits.clone(), answer).await
    };
    let status = response.status();
    served.metrics.request(route, status);
    if !is_get || status.is_client_error() || status.is_server_error() {
        let role = role.map_or("no role", Role::as_str);
        let line = format!(
            "api: {addr} ({role}) {method} {path} -> {}",
            status.as_u16()
        );
        served.log.push(line);
    }
    Ok(response)
}

/// Why [`admit`] did not let a request through.
pub(crate) struct Refused<'a, R> {
    /// The route the request named, when it exists (its body may need reading out).
    pub(crate) route: Option<&'a R>,
    pub(crate) reject: Reject,
}

/// The route of a request and the role it acts with, or the answer to give instead: 404,
/// 405 with `Allow`, 403. `role_for` decides the role once the route is known (maintenance
/// mode admits by token rather than by certificate); a role below the route's is refused.
pub(crate) fn admit<'a, R: TableRoute>(
    table: &'a [R],
    method: &str,
    path: &str,
    role_for: impl FnOnce(&R) -> Result<Option<Role>, Reject>,
) -> Result<(&'a R, Role), Refused<'a, R>> {
    // What the client named goes back in the answer: escaped and cut like a log line.
    let (shown_method, shown_path) = (
        for_log(method, MAX_LOGGED_FIELD),
        for_log(path, MAX_LOGGED_FIELD),
    );
    let route = match lookup(table, method, path) {
        Match::Found(route) => route,
        Match::NotFound => {
            return Err(Refused {
                route: None,
                reject: Reject::new(
                    StatusCode::NOT_FOUND,
                    ErrorCode::NotFound,
                    format!("no endpoint {shown_path}"),
                ),
            })
        }
        Match::WrongMethod(allowed) => {
            let mut reject = Reject::new(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                format!("{shown_path} does not take {shown_method}"),
            );
            reject.allow = HeaderValue::from_str(&allowed.join(", ")).ok();
            return Err(Refused {
                route: None,
                reject,
            });
        }
    };
    let refused = |reject| Refused {
        route: Some(route),
        reject,
    };
    match role_for(route).map_err(refused)? {
        Some(role) if role >= route.role() => Ok((route, role)),
        role => Err(refused(Reject::new(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            format!(
                "{shown_method} {shown_path} requires role {} or higher; this client's \
                 certificate grants {}",
                route.role(),
                role.map_or("no role".to_owned(), |r| format!("role {r}")),
            ),
        ))),
    }
}

/// An error answer not yet rendered.
pub(crate) struct Reject {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    /// The `Allow` header of a 405.
    allow: Option<HeaderValue>,
}

impl Reject {
    pub(crate) fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Reject {
            status,
            code,
            message: message.into(),
            allow: None,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument, message)
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let mut r = error(self.status, self.code, self.message);
        if let Some(allow) = self.allow {
            r.headers_mut().insert(ALLOW, allow);
        }
        r
    }
}

/// The whole request body, at most `limit` bytes, read with the server's body timeouts. A
/// body that declares more is refused before a byte is read, one that sends more when it does;
/// either is then read out ([`drain`], up to [`DRAIN_REFUSED`]) so that the client sees the
/// 413 and not a broken pipe.
pub(crate) async fn read_body(body: Incoming, limit: usize) -> Result<Vec<u8>, Reject> {
    let mut body = Paced::new(body, &limits());
    if let Some(declared) = body.declared().filter(|&n| n > limit as u64) {
        // Answered now; a body the client is still sending is read out after the answer.
        drain_paced(body, DRAIN_REFUSED);
        return Err(too_large(format!(
            "the request body is {declared} bytes; this endpoint takes at most {limit}"
        )));
    }
    let mut data = Vec::new();
    while let Some(chunk) = body.next().await.map_err(body_reject)? {
        if data.len() + chunk.len() > limit {
            drain_paced(body, DRAIN_REFUSED);
            return Err(too_large(format!("request body over {limit} bytes")));
        }
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

pub(crate) fn too_large(message: String) -> Reject {
    Reject::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::PayloadTooLarge,
        message,
    )
}

/// The answer to a body that was not read to its end: too slow (408), or broken (400).
pub(crate) fn body_reject(e: BodyError) -> Reject {
    let status = if e.is_timeout() {
        StatusCode::REQUEST_TIMEOUT
    } else {
        StatusCode::BAD_REQUEST
    };
    Reject::new(status, ErrorCode::InvalidArgument, e.to_string())
}

/// Reads out and discards what is left of a refused request body, up to `limit` bytes (at most
/// [`DRAIN_REFUSED`]), under the body timeouts, so that a client still sending reads the answer
/// instead of a broken pipe.
///
/// The body is read on a task of its own, after the answer (hyper writes it while the body still
/// arrives): the refusal is never held back by the body. A body that declares more than the
/// limit is not read at all; the connection closes after the answer. A chunked body (no length;
/// slate's own client streams uploads so) is read up to the limit: that client stops sending
/// once it has an answer, and any other sees the answer before the limit is reached or the
/// connection closes. The body timeouts bound a silent or trickling body.
pub(crate) fn drain(body: Incoming, limit: u64) {
    drain_paced(Paced::new(body, &limits()), limit);
}

/// [`drain`] for a body already being read.
pub(crate) fn drain_paced(mut body: Paced, limit: u64) {
    let limit = limit.min(DRAIN_REFUSED);
    if body.declared().is_some_and(|declared| declared > limit) {
        return;
    }
    tokio::spawn(async move {
        let start = body.total;
        while let Ok(Some(_)) = body.next().await {
            if body.total - start > limit {
                break;
            }
        }
    });
}

/// Runs a call that may block (a backend or service method) on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(BackendError::Failed(format!(
            "the server failed to answer: {e}"
        )))
    })
}

pub(crate) fn reply<T: Serialize>(result: Result<T, BackendError>) -> Response<Body> {
    match result {
        Ok(value) => json(StatusCode::OK, &value),
        Err(e) => backend_error(e),
    }
}

pub(crate) fn backend_error(e: BackendError) -> Response<Body> {
    let (status, code, message) = match e {
        BackendError::Locked(m) => (StatusCode::CONFLICT, ErrorCode::Locked, m),
        BackendError::InvalidArgument(m) => {
            (StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument, m)
        }
        BackendError::Unsupported(m) => (StatusCode::BAD_REQUEST, ErrorCode::Unsupported, m),
        BackendError::NotFound(m) => (StatusCode::NOT_FOUND, ErrorCode::NotFound, m),
        BackendError::PermissionDenied(m) => {
            (StatusCode::FORBIDDEN, ErrorCode::PermissionDenied, m)
        }
        BackendError::Failed(m) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, m),
    };
    error(status, code, message)
}

pub(crate) fn error(status: StatusCode, code: ErrorCode, message: String) -> Response<Body> {
    json(status, &ApiError { code, message })
}

pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
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

/// `GET /metrics`, answered here for every site, before its routes (the node's table lists it
/// too, for `openapi.yaml` and its role): admitted like any reader route (405/403 alike), no
/// query; then the site's text and the server's counters (`metrics.rs`). The site's part runs on the blocking pool (a node
/// reads its state, the operator etcd).
pub(crate) async fn scrape(
    req: Request<Incoming>,
    served: Arc<Served>,
    caller: Option<Caller>,
) -> Response<Body> {
    let role = caller.as_ref().map(|c| c.role);
    let method = req.method().as_str().to_owned();
    let table = [*route_of(Endpoint::Metrics)];
    if let Err(refused) = admit(&table, &method, slate_metrics::PATH, |_| Ok(role)) {
        drain(req.into_body(), 1 << 16);
        return refused.reject.into_response();
    }
    if let Err(e) = slate_metrics::check_scrape(&method, req.uri().query()) {
        return Reject::invalid(e.to_string()).into_response();
    }
    let site = served.site.clone();
    let text = match blocking(move || Ok(site.metrics())).await {
        Ok(Some(text)) => text,
        Ok(None) => {
            return Reject::new(
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                "this server keeps no metrics",
            )
            .into_response()
        }
        Err(e) => return backend_error(e),
    };
    let own = slate_metrics::encode(served.metrics.registry.gather());
    response(
        StatusCode::OK,
        slate_metrics::CONTENT_TYPE,
        Body::full(format!("{text}{own}").into_bytes()),
    )
}
