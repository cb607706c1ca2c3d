//! Upgrade mode: a bundle's version written beside the running one on a slate disk and made the
//! next boot, the running version recorded as the fallback (`slate_bootloader`, whichever loader
//! the disk was installed with). On a node the target version's own slate runs this; offline it
//! upgrades a disk image.

use std::path::{Path, PathBuf};

use slate_bootloader::{
    Bootloader, BootloaderError, Grub, LoaderKind, MemEfiVars, SystemdBoot, UpgradeOutcome,
};
use slate_bootspec::{check_install_tries, InstallTriesError};
use slate_bundle::{BundleError, NATIVE_ARCH};
use slate_disk::{Disk, DiskError, FileDisk};
use slate_layout::LayoutError;
use slate_meta::{MetaError, MetaStore};
use slate_trust::{PolicyError, UpdateKind};

use crate::{open_trusted, OpenBundleError, Provenance, Trust};

/// What to upgrade to, and under which policy.
#[derive(Debug, Clone)]
pub struct UpgradeRequest {
    /// An installer bundle (OCI image layout directory).
    pub bundle: PathBuf,
    pub trust: Trust,
    /// The entry running now (default: the one the boot loader would boot).
    pub running_entry: Option<String>,
    /// The running system's variant, which the bundle's must match (`None`: not checked).
    pub variant: Option<String>,
    /// Allow an older version than the running one (META `VersionFloor` still applies).
    pub allow_downgrade: bool,
    /// Boot-counting tries for the new entry, within [`slate_bootspec::INSTALL_TRIES`].
    pub tries: u32,
    /// Check everything with the disk opened read-only, write nothing.
    pub dry_run: bool,
    /// The Secure Boot db the target's firmware trusts (on a node, the certificate its running
    /// image carries). `None`: whatever the disk's ESP enrols (`db.auth`), if it enrols keys.
    /// The new UKI must be signed by one of them, or nothing is written.
    pub secure_boot_db: Option<crate::TrustedCerts>,
    /// The new UKI as its verifier handed it over (`handover.rs`): taken from the sealed memfd
    /// instead of the bundle's file, and not hashed again. `None`: read and hashed here.
    pub uki_handover: Option<crate::UkiHandover>,
}

/// What [`upgrade`] is doing, in order.
#[derive(Debug)]
pub enum UpgradeEvent<'a> {
    /// The bundle is open and, unless told not to, its signature verified.
    Opened(&'a Provenance),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeReport {
    pub name: String,
    pub version: String,
    /// The running entry (the fallback).
    pub running_entry: String,
    pub running_version: String,
    pub kind: UpdateKind,
    pub uki_len: u64,
    pub tries: u32,
    /// Versions left on the ESP after the upgrade, at most (the bundle's install settings;
    /// systemd-boot only: GRUB's two slots always hold two).
    pub keep_versions: u32,
    /// Entries the upgrade deletes from the ESP, in order (with `dry_run`: would delete).
    pub prune: Vec<String>,
    /// What the boot loader did; `None` for a dry run.
    pub outcome: Option<UpgradeOutcome>,
}

