//! Upgrade mode: a bundle's version written beside the running one on a slate disk and made the
//! next boot, the running version recorded as the fallback (`slate_bootloader`, whichever loader
//! the disk was installed with). On a node the target version's own slate runs this; offline it
//! upgrades a disk image.

use std::path::{Path, PathBuf};

use slate_bootloader::{BootloaderError, MemEfiVars, UpgradeOutcome};
use slate_bundle::{BundleError, NATIVE_ARCH};
use slate_disk::{DiskError, FileDisk};
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
    /// Boot-counting tries for the new entry.
    pub tries: u32,
    /// Check everything with the disk opened read-only, write nothing.
    pub dry_run: bool,
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
    /// What the boot loader did; `None` for a dry run.
    pub outcome: Option<UpgradeOutcome>,
}

/// Why an upgrade was refused or failed. Every refusal comes before the first write.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeModeError {
    #[error(transparent)]
    Bundle(#[from] OpenBundleError),
    /// A blob is missing or does not match its digest (the message names it).
    #[error(transparent)]
    Blob(#[from] BundleError),
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
    #[error("systemd-boot would boot nothing on this disk")]
    NothingBoots,
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
/// the disk open read-only; only then is it opened for writing.
pub fn upgrade(
    disk: &Path,
    request: &UpgradeRequest,
    progress: &mut dyn FnMut(UpgradeEvent<'_>),
) -> Result<UpgradeReport, UpgradeModeError> {
    let (bundle, provenance) = open_trusted(&request.bundle, &request.trust)?;
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
    let running = match &request.running_entry {
        Some(entry) => entry.clone(),
        None => status
            .selected_file()
            .ok_or(UpgradeModeError::NothingBoots)?
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
    let uki = bundle.read_blob(slate_bundle::UKI_ROLE)?;
    let mut report = UpgradeReport {
        name: manifest.name,
        version: manifest.version,
        running_entry: running,
        running_version,
        kind,
        uki_len: uki.len() as u64,
        tries: request.tries,
        outcome: None,
    };
    if request.dry_run {
        return Ok(report);
    }
    let file = FileDisk::open(disk).map_err(open_error)?;
    let mut loader = slate_bootloader::probe(file, MemEfiVars::new()).map_err(|source| {
        UpgradeModeError::Loader {
            disk: disk.to_owned(),
            source,
        }
    })?;
    let outcome = loader
        .upgrade(&slate_bootloader::UpgradeRequest {
            uki: &uki,
            name: &report.name,
            version: &report.version,
            tries: request.tries,
            running_entry: &report.running_entry,
        })
        .map_err(|source| UpgradeModeError::Write {
            disk: disk.to_owned(),
            version: report.version.clone(),
            source,
        })?;
    report.outcome = Some(outcome);
    Ok(report)
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
    Ok(store
        .get(slate_meta::tags::VERSION_FLOOR)
        .map(|v| String::from_utf8_lossy(v).trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::tests::{blank_disk, bundle, request as install_request};

    fn request(bundle: PathBuf) -> UpgradeRequest {
        UpgradeRequest {
            bundle,
            trust: Trust::NotVerified,
            running_entry: None,
            variant: None,
            allow_downgrade: false,
            tries: 3,
            dry_run: false,
        }
    }

    fn hash(path: &Path) -> Vec<u8> {
        use sha2::Digest as _;
        sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
    }

    #[test]
    fn an_installed_disk_is_upgraded_and_a_downgrade_refused() {
        let dir = tempfile::tempdir().unwrap();
        let disk = blank_disk(dir.path());
        let v1 = bundle(dir.path(), "1.0.0", NATIVE_ARCH);
        crate::install(&disk, &install_request(v1), &mut |_| {}).unwrap();
        let v2 = bundle(dir.path(), "2.0.0", NATIVE_ARCH);

        let before = hash(&disk);
        let dry = UpgradeRequest {
            dry_run: true,
            ..request(v2.clone())
        };
        let mut opened = 0;
        let report = upgrade(&disk, &dry, &mut |UpgradeEvent::Opened(p)| {
            assert_eq!(p, &Provenance::NotVerified);
            opened += 1;
        })
        .unwrap();
        assert_eq!(opened, 1);
        assert_eq!(
            (
                report.running_entry.as_str(),
                report.running_version.as_str()
            ),
            ("slate-1.0.0+3.efi", "1.0.0")
        );
        assert_eq!(report.kind, UpdateKind::Upgrade);
        assert_eq!(report.outcome, None);
        assert_eq!(hash(&disk), before, "the dry run wrote");

        let report = upgrade(&disk, &request(v2), &mut |_| {}).unwrap();
        let outcome = report.outcome.unwrap();
        assert_eq!(outcome.file_name, "slate-2.0.0+3.efi");
        assert_eq!(outcome.fallback, "slate-1.0.0+3.efi");

        let older = bundle(dir.path(), "0.9.0", NATIVE_ARCH);
        let before = hash(&disk);
        let err = upgrade(&disk, &request(older), &mut |_| {}).unwrap_err();
        assert!(
            matches!(
                err,
                UpgradeModeError::Refused { ref source, .. }
                    if matches!(**source, PolicyError::Downgrade { .. })
            ),
            "{err}"
        );
        assert_eq!(hash(&disk), before, "a refusal wrote");
    }

    #[test]
    fn a_disk_without_slate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let disk = blank_disk(dir.path());
        let v2 = bundle(dir.path(), "2.0.0", NATIVE_ARCH);
        let err = upgrade(&disk, &request(v2), &mut |_| {}).unwrap_err();
        assert!(
            err.to_string().starts_with("reading the boot entries on"),
            "{err}"
        );
    }
}
