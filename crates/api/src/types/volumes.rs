//! What the node says of its data volumes.

use serde::{Deserialize, Serialize};

/// `/var` as this boot set it up (`Status::var`, docs/node.md "/var modes").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VarStatus {
    /// `persistent`, `ephemeral` or `tpm2`.
    pub mode: String,
    /// Whether the volume is encrypted.
    pub encrypted: bool,
    /// How it was unlocked at this boot (absent: not encrypted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlocked: Option<String>,
    /// What this boot did before mounting it: `mounted`, `checked` (e2fsck ran), `formatted
    /// (blank)` or `formatted (ephemeral)`; `not mounted: locked` when a `tpm2` /var was
    /// refused.
    pub prepared: String,
}
