//! Install mode: a bundle's version laid onto a blank disk (or, forced, over whatever it holds):
//! the image mode over a plan made from the bundle and its install settings — systemd-boot and
//! the UKI, or, for a bundle carrying GRUB (`grub` blob: a `bootloader = "grub"` profile), the
//! GRUB layout with the UKI's kernel, initramfs and command line in slot A.

use std::path::{Path, PathBuf};

use slate_bootspec::{check_install_tries, MENU_TIMEOUT_SECS};
use slate_bundle::{BundleError, BundleManifest, InstallDefaults, NATIVE_ARCH};
use slate_disk::{Disk as _, DiskError, FileDisk};
use slate_esp::{loader_conf, uki_file_name, EspError};
use slate_layout::{LayoutError, LayoutParams, PlacedLayout, MIB};

use slate_bootloader::{LoaderKind, SlotPayload};

use crate::InstallError;
use crate::{open_trusted, write_grub_image, write_image, GrubImagePlan, ImagePlan, ImageStep};
use crate::{OpenBundleError, Provenance, Trust};

/// What to install, and how far to go.
#[derive(Debug, Clone)]
pub struct InstallRequest {
    /// An installer bundle (OCI image layout directory).
    pub bundle: PathBuf,
    pub trust: Trust,
    /// Wipe a disk that is not blank.
    pub force: bool,
    /// Check and plan everything, open the disk read-only, write nothing.
    pub dry_run: bool,
    /// A machine configuration (TOML) to put on STATE; without one the node boots into
    /// maintenance mode and waits for `slate apply-config`.
    pub config: Option<String>,
    /// The Secure Boot db the target machine's firmware trusts: systemd-boot and the UKI must
    /// be signed under it, or nothing is written. `None`: not checked (the disk is blank, so it
    /// says nothing about its firmware).
    pub secure_boot_db: Option<crate::TrustedCerts>,
}

/// What [`install`] will write (or, with `dry_run`, would have written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPlan {
    pub name: String,
    pub version: String,
    pub disk_len: u64,
    /// The loader laid down: systemd-boot, or GRUB when the bundle carries it.
    pub loader: LoaderKind,
    /// The UKI's file name in `EFI/Linux`, boot counter included; on GRUB the slot (`A`).
    pub uki_name: String,
    /// The UKI's size; on GRUB the slot's kernel and initramfs.
    pub uki_len: u64,
    /// The partitions as they will be on this disk.
    pub layout: PlacedLayout,
}

