//! The HTTPS listener slate's servers share: the node API and the services on its server
//! (`slate-api`) and the FleetLock server (`slate-fleetlock-server`) accept, shake hands and
//! shut down the same way; only what they serve differs.
//!
//! - [`tls`]: rustls' server configuration from PEM (ring, HTTP/1.1 by ALPN, an optional
//!   client certificate verifier), with errors that leave naming the source to the caller.
//! - [`run`] with an [`Accept`] and a [`Handler`]: the accept loop with its limits
//!   (connections, handshakes in progress), the handshake timeout, a [`Refusal`] for each
//!   connection turned away, and a graceful shutdown ([`SHUTDOWN_GRACE`]).
//! - [`serve_http1`]: hyper's HTTP/1.1 on one [`Connection`] until it ends or the [`Drain`]
//!   of a shutdown.
//! - [`Bound`]: a socket bound before anything runs, served on a thread of its own.
//!
//! What a connection means (roles, per-client limits, routes) and how refusals are logged
//! are the handler's; nothing here knows a site.

mod conn;
mod listen;
mod thread;
pub mod tls;

pub use conn::{http1, serve_http1, Connection, Drain, Stream};
pub use listen::{run, Accept, Handler, Refusal, DEFAULT_HANDSHAKE_TIMEOUT, SHUTDOWN_GRACE};
pub use thread::{runtime, stop, Bound, StartError};