/// Why an upgrade was refused or failed. Every refusal comes before the first write.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeModeError {
    /// `tries` is outside [`slate_bootspec::INSTALL_TRIES`]: the entry would be bad from the
    /// start, or read as uncounted and never rolled back.
    #[error(transparent)]
    Tries(#[from] InstallTriesError),
    #[error(transparent)]
    Bundle(#[from] OpenBundleError),
    /// A blob is missing or does not match its digest (the message names it).
    #[error(transparent)]
    Blob(#[from] BundleError),
    /// The new UKI would be refused by the target's Secure Boot firmware.
    #[error(transparent)]
    SecureBoot(#[from] crate::SecureBootError),
    #[error("opening {}", disk.display())]
    Open {
        disk: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the boot entries on {}", disk.display())]
    BootEntries {
        disk: PathBuf,
        #[source]
        source: BootloaderError,
    },
    // Either loader: a GRUB disk is not told about systemd-boot.
    #[error(
        "the boot loader on {} would boot nothing (no entry it selects): there is no running \
         version to upgrade from; install one with `slate installer install`",
        disk.display()
    )]
    NothingBoots { disk: PathBuf },
    #[error("no entry on {} is {entry:?}", disk.display())]
    NoSuchEntry { disk: PathBuf, entry: String },
    #[error("finding META on {}", disk.display())]
    FindMeta {
        disk: PathBuf,
        #[source]
        source: LayoutError,
    },
    #[error(transparent)]
    MetaView(#[from] DiskError),
    #[error("reading META")]
    ReadMeta(#[source] MetaError),
    #[error("upgrading {} from {running_version} to {target}", disk.display())]
    Refused {
        disk: PathBuf,
        running_version: String,
        target: String,
        /// Boxed: the other variants are a path and a source; this one would double them all.
        #[source]
        source: Box<PolicyError>,
    },
    #[error("reading the boot loader on {}", disk.display())]
    Loader {
        disk: PathBuf,
        #[source]
        source: BootloaderError,
    },
    #[error("upgrading {} to {version}", disk.display())]
    Write {
        disk: PathBuf,
        version: String,
        #[source]
        source: BootloaderError,
    },
}

/// Upgrade the slate installation on `disk` to the bundle's version. The bundle, the running
/// entry and the update policy (arch, variant, downgrade, META `VersionFloor`) are settled with
/// the disk open read-only; only then is it opened for writing. The bundle's install settings
/// say how many versions the ESP keeps (`keep_versions`, 2 if absent): this, the new version's
/// installer, applies them. A dry run also makes the boot loader's plan (systemd-boot: what it
/// would prune, and that the new UKI then fits) without writing.
pub fn upgrade(
    disk: &Path,
    request: &UpgradeRequest,
    progress: &mut dyn FnMut(UpgradeEvent<'_>),
) -> Result<UpgradeReport, UpgradeModeError> {
    // First of all: whoever called (CLI, machined, a test) may pass any number.
    check_install_tries(request.tries)?;
    let (bundle, provenance, handed) = open_trusted(
        &request.bundle,
        &request.trust,
        request.uki_handover.as_ref(),
    )?;
    progress(UpgradeEvent::Opened(&provenance));
    let manifest = bundle.manifest().clone();
    let open_error = |source| UpgradeModeError::Open {
        disk: disk.to_owned(),
        source,
    };
    // Offline there are no firmware variables to consult.
    let status = slate_bootloader::probe(
        FileDisk::open_read_only(disk).map_err(open_error)?,
        MemEfiVars::new(),
    )
    .and_then(|loader| loader.status())
    .map_err(|source| UpgradeModeError::BootEntries {
        disk: disk.to_owned(),
        source,
    })?;
    grub_env_writable(FileDisk::open_read_only(disk).map_err(open_error)?).map_err(|source| {
        UpgradeModeError::BootEntries {
            disk: disk.to_owned(),
            source,
        }
    })?;
    let running = match &request.running_entry {
        Some(entry) => entry.clone(),
        None => status
            .selected_file()
            .ok_or_else(|| UpgradeModeError::NothingBoots {
                disk: disk.to_owned(),
            })?
            .to_string(),
    };
    let running_version = status
        .entry(&running)
        .and_then(|e| e.version.clone())
        .ok_or_else(|| UpgradeModeError::NoSuchEntry {
            disk: disk.to_owned(),
            entry: running.clone(),
        })?;
    let facts = slate_trust::NodeFacts {
        arch: NATIVE_ARCH.into(),
        variant: request
            .variant
            .clone()
            .unwrap_or_else(|| manifest.variant.clone()),
        running_version: running_version.clone(),
        version_floor: version_floor(disk)?,
    };
    let kind = slate_trust::check_update(&manifest, &facts, request.allow_downgrade).map_err(
        |source| UpgradeModeError::Refused {
            disk: disk.to_owned(),
            running_version: running_version.clone(),
            target: manifest.version.clone(),
            source: Box::new(source),
        },
    )?;
    // Only a bundle the policy accepts is worth reading: the UKI is the one large blob.
    let uki = match handed {
        Some(uki) => uki,
        None => bundle.map_blob(slate_bundle::UKI_ROLE)?,
    };
    let secure_boot_db = match &request.secure_boot_db {
        Some(certs) => Some(certs.clone()),
        None => crate::enrolled_on(disk)?,
    };
    if let Some(trusted) = &secure_boot_db {
        crate::check_signed(
            &format!("the UKI of {} {}", manifest.name, manifest.version),
            &uki,
            trusted,
        )?;
    }
    let keep_versions = manifest.keep_versions();
    let mut report = UpgradeReport {
        name: manifest.name,
        version: manifest.version,
        running_entry: running,
        running_version,
        kind,
        uki_len: uki.len() as u64,
        tries: request.tries,
        keep_versions,
        prune: Vec::new(),
        outcome: None,
    };
    let loader_request = slate_bootloader::UpgradeRequest {
        uki: &uki,
        name: &report.name,
        version: &report.version,
        tries: request.tries,
        running_entry: &report.running_entry,
    };
    let loader_error = |source| UpgradeModeError::Loader {
        disk: disk.to_owned(),
        source,
    };
    let write_error = |source| UpgradeModeError::Write {
        disk: disk.to_owned(),
        version: report.version.clone(),
        source,
    };
    if request.dry_run {
        let file = FileDisk::open_read_only(disk).map_err(open_error)?;
        if slate_bootloader::detect(&file).map_err(loader_error)? == LoaderKind::SystemdBoot {
            let plan = SystemdBoot::new(file, MemEfiVars::new())
                .with_keep_versions(keep_versions)
                .plan_upgrade(&loader_request)
                .map_err(write_error)?;
            report.prune = plan.prune;
        }
        return Ok(report);
    }
    let file = FileDisk::open(disk).map_err(open_error)?;
    let outcome = loader(file, keep_versions)
        .map_err(loader_error)?
        .upgrade(&loader_request)
        .map_err(write_error)?;
    report.prune = outcome.removed.clone();
    report.outcome = Some(outcome);
    Ok(report)
}

/// On a GRUB disk, refuse an unreadable grubenv first: GRUB still boots the committed slot (from
/// the second record, docs/formats.md §4.3), but slate writes nothing to the loader, and the
/// version a bundle is judged against would be read through the damage.
fn grub_env_writable(disk: FileDisk) -> Result<(), BootloaderError> {
    if slate_bootloader::detect(&disk)? == LoaderKind::Grub {
        Grub::new(disk).grub_status()?.writable()?;
    }
    Ok(())
}

/// The backend of the loader `disk` was installed with ([`slate_bootloader::probe`]), offline
/// (no firmware variables), systemd-boot keeping `keep_versions` versions.
fn loader<D: Disk + 'static>(
    disk: D,
    keep_versions: u32,
) -> Result<Box<dyn Bootloader>, BootloaderError> {
    Ok(match slate_bootloader::detect(&disk)? {
        LoaderKind::Grub => Box::new(Grub::new(disk)),
        LoaderKind::SystemdBoot => {
            Box::new(SystemdBoot::new(disk, MemEfiVars::new()).with_keep_versions(keep_versions))
        }
    })
}

/// META `VersionFloor` of the slate disk, if one is kept.
fn version_floor(disk: &Path) -> Result<Option<String>, UpgradeModeError> {
    let file = FileDisk::open_read_only(disk).map_err(|source| UpgradeModeError::Open {
        disk: disk.to_owned(),
        source,
    })?;
    let meta = slate_layout::open_partition(file, slate_layout::META_LABEL).map_err(|source| {
        UpgradeModeError::FindMeta {
            disk: disk.to_owned(),
            source,
        }
    })?;
    let store = MetaStore::open(meta).map_err(UpgradeModeError::ReadMeta)?;
    // The upgrade ends by writing META: refused here, before the ESP is touched, when META is
    // neither valid nor blank (what it holds would be lost).
    store.check_writable().map_err(UpgradeModeError::ReadMeta)?;
    Ok(store
        .get(slate_meta::tags::VERSION_FLOOR)
        .map(|v| String::from_utf8_lossy(v).trim().to_string()))
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
pub(crate) mod tests;
