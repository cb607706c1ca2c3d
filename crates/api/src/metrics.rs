//! `GET /metrics` on every server the node API's code runs (machined, the rollout operator):
//! the server's own counters — requests by route and status, connections refused by each
//! limit, log lines dropped — and the site's (a node's state, a service's own). Role reader,
//! as a scrape reads and changes nothing; Prometheus presents a reader certificate.
//!
//! It is answered here, before the site's routes, so that every site answers it alike; the
//! node's route table lists it too (for `openapi.yaml`, and the role).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use slate_metrics::{counter, counter_vec, IntCounter, IntCounterVec, Registry};

use crate::body::{response, Body};
use crate::http::{admit, blocking, drain, Reject, Served};
use crate::service::ServiceRoute;
use crate::types::{Caller, ErrorCode, Role};

/// The route every site serves; a service may not list it itself.
pub const METRICS: ServiceRoute = ServiceRoute::new("GET", slate_metrics::PATH, Role::Reader);

/// The label of requests whose path no route has (bounded: clients choose paths).
pub(crate) const OTHER_ROUTE: &str = "other";

/// What one server counts while it runs (reset when its process restarts).
pub(crate) struct ApiMetrics {
    registry: Registry,
    requests: IntCounterVec,
    refused: IntCounterVec,
    pub(crate) log_dropped: IntCounter,
}

impl ApiMetrics {
    pub(crate) fn new() -> Self {
        let registry = Registry::new();
        let requests = counter_vec(
            &registry,
            "slate_api_requests_total",
            "API requests answered, by route (its path; `other` for paths no route has) and \
             HTTP status.",
            &["route", "status"],
        );
        let refused = counter_vec(
            &registry,
            "slate_api_connections_refused_total",
            "Connections turned away, by the limit that refused them: connections (the \
             server's), handshakes (in progress at once), per_client (connections of one \
             client certificate), tls (a failed handshake), handshake_timeout, accept (accept \
             failed).",
            &["limit"],
        );
        let log_dropped = counter(
            &registry,
            "slate_api_log_lines_dropped_total",
            "API log lines dropped because the log could not keep up (a bounded queue).",
        );
        // Every limit shows, at 0, before its first refusal: a rate over a missing series is
        // no rate at all.
        for limit in [
            "connections",
            "handshakes",
            "per_client",
            "tls",
            "handshake_timeout",
            "accept",
        ] {
            refused.with_label_values(&[limit]);
        }
        ApiMetrics {
            registry,
            requests,
            refused,
            log_dropped,
        }
    }

    pub(crate) fn request(&self, route: &str, status: StatusCode) {
        self.requests
            .with_label_values(&[route, status.as_str()])
            .inc();
    }

    pub(crate) fn refused(&self, limit: &str) {
        self.refused.with_label_values(&[limit]).inc();
    }
}

/// `GET /metrics`: admitted like any reader route (404/405/403 alike), no query; then the
/// site's text and the server's counters. The site's part runs on the blocking pool (a node
/// reads its state, the operator etcd).
pub(crate) async fn scrape(
    req: Request<Incoming>,
    served: Arc<Served>,
    caller: Option<Caller>,
) -> Response<Body> {
    let role = caller.as_ref().map(|c| c.role);
    let method = req.method().as_str().to_owned();
    if let Err(refused) = admit(&[METRICS], &method, slate_metrics::PATH, |_| Ok(role)) {
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
        Err(e) => return crate::http::backend_error(e),
    };
    let mut families = served.metrics.registry.gather();
    families.retain(|f| !f.get_metric().is_empty());
    let own = slate_metrics::encode(families);
    response(
        StatusCode::OK,
        slate_metrics::CONTENT_TYPE,
        Body::full(format!("{text}{own}").into_bytes()),
    )
}
