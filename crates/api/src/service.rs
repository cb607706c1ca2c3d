//! Services other than the node (the rollout operator) serving their own JSON routes with the
//! node API's mutual TLS and roles, so that one CA, one set of role certificates and one
//! client serve the whole system, and every server refuses, logs and shuts down alike.
//!
//! A service only brings its route table and a blocking `call`; the server (`server.rs`) and
//! the request path (`http.rs`) are the node API's own.

use std::future::Future;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::Request;
use serde::de::IgnoredAny;

use crate::backend::BackendError;
use crate::http::{admit, blocking, drain, read_body, reply, Answer, Reject, Site};
use crate::page::{check_same_origin, page_reply, Page};
use crate::routes::TableRoute;
use crate::server::{serve_site, spawn_site, ServerConfig, ServerError, ServerHandle};
use crate::types::{Caller, Role};

/// The largest request body a service is given: services take small JSON documents, and the
/// whole body is held in memory before the call.
pub const MAX_SERVICE_BODY: usize = 1 << 20;

/// One route of a service: method, exact path, least role allowed, and whether it answers a
/// JSON value ([`JsonService::call`]) or an HTML page ([`JsonService::page`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceRoute {
    /// An HTTP method, upper case (`GET`, `POST`, `PUT`, `DELETE`, …).
    pub method: &'static str,
    /// The exact path, without query: `/v1/rollouts`. There are no path parameters, so that
    /// the table stays a flat list a test can compare with a spec; name things in the query or
    /// the body.
    pub path: &'static str,
    /// The least privileged role allowed.
    pub role: Role,
    /// An HTML page (`GET` only), answered by [`JsonService::page`].
    pub page: bool,
}

impl ServiceRoute {
    /// A JSON route, for `const` route tables.
    pub const fn new(method: &'static str, path: &'static str, role: Role) -> Self {
        ServiceRoute {
            method,
            path,
            role,
            page: false,
        }
    }

    /// A page: `GET path`, answered in HTML by [`JsonService::page`]. Its role is checked as
    /// any route's; what it may change, it changes through the JSON routes (and their roles).
    pub const fn page(path: &'static str, role: Role) -> Self {
        ServiceRoute {
            method: "GET",
            path,
            role,
            page: true,
        }
    }
}

impl TableRoute for ServiceRoute {
    fn method(&self) -> &str {
        self.method
    }
    fn path(&self) -> &str {
        self.path
    }
    fn role(&self) -> Role {
        self.role
    }
}

/// A JSON-over-HTTPS service with the node API's mutual TLS and roles.
///
/// Like [`crate::NodeBackend`], `call` runs on a blocking-capable thread (tokio's blocking
/// pool), so it may take locks, wait and do I/O; calls arrive concurrently.
pub trait JsonService: Send + Sync + 'static {
    /// Every route served. Asked once at start (to refuse a malformed table) and again for
    /// each request, so it should return the same table every time.
    fn routes(&self) -> &[ServiceRoute];

    /// A request that matched `route` and whose caller has at least `route.role`: the server
    /// has already answered unknown paths (404), other methods (405 with `Allow`) and too
    /// weak a role (403), exactly as for the node routes. `caller` is the caller's own role
    /// and, for [`Role::Node`], the node its certificate names;
    /// `query` the raw query string; `body` the request body, at most [`MAX_SERVICE_BODY`]
    /// bytes, empty or valid JSON (anything else is answered 400 without a call).
    ///
    /// The value is answered with HTTP 200; an error as for the node routes: `Locked` 409,
    /// `InvalidArgument` and `Unsupported` 400, `NotFound` 404, `Failed` 500.
    fn call(
        &self,
        route: &ServiceRoute,
        caller: &Caller,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<serde_json::Value, BackendError>;

    /// Like [`crate::NodeBackend::log_api`]: refused handshakes, denied and failed requests,
    /// requests other than `GET`. Called on the server's logging thread (a bounded queue that
    /// drops when full). The default drops it.
    fn log_api(&self, message: &str) {
        let _ = message;
    }

    /// A page route's document (`route.page`), admitted like any route; `query` the raw query
    /// string. An error is answered as a short HTML page with the status `call`'s would have.
    /// The default has no pages.
    fn page(
        &self,
        route: &ServiceRoute,
        caller: &Caller,
        query: Option<&str>,
    ) -> Result<Page, BackendError> {
        let _ = (caller, query);
        Err(BackendError::NotFound(format!("no page {}", route.path)))
    }

    /// The service's part of `GET /metrics` (text exposition, its own families), computed on
    /// the blocking pool at each scrape; the server adds its request and connection counters.
    /// The default keeps none: `/metrics` answers 404.
    fn metrics(&self) -> Option<String> {
        None
    }
}

/// [`crate::serve`] for a service: serves `service` on `config.listen` until `shutdown`
/// resolves, inside a tokio runtime with I/O and time enabled.
///
/// `config` is the node API's: `ca_pem` is the CA client certificates must chain to (their
/// `O=os:<role>` is the role), `cert_pem`/`key_pem` the service's serving certificate (see
/// [`crate::issue_serving_cert`]). A `maintenance_token` is refused with
/// [`ServerError::Service`]: maintenance mode is how a node without a configuration gets
/// one, and a service that served without client certificates would serve anyone.
pub async fn serve_service(
    config: ServerConfig,
    service: Arc<dyn JsonService>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let site = service_site(&config, service)?;
    serve_site(config, site, shutdown).await
}

