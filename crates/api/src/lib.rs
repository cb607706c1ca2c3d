//! The slate node API: HTTPS/1.1 with mutual TLS between the `slate` CLI and machined.
//!
//! - [`gen_certs`] writes a CA, the node's server certificate and one client certificate per
//!   [`Role`] (ECDSA P-256; the role is the subject Organization `os:<role>`, as in Talos).
//! - The server ([`serve`], [`serve_blocking`], [`spawn`]) requires a client certificate signed
//!   by the CA, takes the caller's role from it, and serves [`ROUTES`] over a [`NodeBackend`].
//! - [`Client`] is a blocking client for a non-async CLI.
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
//!     std::path::Path::new("/system/secrets/api"),
//! )?;
//! let server = slate_api::spawn(config, backend)?; // bound, certificates checked
//! // … later, before rebooting:
//! server.shutdown()?;
//! # Ok(()) }
//! ```

mod backend;
mod body;
mod certs;
mod client;
mod handlers;
mod identity;
mod routes;
mod server;
mod tls;
mod types;
mod upload;

pub use backend::{BackendError, EventStream, LineStream, NodeBackend};
pub use certs::{
    client_cert_file, client_key_file, gen_certs, CertError, GeneratedCerts, CA_CERT, CA_KEY,
    NODE_CERT, NODE_KEY,
};
pub use client::{Client, ClientError};
pub use handlers::MAINTENANCE_TOKEN_HEADER;
pub use identity::{
    fingerprint, generate_key_pem, issue_serving_cert, self_signed_cert, serving_names,
};
pub use routes::{route_of, Endpoint, Route, MAINTENANCE_ENDPOINTS, ROUTES};
pub use server::{
    serve, serve_blocking, spawn, ServerConfig, ServerError, ServerHandle, Shutdown, DEFAULT_PORT,
};
pub use types::{
    Accepted, AgentStatus, ApiError, ApplyConfigRequest, ApplyConfigResult, ApplyMode, ConfigView,
    ErrorCode, Event, EventKind, Failure, Mode, RebootMode, RebootRequest, Role, Stage, Status,
    UpgradeRequest, UploadedBundle, VersionInfo,
};
pub use upload::MAX_UPLOAD_BYTES;
