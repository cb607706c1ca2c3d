//! The META store: the few values a node keeps across reboots outside any filesystem — the
//! revert marker (`Upgrade`), the staged-upgrade handoff, and the like.
//!
//! Byte-compatible with the Talos ADV layout (docs/formats.md §1): a 1 MiB partition holding two
//! 256 KiB copies of a checksummed tag/value block and, at its tail, the legacy syslinux ADV.
//! Pure: all access goes through the [`slate_disk::Disk`] trait.

mod adv;
mod legacy;
pub mod payload;
pub mod pins;
pub mod replace;
mod store;
mod tag;

pub use adv::{Adv, AdvError, ADV_LEN, DATA_LEN};
pub use legacy::{LegacyAdv, LEGACY_LEN};
pub use store::{Entry, MetaError, MetaStore, Source, META_LEN};
pub use tag::{parse_tag, tag_name, tags};