/// What [`install`] is doing, in order.
#[derive(Debug)]
pub enum InstallEvent<'a> {
    /// The bundle is open and, unless told not to, its signature verified.
    Opened(&'a Provenance),
    /// The disk holds data (its first non-zero byte at `offset`) and `force` lets it go.
    Wiping {
        offset: u64,
    },
    /// Every check passed; with `dry_run` nothing follows.
    Planned(&'a InstallPlan),
    Image(ImageStep),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    pub plan: InstallPlan,
    /// False for a dry run.
    pub written: bool,
}

/// Why an install was refused or failed. Every refusal comes before the first write.
#[derive(Debug, thiserror::Error)]
pub enum InstallModeError {
    /// The target's Secure Boot db would refuse the bundle's systemd-boot or UKI.
    #[error(transparent)]
    SecureBoot(#[from] crate::SecureBootError),
    /// A GRUB bundle with `--secureboot-db`: slate's GRUB layout boots an unsigned kernel, so
    /// no Secure Boot target could start it.
    #[error(
        "the bundle {name} {version} installs GRUB, which slate does not sign: it cannot be \
         installed for a Secure Boot target (--secureboot-db)"
    )]
    GrubSecureBoot { name: String, version: String },
    /// The bundle's UKI does not split into the kernel, initramfs and command line of a GRUB
    /// slot.
    #[error("the bundle's UKI, for GRUB's slot A")]
    GrubSlot(#[source] slate_bootloader::BootloaderError),
    #[error(transparent)]
    Bundle(#[from] OpenBundleError),
    #[error("the bundle is for {bundle}, this installer for {NATIVE_ARCH}")]
    WrongArch { bundle: String },
    #[error(
        "the bundle {name} {version} carries no install settings (it was built for upgrades only)"
    )]
    NoInstallSettings { name: String, version: String },
    /// A number in the bundle's install settings is out of range. slate's imager never writes
    /// one (the profile's bounds are the same), but a bundle is input like any other.
    #[error("the bundle's install settings: {field} = {value}: {reason}")]
    BadSetting {
        field: &'static str,
        value: u64,
        reason: String,
    },
    /// A blob is missing or does not match its digest (the message names it).
    #[error(transparent)]
    Blob(#[from] BundleError),
    #[error("reading /dev/urandom")]
    Random(#[source] std::io::Error),
    /// The bundle's name, version or settings make no valid boot file.
    #[error(transparent)]
    BootFile(#[from] EspError),
    #[error("opening {}", disk.display())]
    Open {
        disk: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("laying out {}", disk.display())]
    Layout {
        disk: PathBuf,
        #[source]
        source: LayoutError,
    },
    #[error("reading the disk to see whether it is blank")]
    Read(#[source] DiskError),
    #[error(
        "{} is not blank (data at byte {offset}); refusing to install over it — pass --force to \
         wipe it",
        disk.display()
    )]
    NotBlank { disk: PathBuf, offset: u64 },
    #[error(transparent)]
    State(#[from] crate::StateError),
    #[error("installing onto {}", disk.display())]
    Write {
        disk: PathBuf,
        #[source]
        source: InstallError,
    },
}

/// Install the bundle's version onto `disk` (block device or image file): partition table, ESP
/// with systemd-boot and the UKI — or GRUB, `grub.cfg`, `grubenv`, the second record and slot A
/// for a bundle that carries GRUB — META. The bundle, its settings and the disk's blankness are
/// all checked before the disk is opened for writing.
pub fn install(
    disk: &Path,
    request: &InstallRequest,
    progress: &mut dyn FnMut(InstallEvent<'_>),
) -> Result<InstallReport, InstallModeError> {
    let (bundle, provenance, _) = open_trusted(&request.bundle, &request.trust, None)?;
    progress(InstallEvent::Opened(&provenance));
    let manifest = bundle.manifest().clone();
    if manifest.arch != NATIVE_ARCH {
        return Err(InstallModeError::WrongArch {
            bundle: manifest.arch,
        });
    }
    let Some(defaults) = manifest.install else {
        return Err(InstallModeError::NoInstallSettings {
            name: manifest.name,
            version: manifest.version,
        });
    };
    let (esp_size, state_size) = checked_settings(&defaults)?;
    let uki = bundle.read_blob(slate_bundle::UKI_ROLE)?;
    let layout = LayoutParams {
        esp_size,
        state_size,
        ..LayoutParams::default()
    };
    let source_date_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let image = if manifest.blobs.contains_key(slate_bundle::GRUB_ROLE) {
        if request.secure_boot_db.is_some() {
            return Err(InstallModeError::GrubSecureBoot {
                name: manifest.name,
                version: manifest.version,
            });
        }
        let grub_efi = bundle.read_blob(slate_bundle::GRUB_ROLE)?;
        let slot = SlotPayload::from_uki(&uki).map_err(InstallModeError::GrubSlot)?;
        Image::Grub(GrubImagePlan {
            image_id: install_id(&manifest)?,
            layout,
            source_date_epoch,
            grub_efi,
            kernel: slot.kernel,
            initramfs: slot.initramfs,
            cmdline: slot.cmdline,
            version: manifest.version.clone(),
            menu_timeout: defaults.menu_timeout,
        })
    } else {
        let systemd_boot = bundle.read_blob(slate_bundle::SYSTEMD_BOOT_ROLE)?;
        if let Some(db) = &request.secure_boot_db {
            crate::check_signed("the bundle's systemd-boot", &systemd_boot, db)?;
            crate::check_signed(
                &format!("the UKI of {} {}", manifest.name, manifest.version),
                &uki,
                db,
            )?;
        }
        Image::SystemdBoot(ImagePlan {
            image_id: install_id(&manifest)?,
            layout,
            source_date_epoch,
            systemd_boot,
            uki_name: uki_file_name(&manifest.name, &manifest.version, Some(defaults.tries))?,
            uki,
            loader_conf: loader_conf(&format!("{}-*", manifest.name), defaults.menu_timeout)?,
            enroll: None,
        })
    };
    let mut file = if request.dry_run {
        FileDisk::open_read_only(disk)
    } else {
        FileDisk::open(disk)
    }
    .map_err(|source| InstallModeError::Open {
        disk: disk.to_owned(),
        source,
    })?;
    let layout =
        image
            .disk_layout()
            .place(file.len())
            .map_err(|source| InstallModeError::Layout {
                disk: disk.to_owned(),
                source,
            })?;
    if let Some(offset) = first_data(&file)? {
        if !request.force {
            return Err(InstallModeError::NotBlank {
                disk: disk.to_owned(),
                offset,
            });
        }
        progress(InstallEvent::Wiping { offset });
    }
    let (loader, uki_name, uki_len) = match &image {
        Image::SystemdBoot(p) => (
            LoaderKind::SystemdBoot,
            p.uki_name.clone(),
            p.uki.len() as u64,
        ),
        Image::Grub(p) => (
            LoaderKind::Grub,
            slate_esp::GRUB_SLOTS[0].to_owned(),
            (p.kernel.len() + p.initramfs.len()) as u64,
        ),
    };
    let plan = InstallPlan {
        name: manifest.name,
        version: manifest.version,
        disk_len: file.len(),
        loader,
        uki_name,
        uki_len,
        layout,
    };
    // The configuration is checked and STATE's filesystem made before the first write.
    let state = match &request.config {
        Some(text) => {
            let state_len = plan
                .layout
                .get(slate_layout::STATE_LABEL)
                .map_or(0, |p| p.len());
            Some(crate::StateFilesystem::build(
                text,
                state_len,
                image.image_id(),
                source_date_epoch,
            )?)
        }
        None => None,
    };
    progress(InstallEvent::Planned(&plan));
    if request.dry_run {
        return Ok(InstallReport {
            plan,
            written: false,
        });
    }
    let mut step = |step| progress(InstallEvent::Image(step));
    match &image {
        Image::SystemdBoot(plan) => write_image(&mut file, plan, &mut step),
        Image::Grub(plan) => write_grub_image(&mut file, plan, &mut step),
    }
    .map_err(|source| InstallModeError::Write {
        disk: disk.to_owned(),
        source,
    })?;
    if let Some(state) = state {
        progress(InstallEvent::Image(ImageStep::ClearPartition {
            label: format!(
                "{} (machine configuration of {})",
                slate_layout::STATE_LABEL,
                state.node_name
            ),
        }));
        let mut view = slate_layout::open_partition(&mut file, slate_layout::STATE_LABEL).map_err(
            |source| crate::StateError::NoState {
                disk: disk.to_owned(),
                source,
            },
        )?;
        state
            .write_to(&mut view)
            .map_err(crate::StateError::Write)?;
    }
    Ok(InstallReport {
        plan,
        written: true,
    })
}

/// What an install writes: the image mode's plan for the bundle's loader.
enum Image {
    SystemdBoot(ImagePlan),
    Grub(GrubImagePlan),
}

impl Image {
    fn disk_layout(&self) -> slate_layout::DiskLayout {
        match self {
            Image::SystemdBoot(p) => p.disk_layout(),
            Image::Grub(p) => p.disk_layout(),
        }
    }

    fn image_id(&self) -> &str {
        match self {
            Image::SystemdBoot(p) => &p.image_id,
            Image::Grub(p) => &p.image_id,
        }
    }
}

/// The install settings' numbers, each within its bounds, and the ESP and STATE sizes in bytes.
/// Checked before the disk is opened: a size in MiB that does not fit 64 bits once in bytes
/// would otherwise wrap around into a small partition, tries out of range would make an entry
/// systemd-boot never counts down, and a menu timeout out of range one that waits for a key.
fn checked_settings(defaults: &InstallDefaults) -> Result<(u64, u64), InstallModeError> {
    let bad = |field, value: u64, reason: String| InstallModeError::BadSetting {
        field,
        value,
        reason,
    };
    check_install_tries(defaults.tries)
        .map_err(|e| bad("tries", defaults.tries.into(), e.to_string()))?;
    if !MENU_TIMEOUT_SECS.contains(&defaults.menu_timeout) {
        return Err(bad(
            "menu_timeout",
            defaults.menu_timeout.into(),
            format!(
                "not {} to {} seconds (an unattended machine must boot on its own)",
                MENU_TIMEOUT_SECS.start(),
                MENU_TIMEOUT_SECS.end()
            ),
        ));
    }
    let bytes = |field, mib: u64| {
        mib.checked_mul(MIB).ok_or_else(|| {
            bad(
                field,
                mib,
                "MiB is more bytes than a 64-bit size holds".into(),
            )
        })
    };
    Ok((
        bytes("esp_mib", defaults.esp_mib)?,
        bytes("state_mib", defaults.state_mib)?,
    ))
}

/// Where the disk first holds a non-zero byte, looking at its head and tail (where partition
/// tables, filesystem superblocks and RAID/LVM labels live).
fn first_data(disk: &FileDisk) -> Result<Option<u64>, InstallModeError> {
    const WINDOW: u64 = 1 << 20;
    let len = disk.len();
    let mut buf = vec![0u8; WINDOW.min(len) as usize];
    for start in [0, len.saturating_sub(WINDOW)] {
        disk.read_at(start, &mut buf)
            .map_err(InstallModeError::Read)?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            return Ok(Some(start + i as u64));
        }
    }
    Ok(None)
}

/// A fresh identity for the disk's GUIDs: two machines installed from one bundle must not share
/// partition GUIDs (images are reproducible instead, see the imager).
fn install_id(manifest: &BundleManifest) -> Result<String, InstallModeError> {
    let mut seed = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .map_err(InstallModeError::Random)?;
    Ok(format!(
        "{}-{}-{}",
        manifest.name,
        manifest.version,
        hex::encode(seed)
    ))
}

#[cfg(test)]
#[path = "install_tests.rs"]
pub(crate) mod tests;
