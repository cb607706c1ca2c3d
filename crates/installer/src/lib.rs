//! The installer's image mode: writes a complete, bootable slate disk — GPT, a FAT32 ESP with
//! systemd-boot, one UKI and `loader.conf`, an empty META, blank STATE and EPHEMERAL — through
//! the [`slate_disk::Disk`] trait.
//!
//! No kernel mounts, no root, no external programs: the partition table is written by
//! `slate-layout`, the FAT file system by the userspace `fatfs` crate over a partition view,
//! META by `slate-meta`. The code that builds an image file is therefore the code a node runs on
//! its own disk, and the code the crash matrix replays.
//!
//! Output is reproducible: GUIDs and the FAT volume id derive from the image id, FAT timestamps
//! from the plan's `SOURCE_DATE_EPOCH`.
//!
//! The GRUB variant ([`write_grub_image`], module [`grub`]) lays out the same partitions with
//! GRUB, its `grub.cfg` and `grubenv`, and the A/B slots on the ESP.
//!
//! [`fat::write_file_atomically`] (temp name, flush, rename, flush) is the ESP file writer that
//! upgrades reuse.

mod dot_entries;
pub mod fat;
pub mod grub;
mod image;
mod names;

use slate_disk::DiskError;
use slate_layout::LayoutError;
use slate_meta::MetaError;

pub use grub::{write_grub_image, GrubImagePlan};
pub use image::{
    write_image, ImagePlan, ImageStep, CLEARED_HEAD, FALLBACK_LOADER_PATH, LOADER_CONF_PATH,
    SYSTEMD_BOOT_PATH, UKI_DIR,
};
pub use names::{loader_conf, uki_file_name, validate_uki_file_name, MAX_FILE_NAME};

/// Why an image could not be written. Each variant names the partition, file or rule involved.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The layout is invalid or does not fit the disk, or the table did not read back as
    /// written.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("invalid boot file name {name:?}: {reason}")]
    InvalidFileName { name: String, reason: String },
    #[error(
        "invalid loader.conf default pattern {pattern:?}: use ASCII letters, digits, \
         '+ - _ .' and glob characters '* ? [ ] !' (or @saved)"
    )]
    InvalidLoaderDefault { pattern: String },
    #[error("invalid image plan: {0}")]
    InvalidPlan(String),
    #[error(
        "the EFI partition ({esp_len} bytes) is too small for FAT32: it would hold about \
         {clusters} clusters of {cluster_size} bytes, FAT32 needs at least {min}",
        min = fat::FAT32_MIN_CLUSTERS
    )]
    EspTooSmall {
        esp_len: u64,
        cluster_size: u64,
        clusters: u64,
    },
    #[error(
        "the UKI {name:?} ({uki_len} bytes) does not fit the EFI partition ({esp_len} bytes): \
         at most {available} bytes are left for it"
    )]
    UkiDoesNotFit {
        name: String,
        uki_len: u64,
        esp_len: u64,
        available: u64,
    },
    #[error("EFI partition: {action}")]
    Esp {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("EFI partition: {action} {path}")]
    EspFile {
        path: String,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("META partition: formatting")]
    Meta(#[source] MetaError),
    #[error("partition {label}: {action}")]
    Disk {
        label: String,
        action: &'static str,
        #[source]
        source: DiskError,
    },
}
