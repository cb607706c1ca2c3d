//! The node routes: what each endpoint of [`ROUTES`] reads and calls on the [`NodeBackend`],
//! maintenance mode's token, the upload and the streams. Routing, roles and error answers are
//! shared with services (`http.rs`).

use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL};
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::backend::{BackendError, LineStream, NodeBackend};
use crate::body::{response, Body};
use crate::http::{
    admit, backend_error, blocking, body_reject, drain, drain_paced, json, limits, read_body,
    reply, too_large, Answer, Reject, Site, DRAIN_REFUSED,
};
use crate::pace::Paced;
use crate::routes::{self, Endpoint, Route, ROUTES};
use crate::types::{
    Accepted, ApplyConfigRequest, Caller, ErrorCode, Event, PinRequest, RebootRequest, Role,
    RollbackRequest, ServiceControlRequest, SnapshotUpgradeRequest, UpgradeRequest,
};
use crate::upload::{upload_room, ChannelReader, MAX_UPLOAD_BYTES, UPLOAD_CHANNEL};

const MAX_REQUEST_BODY: usize = 64 * 1024;
/// A machine configuration (at most 256 KiB of TOML) as a JSON string, escapes included.
const MAX_CONFIG_BODY: usize = 640 * 1024;
/// The header that carries the maintenance token.
pub const MAINTENANCE_TOKEN_HEADER: &str = "x-slate-maintenance-token";
/// Chunks (lines) buffered per streaming response before the producer waits for the client:
/// with machined's lines of at most 4 KiB, 256 KiB per stream a client does not read.
const STREAM_BUFFER: usize = 64;

/// The node routes over a [`NodeBackend`], as one server serves them.
pub(crate) struct NodeSite {
    pub(crate) backend: Arc<dyn NodeBackend>,
    /// Set in maintenance mode: the connection presented no certificate, and a request is
    /// admitted (as admin, to [`routes::MAINTENANCE_ENDPOINTS`] only) when it carries this token.
    pub(crate) maintenance_token: Option<Arc<str>>,
}

impl Site for NodeSite {
    fn respond(self: Arc<Self>, req: Request<Incoming>, caller: Option<Caller>) -> Answer {
        let role = caller.map(|c| c.role);
        Box::pin(async move {
            let method = req.method().as_str().to_owned();
            let path = req.uri().path().to_owned();
            match admit(ROUTES, &method, &path, |route| {
                self.role_for(&req, route, role)
            }) {
                Ok((route, role)) => dispatch(route, role, req, &self).await,
                Err(refused) => {
                    if refused
                        .route
                        .is_some_and(|r| r.endpoint == Endpoint::UploadBundle)
                    {
                        // The client may still be sending: read some of it out, or it sees a
                        // broken pipe instead of this answer (`drain`: after the answer when
                        // the body has a length; a trickle is cut by the body timeouts). Not
                        // all of it: slate's client stops sending once answered.
                        drain(req.into_body(), DRAIN_REFUSED);
                    }
                    refused.reject.into_response()
                }
            }
        })
    }

    fn log_api(&self, message: &str) {
        self.backend.log_api(message);
    }

    fn metrics(&self) -> Option<String> {
        Some(crate::node_metrics::node_metrics(
            &self.backend.status(),
            &self.backend.metrics(),
        ))
    }

    fn route_label(&self, path: &str) -> &'static str {
        ROUTES
            .iter()
            .find(|r| r.path == path)
            .map_or(crate::metrics::OTHER_ROUTE, |r| r.path)
    }
}

