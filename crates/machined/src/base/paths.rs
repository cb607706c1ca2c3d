//! Where a slate node mounts its volumes. Every layer names them; only the boot layer's
//! volume tasks mount them.

use std::path::PathBuf;

/// STATE (or a snapshot root's `@state`): the machine configuration, the node's key and
/// certificate, the /etc overlay's upper directory.
pub const STATE_MOUNT: &str = slate_node_fs::volumes::STATE_MOUNT;
/// EPHEMERAL: /var, where received bundles wait.
pub const EPHEMERAL_MOUNT: &str = slate_node_fs::volumes::EPHEMERAL_MOUNT;

/// [`STATE_MOUNT`] as a path.
pub fn state_dir() -> PathBuf {
    PathBuf::from(STATE_MOUNT)
}
