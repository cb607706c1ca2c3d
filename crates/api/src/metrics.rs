//! The counters of every server the node API's code runs (machined, the rollout operator):
//! requests by route and status, connections refused by each limit, log lines dropped. `GET
//! /metrics` (`http.rs`, role reader: a scrape reads and changes nothing, and Prometheus
//! presents a reader certificate) answers them after the site's own text, for every site alike.

use hyper::StatusCode;
use slate_metrics::{counter, counter_vec, IntCounter, IntCounterVec, Registry};

/// The label of requests whose path no route has (bounded: clients choose paths).
pub(crate) const OTHER_ROUTE: &str = "other";

/// What one server counts while it runs (reset when its process restarts).
pub(crate) struct ApiMetrics {
    pub(crate) registry: Registry,
    requests: IntCounterVec,
    refused: IntCounterVec,
    handshakes: IntCounterVec,
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
        let handshakes = counter_vec(
            &registry,
            "slate_api_tls_handshakes_total",
            "TLS handshakes completed, by kind: full (certificates sent and signed) or resumed \
             (a session ticket from an earlier connection).",
            &["kind"],
        );
        for kind in ["full", "resumed"] {
            handshakes.with_label_values(&[kind]);
        }
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
            handshakes,
            log_dropped,
        }
    }

    pub(crate) fn request(&self, route: &str, status: StatusCode) {
        self.requests
            .with_label_values(&[route, status.as_str()])
            .inc();
    }

    pub(crate) fn handshake(&self, resumed: bool) {
        let kind = if resumed { "resumed" } else { "full" };
        self.handshakes.with_label_values(&[kind]).inc();
    }

    pub(crate) fn refused(&self, limit: &str) {
        self.refused.with_label_values(&[limit]).inc();
    }
}
