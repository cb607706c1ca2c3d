//! The bottom layer: what every other layer reads and none of it imports anything of
//! machined's above. The node's state ([`node::Node`], with the machine configuration's
//! [`machine_state::MachineState`] and the [`snapshot_root::SnapshotRoot`] it booted from),
//! where things are mounted ([`paths`]), crash-safe file writes ([`files`]), the task wrapper
//! every sequence uses ([`task`]), the journal and boot timings, the system disk's META, and
//! what the node's services answer ([`services::Workload`]).

pub mod boot_times;
pub mod files;
pub mod journal;
pub mod machine_state;
pub mod metrics;
pub mod node;
pub mod paths;
pub mod services;
pub mod snapshot_root;
pub mod system_disk;
pub mod task;
