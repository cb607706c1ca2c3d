//! Simulated nodes at scale, to test the rollout operator with 1,000 nodes and benchmark it
//! with 10,000, and to inject faults, without a single VM.
//!
//! Each simulated node is a real node API server (`slate_api::serve`, mutual TLS) on its own
//! `127.0.0.1` port over a [`SimBackend`] — a small state machine instead of disks and boot
//! loaders — so the operator drives it exactly as it drives a machine: `POST /v1/upgrade`,
//! `GET /v1/status`. Each has an identity of its own ([`Identities`]: its serving certificate
//! and the client certificate it reports with name it). Nodes report themselves through a
//! [`Reporter`] (the operator's heartbeat endpoint in the binary, a recorder in tests).
//!
//! What the simulator knows for sure is kept apart from what the operator believes: the
//! ground-truth log ([`Fleet::events`]) records every upgrade request a node accepted or
//! refused and how each ended, and [`Fleet::max_in_flight`] the exact per-group concurrency
//! — what a test checks the operator's policies against.
//!
//! A simulated upgrade: accepted (busy, stage `Upgrading`) → after `upgrade_time` the node
//! reboots: its listener is closed, so clients get *connection refused* for `reboot_time` →
//! it comes back committed on the new version, or reverted to the old one with
//! `last_failure` set, as [`Behaviour`] decides. It stops being busy only once its API
//! listens again, so a test that waits for [`Fleet::wait_idle`] can talk to it at once.

mod behaviour;
mod fleet;
mod heartbeat;
mod identity;
mod listen;
mod log;
mod node;
mod shared;

pub use behaviour::{image_version, Behaviour};
pub use fleet::{raise_file_limit, Fleet, FleetError, FleetSpec, GroupSpec};
pub use heartbeat::{ReportStats, Reporter};
pub use identity::{Identities, NodeIdentity};
pub use log::{SimEvent, SimEventKind};
pub use node::{SimBackend, REVERT_REASON};
