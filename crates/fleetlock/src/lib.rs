//! FleetLock v1, the reboot-coordination protocol that Fedora CoreOS' zincati speaks and
//! coreos/airlock serves (`docs/formats.md §8`), as values and functions without IO:
//!
//! - [`request`]: routing (`POST /v1/pre-reboot`, `POST /v1/steady-state`), the
//!   `fleet-lock-protocol: true` header and the `{"client_params":{"id","group"}}` body;
//! - [`answer`]: the answers, 200 with an empty body or `{"kind","value"}` with a bounded kind;
//! - [`semaphore`]: airlock's counting semaphore `{"total_slots","holders"}` and its two pure
//!   transitions, recursive lock and unlock-if-held;
//! - [`groups`]: the configured groups and their slots (`--group NAME=SLOTS`);
//! - [`store`]: the [`SemaphoreStore`] trait (load, compare-and-swap) that a file store or etcd
//!   implements, the bounded retry loop over it, and an in-memory store;
//! - [`service`]: one request in, one answer out, over any store;
//! - [`record`]: the file store's on-disk record (the semaphore plus its version).
//!
//! Sockets and files live in `slate-fleetlock-server`.

pub mod answer;
pub mod groups;
pub mod record;
pub mod request;
pub mod semaphore;
pub mod service;
pub mod store;

pub use answer::{Answer, ErrorKind, ReceivedRefusal, Refusal};
pub use groups::{GroupSpec, Groups, GroupsError};
pub use record::{encode_record, parse_record, RecordError};
pub use request::{
    encode_body, parse_body, parse_request, route, ClientId, ClientParams, GroupName,
    IdentityError, Operation, RequestError, RouteError,
};
pub use semaphore::{Full, Semaphore, SemaphoreError, Transition};
pub use service::{Request, Service};
pub use store::{
    lock, unlock, Applied, ApplyError, Change, MemStore, SemaphoreStore, StoreError, Version,
};