impl NodeSite {
    /// The role this request acts with: the certificate's, or in maintenance mode admin for
    /// the token's holder on the maintenance endpoints.
    fn role_for(
        &self,
        req: &Request<Incoming>,
        route: &Route,
        cert_role: Option<Role>,
    ) -> Result<Option<Role>, Reject> {
        let Some(token) = &self.maintenance_token else {
            return Ok(cert_role);
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

async fn dispatch(
    route: &Route,
    role: Role,
    req: Request<Incoming>,
    node: &NodeSite,
) -> Response<Body> {
    let follow = match follow_param(req.uri().query()) {
        Ok(follow) => follow,
        Err(reject) => return reject.into_response(),
    };
    match route.endpoint {
        Endpoint::Version => reply(call(node, |b| Ok(b.version())).await),
        Endpoint::Status => reply(call(node, |b| Ok(b.status())).await),
        Endpoint::Reboot => match read_json::<RebootRequest>(req, true, MAX_REQUEST_BODY).await {
            Ok(RebootRequest { entry: Some(_), .. }) if role < Role::Admin => Reject::new(
                StatusCode::FORBIDDEN,
                ErrorCode::PermissionDenied,
                "a reboot into a named entry requires role admin",
            )
            .into_response(),
            Ok(RebootRequest {
                mode,
                entry: Some(entry),
            }) => accepted(
                "reboot",
                call(node, move |b| b.reboot_once_into(&entry, mode)).await,
            ),
            Ok(body) => accepted("reboot", call(node, move |b| b.reboot(body.mode)).await),
            Err(reject) => reject.into_response(),
        },
        Endpoint::Reset => accepted("reset", call(node, |b| b.reset()).await),
        Endpoint::Shutdown => accepted("shutdown", call(node, |b| b.shutdown()).await),
        Endpoint::Upgrade => {
            match read_json::<UpgradeRequest>(req, false, MAX_REQUEST_BODY).await {
                Ok(body) if body.image.trim().is_empty() => {
                    Reject::invalid("image must not be empty").into_response()
                }
                // The operator role upgrades (the rollout operator); going back to an older
                // version stays the admin's call.
                Ok(body) if body.allow_downgrade && role < Role::Admin => Reject::new(
                    StatusCode::FORBIDDEN,
                    ErrorCode::PermissionDenied,
                    "allow_downgrade requires role admin",
                )
                .into_response(),
                Ok(body) => accepted("upgrade", call(node, move |b| b.upgrade(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
        Endpoint::Pin => match read_json::<PinRequest>(req, false, MAX_REQUEST_BODY).await {
            Ok(body) => reply(call(node, move |b| b.pin(body)).await),
            Err(reject) => reject.into_response(),
        },
        Endpoint::Rollback => {
            match read_json::<RollbackRequest>(req, true, MAX_REQUEST_BODY).await {
                Ok(body) => reply(call(node, move |b| b.rollback(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
        Endpoint::UploadBundle => upload(req, node).await,
        Endpoint::Events => events(node, follow).await,
        Endpoint::Logs => lines(node, follow, |b, f| b.logs(f)).await,
        Endpoint::Dmesg => lines(node, follow, |b, f| b.dmesg(f)).await,
        Endpoint::ShowConfig => reply(call(node, |b| b.show_config()).await),
        Endpoint::BootExplain => reply(call(node, |b| b.boot_explain()).await),
        Endpoint::ImageSummary => reply(call(node, |b| b.image_summary()).await),
        Endpoint::SnapshotList => reply(call(node, |b| b.snapshot_list()).await),
        Endpoint::SnapshotUpgrade => {
            match read_json::<SnapshotUpgradeRequest>(req, false, MAX_REQUEST_BODY).await {
                Ok(body) => reply(call(node, move |b| b.snapshot_upgrade(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
        Endpoint::Services => reply(call(node, |b| b.services()).await),
        // Answered by `metrics::scrape` before any site; never routed here.
        Endpoint::Metrics => Reject::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "no endpoint /metrics",
        )
        .into_response(),
        Endpoint::ControlService => {
            match read_json::<ServiceControlRequest>(req, false, MAX_REQUEST_BODY).await {
                Ok(body) => reply(call(node, move |b| b.control_service(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
        Endpoint::ApplyConfig => {
            match read_json::<ApplyConfigRequest>(req, false, MAX_CONFIG_BODY).await {
                Ok(body) => reply(call(node, move |b| b.apply_config(body)).await),
                Err(reject) => reject.into_response(),
            }
        }
    }
}

/// Streams the request body to [`NodeBackend::receive_bundle`] on the blocking pool, with the
/// body timeouts and at most [`MAX_UPLOAD_BYTES`] — or, with `Limits::upload_dir`, the free
/// space there: a declared length over either is refused before a byte is read. If the backend
/// stops reading (it refused the bundle), the rest of the body is read out ([`drain`]).
async fn upload(req: Request<Incoming>, node: &NodeSite) -> Response<Body> {
    let limits = limits();
    let mut body = Paced::new(req.into_body(), &limits);
    let room = limits
        .upload_dir
        .as_deref()
        .and_then(|dir| upload_room(dir).ok().map(|room| (dir, room)));
    let cap = room.map_or(MAX_UPLOAD_BYTES, |(_, room)| room.min(MAX_UPLOAD_BYTES));
    if let Some(declared) = body.declared() {
        if declared > MAX_UPLOAD_BYTES {
            return too_large(format!(
                "the upload is {declared} bytes; the node takes at most {MAX_UPLOAD_BYTES}"
            ))
            .into_response();
        }
        if let Some((dir, room)) = room.filter(|&(_, room)| declared > room) {
            // Answered now; a small body still being sent is read out after the answer.
            drain_paced(body, DRAIN_REFUSED);
            return Reject::new(
                StatusCode::INSUFFICIENT_STORAGE,
                ErrorCode::PayloadTooLarge,
                format!(
                    "the upload is {declared} bytes; the node has {room} bytes free for bundles \
                     (in {})",
                    dir.display()
                ),
            )
            .into_response();
        }
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(UPLOAD_CHANNEL);
    let backend = node.backend.clone();
    let receiving =
        tokio::task::spawn_blocking(move || backend.receive_bundle(&mut ChannelReader::new(rx)));
    // Set when the body, not the backend, ended the upload: that is the answer.
    let mut cut = None;
    // Whether the rest of the body is to be read out before the answer.
    let mut read_out = false;
    loop {
        let chunk = match body.next().await {
            Ok(Some(_)) if body.total > cap => {
                let message = format!("the upload exceeds {cap} bytes");
                cut = Some(too_large(message.clone()));
                read_out = true;
                Err(message)
            }
            Ok(Some(chunk)) => Ok(chunk),
            Ok(None) => break,
            Err(e) => {
                let message = format!("the upload broke: {e}");
                cut = Some(body_reject(e));
                Err(message)
            }
        };
        let stop = chunk.is_err();
        if stop {
            let _ = tx.send(chunk).await;
            break;
        }
        if tx.send(chunk).await.is_err() {
            // The backend refused the bundle and stopped reading.
            read_out = true;
            break;
        }
    }
    drop(tx);
    let result = receiving.await.unwrap_or_else(|e| {
        Err(BackendError::Failed(format!(
            "the node failed to take the upload: {e}"
        )))
    });
    if read_out {
        // So that the client gets the answer rather than a broken pipe.
        drain_paced(body, MAX_UPLOAD_BYTES);
    }
    match cut {
        Some(reject) => reject.into_response(),
        None => reply(result),
    }
}

/// Runs a backend call on the blocking pool.
async fn call<T: Send + 'static>(
    node: &NodeSite,
    f: impl FnOnce(&dyn NodeBackend) -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    let backend = node.backend.clone();
    blocking(move || f(&*backend)).await
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
    let data = read_body(req.into_body(), limit).await?;
    let data: &[u8] = if data.is_empty() && empty_ok {
        b"{}"
    } else {
        &data
    };
    serde_json::from_slice(data).map_err(|e| Reject::invalid(format!("invalid request body: {e}")))
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
    node: &NodeSite,
    follow: bool,
    open: fn(&dyn NodeBackend, bool) -> Result<LineStream, BackendError>,
) -> Response<Body> {
    let source = match call(node, move |b| open(b, follow)).await {
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
async fn events(node: &NodeSite, follow: bool) -> Response<Body> {
    let source = match call(node, |b| Ok(b.events())).await {
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
