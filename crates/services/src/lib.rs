//! The services a slate node runs besides its own (docs/node.md, "Services"), as values: what a
//! declaration says and the checks it must pass ([`spec`]), the order a set starts and stops in
//! ([`order`]), and when a service that ended is started again ([`restart`]). Declared in the
//! image profile's `[[services]]` (baked into the image with its node configuration) and in the
//! machine configuration's (per node); machined runs them (`crates/machined/src/boot/services`).
//!
//! Pure: no process, file or clock. Whether a program exists is asked through a function the
//! caller passes (the imager looks into the root it builds, machined at its own root).

pub mod order;
pub mod restart;
pub mod spec;

pub use order::{start_order, stop_waves, Milestone};
pub use restart::{Backoff, Exit, RestartPolicy};
pub use spec::{check_argv, check_socket_addr, Limits, ReadyCheck, ServiceSpec, StopSignal};

/// Why a declaration or a set of them is refused. Each names the service and, for a field, the
/// field as it is written in TOML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    #[error("service {service:?}: {field}: {reason}")]
    Invalid {
        service: String,
        field: &'static str,
        reason: String,
    },
    #[error("service {0:?} is declared twice")]
    Duplicate(String),
    #[error("service {service:?}: depends_on: {dependency:?} is neither a service nor a milestone ({})", Milestone::NAMES.join(", "))]
    UnknownDependency { service: String, dependency: String },
    #[error("services depend on each other in a circle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
}