/// [`crate::spawn`] for a service: binds, checks the certificates and the route table, and
/// serves on a thread of its own; see [`serve_service`] for `config`.
pub fn spawn_service(
    config: ServerConfig,
    service: Arc<dyn JsonService>,
) -> Result<ServerHandle, ServerError> {
    let site = service_site(&config, service)?;
    spawn_site(config, site)
}

fn service_site(
    config: &ServerConfig,
    service: Arc<dyn JsonService>,
) -> Result<Arc<dyn Site>, ServerError> {
    if config.maintenance_token.is_some() {
        return Err(ServerError::Service(
            "maintenance mode (a maintenance token) is for the node API only; a service always \
             requires client certificates"
                .into(),
        ));
    }
    check_routes(service.routes()).map_err(ServerError::Service)?;
    Ok(Arc::new(ServiceSite { service }))
}

/// Refuses a table with a route no request could reach, or two routes for one request (the
/// second would never be called).
fn check_routes(routes: &[ServiceRoute]) -> Result<(), String> {
    for (i, r) in routes.iter().enumerate() {
        if r.method.is_empty() || !r.method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "route {i}: method {:?} is not an upper-case HTTP method",
                r.method
            ));
        }
        if !r.path.starts_with('/')
            || r.path.contains(['?', '#'])
            || r.path.contains(char::is_whitespace)
        {
            return Err(format!(
                "route {i}: path {:?} is not an absolute path without query",
                r.path
            ));
        }
        if r.page && r.method != "GET" {
            return Err(format!("route {i}: page {} must be GET", r.path));
        }
        if r.path == slate_metrics::PATH {
            return Err(format!(
                "route {i}: {} is every server's own (GET, role reader)",
                r.path
            ));
        }
        if routes[..i]
            .iter()
            .any(|o| o.method == r.method && o.path == r.path)
        {
            return Err(format!("{} {} is listed twice", r.method, r.path));
        }
    }
    Ok(())
}

struct ServiceSite {
    service: Arc<dyn JsonService>,
}

impl Site for ServiceSite {
    fn respond(self: Arc<Self>, req: Request<Incoming>, caller: Option<Caller>) -> Answer {
        Box::pin(async move {
            if let Err(reject) = check_same_origin(&req) {
                drain(req.into_body(), MAX_SERVICE_BODY as u64);
                return reject.into_response();
            }
            let admitted = {
                let method = req.method().as_str();
                let path = req.uri().path();
                let role = caller.as_ref().map(|c| c.role);
                match admit(self.service.routes(), method, path, |_| Ok(role)) {
                    Ok((route, _)) => Ok(*route),
                    Err(refused) => Err(refused.reject),
                }
            };
            let route = match admitted {
                Ok(admitted) => admitted,
                Err(reject) => {
                    // Bodies are small: read it out, so that the client reads the refusal.
                    drain(req.into_body(), MAX_SERVICE_BODY as u64);
                    return reject.into_response();
                }
            };
            let service = self.service.clone();
            // Admitted, so a caller with a role was there.
            let caller = caller.unwrap_or_else(|| Caller::with_role(Role::Node));
            if route.page {
                let query = req.uri().query().map(str::to_owned);
                drain(req.into_body(), MAX_SERVICE_BODY as u64);
                let page = move || service.page(&route, &caller, query.as_deref());
                return page_reply(blocking(page).await);
            }
            match request_of(req).await {
                Ok((query, body)) => {
                    let call = move || service.call(&route, &caller, query.as_deref(), &body);
                    reply(blocking(call).await)
                }
                Err(reject) => reject.into_response(),
            }
        })
    }

    fn log_api(&self, message: &str) {
        self.service.log_api(message);
    }

    fn metrics(&self) -> Option<String> {
        self.service.metrics()
    }

    fn route_label(&self, path: &str) -> &'static str {
        self.service
            .routes()
            .iter()
            .find(|r| r.path == path)
            .map_or(crate::metrics::OTHER_ROUTE, |r| r.path)
    }
}

/// The query and the body of an admitted request, the body checked to be JSON so that a
/// service's own errors are about what the document says, not its syntax.
async fn request_of(req: Request<Incoming>) -> Result<(Option<String>, Vec<u8>), Reject> {
    let query = req.uri().query().map(str::to_owned);
    let body = read_body(req.into_body(), MAX_SERVICE_BODY).await?;
    if !body.is_empty() {
        serde_json::from_slice::<IgnoredAny>(&body)
            .map_err(|e| Reject::invalid(format!("the request body is not JSON: {e}")))?;
    }
    Ok((query, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_route_tables_are_refused() {
        let ok = [
            ServiceRoute::new("GET", "/v1/rollouts", Role::Reader),
            ServiceRoute::new("POST", "/v1/rollouts", Role::Admin),
        ];
        assert_eq!(check_routes(&ok), Ok(()));
        for bad in [
            [ok[0], ok[0]],
            [ok[0], ServiceRoute::new("get", "/x", Role::Reader)],
            [ok[0], ServiceRoute::new("", "/x", Role::Reader)],
            [ok[0], ServiceRoute::new("GET", "x", Role::Reader)],
            [ok[0], ServiceRoute::new("GET", "/x?y=1", Role::Reader)],
        ] {
            assert!(check_routes(&bad).is_err(), "{bad:?}");
        }
    }
}
