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
//! The GRUB variant ([`write_grub_image`], `slate_bootloader::grub` for the ESP files) lays out the same partitions with
//! GRUB, its `grub.cfg` and `grubenv`, and the A/B slots on the ESP.
//!
//! [`slate_esp::fat::write_file_atomically`] (temp name, flush, rename, flush) is the ESP file writer that
//! upgrades reuse.

mod grub_image;
mod image;

use slate_disk::DiskError;
use slate_esp::{fat, EspError};
use slate_layout::LayoutError;
use slate_meta::MetaError;

pub use grub_image::{write_grub_image, GrubImagePlan};
pub use image::{write_image, ImagePlan, ImageStep, CLEARED_HEAD};

/// Why an image could not be written. Each variant names the partition, file or rule involved.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The layout is invalid or does not fit the disk, or the table did not read back as
    /// written.
    #[error(transparent)]
    Layout(#[from] LayoutError),
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
    /// The ESP could not be written, or a boot file name was refused.
    #[error(transparent)]
    Esp(#[from] EspError),
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
