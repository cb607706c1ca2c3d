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
//!
//! Two more modes read an installer bundle and are what `slate installer` runs:
//! [`install()`] lays the bundle's version onto a blank disk (the image mode over a plan made
//! from the bundle), [`upgrade()`] writes it beside the running version of a slate disk through
//! `slate_bootloader`. Both check everything, the bundle's signature first, before the disk is
//! opened for writing, and both can stop there (`dry_run`) and report the plan.

mod grub_image;
mod handover;
mod image;
mod install;
mod pool;
mod rollback;
mod secure_boot;
mod state;
mod upgrade;

use std::path::{Path, PathBuf};

use slate_bundle::{Bundle, BundleError};
use slate_disk::DiskError;
use slate_esp::{fat, EspError};
use slate_layout::LayoutError;
use slate_meta::MetaError;
use slate_trust::TrustError;

pub use grub_image::{write_grub_image, GrubImagePlan};
pub use handover::{HandoverEnvError, UkiHandover, UKI_DIGEST_ENV, UKI_FD_ENV};
pub use image::{write_image, ImagePlan, ImageStep, CLEARED_HEAD};
pub use install::{
    install, InstallEvent, InstallModeError, InstallPlan, InstallReport, InstallRequest,
};
pub use pool::{
    configure_pool, find_pool, require_root, MountedPool, PoolConfigured, PoolError,
    HOME_SUBVOLUME, STATE_SUBVOLUME,
};
pub use rollback::{rollback, RollbackModeError};
pub use secure_boot::{
    check_signed, enrolled_on, trusted_from_db_auth, trusted_from_pem, SecureBootError,
};
pub use slate_secureboot::{Signer, TrustedCerts};
pub use state::{seed_config, SeedReport, StateError, StateFilesystem};
pub use upgrade::{upgrade, UpgradeEvent, UpgradeModeError, UpgradeReport, UpgradeRequest};

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
    /// A boot file the image's own enrolled keys would refuse.
    #[error(transparent)]
    SecureBoot(#[from] SecureBootError),
    #[error("partition {label}: {action}")]
    Disk {
        label: String,
        action: &'static str,
        #[source]
        source: DiskError,
    },
}

/// How a bundle is trusted before any of it is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Its signature must verify with one of the `*.pub` keys in this directory (on a node,
    /// /etc/slate/trusted-keys).
    KeysIn(PathBuf),
    /// The signature is not checked; every blob used is still checked against its digest.
    /// For bundles one built oneself.
    NotVerified,
}

/// What opening a bundle established. Reported before any other check, so that a refusal
/// further on reads against a known bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provenance {
    Signed {
        name: String,
        version: String,
        manifest_digest: String,
        key_id: slate_trust::KeyId,
    },
    /// [`Trust::NotVerified`]: the signature was not looked at.
    NotVerified,
}

/// Why a bundle could not be opened or was not trusted.
#[derive(Debug, thiserror::Error)]
pub enum OpenBundleError {
    #[error("reading the bundle {}", dir.display())]
    Read {
        dir: PathBuf,
        #[source]
        source: BundleError,
    },
    #[error("loading trusted keys from {}", dir.display())]
    TrustedKeys {
        dir: PathBuf,
        #[source]
        source: TrustError,
    },
    #[error("verifying the bundle {}", dir.display())]
    Verify {
        dir: PathBuf,
        #[source]
        source: TrustError,
    },
}

/// Open the bundle in `dir` and check it as `slate verify` does (`slate_trust::verify_bundle`:
/// the signature unless `trust` says not to, then every blob the manifest names, read by this
/// mode or not). Each blob is hashed once: the bundle remembers it, and the mode's later read
/// (`map_blob`, `read_blob`) checks only its size; at 256 MiB the hash is most of an upgrade's
/// time, and a large layer's is spread over the cores by its chunk digests.
///
/// A UKI handed over by the process that verified it (`handover.rs`) is taken first, checked
/// against the manifest's digest and size, and counts as verified: the checks after it do not
/// read its file. It is returned, mapped, for the mode to write.
fn open_trusted(
    dir: &Path,
    trust: &Trust,
    handover: Option<&UkiHandover>,
) -> Result<(Bundle, Provenance, Option<slate_bundle::BlobBytes>), OpenBundleError> {
    let bundle = Bundle::open(dir, None).map_err(|source| OpenBundleError::Read {
        dir: dir.to_owned(),
        source,
    })?;
    let handed = handover
        .map(|h| h.take(&bundle))
        .transpose()
        .map_err(|source| OpenBundleError::Read {
            dir: dir.to_owned(),
            source,
        })?;
    let provenance = match trust {
        Trust::KeysIn(keys_dir) => {
            let keys = slate_trust::load_trusted_keys(keys_dir).map_err(|source| {
                OpenBundleError::TrustedKeys {
                    dir: keys_dir.clone(),
                    source,
                }
            })?;
            let (verified, _) = slate_trust::verify_bundle(&bundle, &keys).map_err(|source| {
                OpenBundleError::Verify {
                    dir: dir.to_owned(),
                    source,
                }
            })?;
            Provenance::Signed {
                name: bundle.manifest().name.clone(),
                version: bundle.manifest().version.clone(),
                manifest_digest: verified.manifest_digest,
                key_id: verified.key_id,
            }
        }
        Trust::NotVerified => {
            // No signature, but the same check of every blob `verify_bundle` makes.
            bundle
                .verify_blobs()
                .map_err(|source| OpenBundleError::Read {
                    dir: dir.to_owned(),
                    source,
                })?;
            Provenance::NotVerified
        }
    };
    Ok((bundle, provenance, handed))
}
