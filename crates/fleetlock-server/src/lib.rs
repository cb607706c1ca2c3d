//! The FleetLock lock server's edge: HTTP ([`http`]), optionally inside TLS or mutual TLS
//! ([`tls`]: the files read, naming them in errors), on the listener `slate-https` gives every
//! slate server, the local file store ([`file_store`]) and the etcd store ([`etcd_store`]).
//! Its `/metrics` ([`metrics`]) counts requests, store errors and lost swaps, and reads each
//! group's slots at the scrape. What a request means is `slate-fleetlock`'s; this crate only moves bytes between sockets,
//! files, etcd and that crate.

#[cfg(feature = "etcd")]
pub mod etcd_store;
pub mod file_store;
pub mod http;
pub mod metrics;
pub mod tls;

#[cfg(feature = "etcd")]
pub use etcd_store::EtcdStore;
pub use file_store::FileStore;
pub use http::{Log, Server, ServerError, ServerHandle};
pub use metrics::{Counted, LockMetrics};
pub use tls::{Tls, TlsError, DEFAULT_HANDSHAKE_TIMEOUT};
