//! The FleetLock lock server's edge: HTTP ([`http`]), the local file store ([`file_store`])
//! and the etcd store ([`etcd_store`]). What a request means is `slate-fleetlock`'s; this crate
//! only moves bytes between sockets, files, etcd and that crate.

#[cfg(feature = "etcd")]
pub mod etcd_store;
pub mod file_store;
pub mod http;

#[cfg(feature = "etcd")]
pub use etcd_store::EtcdStore;
pub use file_store::FileStore;
pub use http::{Log, Server, ServerError, ServerHandle};
