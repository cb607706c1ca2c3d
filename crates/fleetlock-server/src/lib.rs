//! The FleetLock lock server's edge: HTTP ([`http`]) and the local file store
//! ([`file_store`]). What a request means is `slate-fleetlock`'s; this crate only moves bytes
//! between sockets, files and that crate.

pub mod file_store;
pub mod http;

pub use file_store::FileStore;
pub use http::{Log, Server, ServerError, ServerHandle};
