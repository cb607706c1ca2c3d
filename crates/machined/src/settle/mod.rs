//! The settle layer: the upgrade transaction's end. Once a boot is healthy it is committed, on
//! a fatal error a pending upgrade is reverted; [`decision::decide`] takes that decision as a
//! pure function of the facts, for an A/B disk ([`transaction`], through the boot loader) and
//! a snapshot root ([`snapshot`], through the snapshot engine) alike. Also here: what META's
//! records say at boot ([`records`]), the kexec into the next boot ([`kexec`]), and the
//! firmware boot options a committed boot keeps first ([`boot_options`]). Imports only `base`.

pub mod boot_options;
pub mod decision;
pub mod kexec;
pub mod records;
pub mod snapshot;
pub mod transaction;

/// Why the transaction could not be settled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// A health check failed (its report): the boot is not committed.
    #[error("{0}")]
    Unhealthy(String),
    /// The loader could not be read or written, or the facts were incomplete.
    #[error("{0}")]
    Failed(String),
}
