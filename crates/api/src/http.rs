//! The request path the node routes and services share, so that both refuse, log and answer
//! errors the same way: matching a route table, the role check, the log line, request bodies,
//! JSON answers and the mapping of [`BackendError`] to a status and [`ErrorCode`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;

use crate::backend::BackendError;
use crate::body::{collect, next_chunk, Body, CollectError};
use crate::routes::{lookup, Match, TableRoute};
use crate::types::{ApiError, ErrorCode, Role};

/// How much of a refused body is read out before answering: enough that a client sending a
/// somewhat oversized JSON body reads the answer rather than a reset, not so much that a
/// refused client can keep the connection busy for long.
const DRAIN_REFUSED: u64 = 16 << 20;

/// The answer of a [`Site`], boxed so that sites can sit behind one `dyn` in the server.
pub(crate) type Answer = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// What one server serves: the node routes over a `NodeBackend`, or a `JsonService`. The
/// server owns TLS, connections and shutdown; the site owns its table and dispatch.
pub(crate) trait Site: Send + Sync + 'static {
    /// Answers one request. `role` comes from the verified client certificate (`None`: it
    /// names no role, or maintenance mode asked for no certificate).
    fn respond(self: Arc<Self>, req: Request<Incoming>, role: Option<Role>) -> Answer;
    /// Called on the executor: must not block.
    fn log_api(&self, message: &str);
}

/// Every request of every site: answered by the site, then logged if it changed something or
/// failed (a reader polling status would otherwise flood the log).
pub(crate) async fn handle(
    req: Request<Incoming>,
    site: Arc<dyn Site>,
    addr: SocketAddr,
    role: Option<Role>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let response = site.clone().respond(req, role).await;
    let status = response.status();
    if method != "GET" || status.is_client_error() || status.is_server_error() {
        let role = role.map_or("no role", Role::as_str);
        let line = format!(
            "api: {addr} ({role}) {method} {path} -> {}",
            status.as_u16()
        );
        site.log_api(&line);
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
    let route = match lookup(table, method, path) {
        Match::Found(route) => route,
        Match::NotFound => {
            return Err(Refused {
                route: None,
                reject: Reject::new(
                    StatusCode::NOT_FOUND,
                    ErrorCode::NotFound,
                    format!("no endpoint {path}"),
                ),
            })
        }
        Match::WrongMethod(allowed) => {
            let mut reject = Reject::new(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                format!("{path} does not take {method}"),
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
                "{method} {path} requires role {} or higher; this client's certificate grants {}",
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

/// The whole request body, at most `limit` bytes. An oversized body is read out (up to a
/// bound) before the 413, so that the client sees the answer and not a broken pipe.
pub(crate) async fn read_body(mut body: Incoming, limit: usize) -> Result<Vec<u8>, Reject> {
    match collect(&mut body, limit).await {
        Ok(data) => Ok(data),
        Err(CollectError::TooLarge) => {
            drain(body, DRAIN_REFUSED).await;
            Err(Reject::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!("request body over {limit} bytes"),
            ))
        }
        Err(CollectError::Body(e)) => Err(Reject::invalid(format!(
            "cannot read the request body: {e}"
        ))),
    }
}

/// Reads and discards what is left of a request body, up to `limit` bytes: a client still
/// sending when refused would otherwise see a broken pipe instead of the answer.
pub(crate) async fn drain(mut body: Incoming, limit: u64) {
    let mut total = 0u64;
    while let Ok(Some(chunk)) = next_chunk(&mut body).await {
        total += chunk.len() as u64;
        if total > limit {
            break;
        }
    }
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

pub(crate) fn response(
    status: StatusCode,
    content_type: &'static str,
    body: Body,
) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
