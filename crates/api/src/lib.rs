//! The slate node API: HTTPS/1.1 with mutual TLS between the `slate` CLI and machined.
//!
//! - [`gen_certs`] writes the fleet CA, the client CA, the services' serving certificate and
//!   one client certificate per [`Role`] (ECDSA P-256; the role is the subject Organization
//!   `os:<role>`, as in Talos); [`issue_node_ca`] makes a node's own name-constrained issuing
//!   CA under the fleet CA (docs/trust.md: no node holds a key anyone else trusts).
//! - The server ([`serve`], [`serve_blocking`], [`spawn`]) requires a client certificate signed
//!   by the client CA, takes the caller's role from it, and serves [`ROUTES`] over a
//!   [`NodeBackend`]; a service that hears from nodes also takes node certificates under the
//!   fleet CA, as [`Role::Node`] callers ([`Caller`]).
//! - Other slate services (the rollout operator) serve their own JSON routes on the same
//!   server ([`serve_service`], [`spawn_service`] over a [`JsonService`] and its
//!   [`ServiceRoute`]s), so that one CA and one set of role certificates cover the whole system
//!   and every server refuses, logs and answers errors alike; a service may serve HTML pages
//!   too ([`ServiceRoute::page`], [`JsonService::page`], [`Page`]). Only the routes differ: TLS,
//!   timeouts, the role check, 404/405/403/413, error JSON and shutdown are the node API's.
//! - [`Client`] is a blocking client for a non-async CLI; [`Client::call`] reaches a service.
//!
//! `api/openapi.yaml` at the repository root describes the same routes and types; the tests
//! keep the two in step.
//!
//! A non-async program (machined) runs the server on its own thread:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo(backend: Arc<dyn slate_api::NodeBackend>) -> Result<(), slate_api::ServerError> {
//! let config = slate_api::ServerConfig::from_dir(
//!     "0.0.0.0:50000".parse().unwrap(),
//!     std::path::Path::new("pki"),
//! )?;
//! let server = slate_api::spawn(config, backend)?; // bound, certificates checked
//! // … later, before rebooting:
//! server.shutdown()?;
//! # Ok(()) }
//! ```
//!
//! A service gets a serving certificate from the fleet CA ([`generate_key_pem`], then
//! [`issue_serving_cert`] with [`serving_names`]) and takes client certificates of the client
//! CA:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo(listen: std::net::SocketAddr, ca: &[u8], cert: &[u8], key: &[u8],
//! #     operator: Arc<dyn slate_api::JsonService>) -> Result<(), slate_api::ServerError> {
//! let config = slate_api::ServerConfig::new(listen, ca, cert, key);
//! let server = slate_api::spawn_service(config, operator)?;
//! # server.shutdown() }
//! ```

mod backend;
mod body;
mod certs;
mod client;
mod handlers;
mod http;
mod identity;
mod limits;
mod logq;
mod metrics;
mod node_ca;
mod node_metrics;
mod pace;
mod page;
mod routes;
mod server;
mod service;
mod tls;
mod types;
mod upload;

pub use backend::{BackendError, EventStream, LineStream, NodeBackend, NodeMetrics};
pub use certs::{
    client_cert_file, client_key_file, gen_certs, issue_client_cert, CertError, GeneratedCerts,
    CA_CERT, CA_KEY, CLIENT_CA_CERT, CLIENT_CA_KEY, SERVICE_CERT, SERVICE_KEY,
};
pub use client::{Client, ClientError, ClientTls};
pub use handlers::MAINTENANCE_TOKEN_HEADER;
pub use identity::{
    fingerprint, generate_key_pem, issue_node_client_cert, issue_serving_cert, self_signed_cert,
    serving_names,
};
pub use logq::{LOG_QUEUE, MAX_LOGGED_FIELD, MAX_LOG_LINE};
pub use node_ca::{issue_node_ca, permitted_names, NodeTrust};
pub use node_metrics::node_metrics;
pub use page::{escape_html, Page};
pub use routes::{route_of, Endpoint, Route, MAINTENANCE_ENDPOINTS, ROUTES};
pub use server::{
    serve, serve_blocking, spawn, Limits, ServerConfig, ServerError, ServerHandle, Shutdown,
    BODY_MIN_RATE, BODY_TIMEOUT, CONNECTIONS_PER_CLIENT, DEFAULT_PORT, HEADER_TIMEOUT,
    MAX_CONNECTIONS, MAX_HEAD_BYTES,
};
pub use service::{serve_service, spawn_service, JsonService, ServiceRoute, MAX_SERVICE_BODY};
pub use types::{
    Accepted, AgentStatus, ApiError, ApplyConfigRequest, ApplyConfigResult, ApplyMode, BootSpan,
    BootTimes, Caller, ConfigView, ErrorCode, Event, EventKind, Failure, MemoryUse, Milestone,
    Mode, NodeServiceStatus, PinRequest, PinResult, RebootMode, RebootRequest, Role,
    RollbackRecord, RollbackRequest, RollbackResult, SecureBootStatus, ServiceAction,
    ServiceControlRequest, ServicesView, SnapshotUpgradeRequest, Stage, Status, UpgradeRequest,
    UploadedBundle, VarStatus, VersionInfo,
};
pub use upload::{upload_room, MAX_UPLOAD_BYTES};
