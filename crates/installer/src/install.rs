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
    let (bundle, provenance) = open_trusted(&request.bundle, &request.trust)?;
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
pub(crate) mod tests {
    use super::*;
    use slate_bundle::{BlobInput, BundleSpec, InstallDefaults, DEFAULT_KEEP_VERSIONS};

    pub(crate) const DISK_LEN: u64 = 128 << 20;

    /// A bundle of `version` for `arch` in `dir` (stand-in UKI and systemd-boot bytes: nothing
    /// here executes them).
    pub(crate) fn bundle(dir: &Path, version: &str, arch: &str) -> PathBuf {
        let uki = format!("MZ pretend UKI of {version}").repeat(1000);
        let out = dir.join(format!("bundle-{version}-{arch}"));
        write_bundle(&out, version, arch, uki.as_bytes(), DEFAULT_KEEP_VERSIONS)
    }

    /// A native bundle of `version` with a stand-in UKI of `uki_len` bytes whose install
    /// settings keep `keep_versions` versions.
    pub(crate) fn sized_bundle(
        dir: &Path,
        version: &str,
        uki_len: usize,
        keep_versions: u32,
    ) -> PathBuf {
        let uki: Vec<u8> = format!("MZ pretend UKI of {version} ")
            .bytes()
            .cycle()
            .take(uki_len)
            .collect();
        let out = dir.join(format!("bundle-{version}-{uki_len}-keep{keep_versions}"));
        write_bundle(&out, version, NATIVE_ARCH, &uki, keep_versions)
    }

    pub(crate) fn write_bundle(
        out: &Path,
        version: &str,
        arch: &str,
        uki: &[u8],
        keep_versions: u32,
    ) -> PathBuf {
        let defaults = InstallDefaults {
            esp_mib: 40,
            state_mib: 16,
            tries: 3,
            menu_timeout: 1,
            keep_versions,
        };
        write_bundle_with(out, version, arch, uki, defaults)
    }

    fn write_bundle_with(
        out: &Path,
        version: &str,
        arch: &str,
        uki: &[u8],
        defaults: InstallDefaults,
    ) -> PathBuf {
        let blob = |role, file_name, media_type, bytes| BlobInput {
            role,
            file_name,
            media_type,
            bytes,
        };
        slate_bundle::write_installable_bundle(
            out,
            BundleSpec {
                name: "slate",
                version,
                arch,
                variant: "demo",
            },
            defaults,
            &[
                blob(
                    slate_bundle::UKI_ROLE,
                    "slate.efi",
                    slate_bundle::UKI_MEDIA_TYPE,
                    uki,
                ),
                blob(
                    slate_bundle::SYSTEMD_BOOT_ROLE,
                    "systemd-bootx64.efi",
                    slate_bundle::EFI_MEDIA_TYPE,
                    b"MZ pretend systemd-boot",
                ),
            ],
        )
        .unwrap();
        out.to_owned()
    }

    pub(crate) fn blank_disk(dir: &Path) -> PathBuf {
        let disk = dir.join("disk.raw");
        std::fs::File::create(&disk)
            .unwrap()
            .set_len(DISK_LEN)
            .unwrap();
        disk
    }

    pub(crate) fn request(bundle: PathBuf) -> InstallRequest {
        InstallRequest {
            bundle,
            trust: Trust::NotVerified,
            force: false,
            dry_run: false,
            config: None,
            secure_boot_db: None,
        }
    }

    /// Event names in order, image steps left out.
    fn run(disk: &Path, request: &InstallRequest) -> (Vec<String>, InstallReport) {
        let mut seen = Vec::new();
        let report = install(disk, request, &mut |event| match event {
            InstallEvent::Opened(p) => seen.push(format!("opened {p:?}")),
            InstallEvent::Wiping { offset } => seen.push(format!("wiping {offset}")),
            InstallEvent::Planned(plan) => seen.push(format!("planned {}", plan.uki_name)),
            InstallEvent::Image(_) => {}
        })
        .unwrap();
        (seen, report)
    }

    #[test]
    fn a_dry_run_plans_and_writes_nothing_then_the_install_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (disk, v1) = (
            blank_disk(dir.path()),
            bundle(dir.path(), "1.0.0", NATIVE_ARCH),
        );
        let dry = InstallRequest {
            dry_run: true,
            ..request(v1.clone())
        };
        let (seen, report) = run(&disk, &dry);
        assert_eq!(
            seen,
            ["opened NotVerified", "planned slate-1.0.0+3.efi"],
            "{seen:?}"
        );
        assert!(!report.written);
        assert_eq!(report.plan.disk_len, DISK_LEN);
        let labels: Vec<_> = report
            .plan
            .layout
            .partitions
            .iter()
            .map(|p| &p.label)
            .collect();
        assert_eq!(labels, ["EFI", "META", "STATE", "EPHEMERAL"]);
        let file = FileDisk::open_read_only(&disk).unwrap();
        assert_eq!(first_data(&file).unwrap(), None, "the dry run wrote");

        let (_, report) = run(&disk, &request(v1.clone()));
        assert!(report.written);
        assert!(first_data(&FileDisk::open_read_only(&disk).unwrap())
            .unwrap()
            .is_some());

        let err = install(&disk, &request(v1.clone()), &mut |_| {}).unwrap_err();
        assert!(matches!(err, InstallModeError::NotBlank { .. }), "{err}");
        assert!(err.to_string().contains("is not blank"), "{err}");
        let forced = InstallRequest {
            force: true,
            ..request(v1)
        };
        let (seen, _) = run(&disk, &forced);
        assert!(seen.iter().any(|e| e.starts_with("wiping ")), "{seen:?}");
    }

    /// issue 18: numbers a bundle carries are bounded like the profile's, and refused before
    /// the disk is opened (a missing disk shows it never was).
    #[test]
    fn out_of_range_install_settings_are_refused_before_the_disk_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-disk");
        let good = InstallDefaults {
            esp_mib: 40,
            state_mib: 16,
            tries: 3,
            menu_timeout: 1,
            keep_versions: DEFAULT_KEEP_VERSIONS,
        };
        /// One setting changed to a value out of range.
        type Change = fn(&mut InstallDefaults);
        let cases: [(Change, &str); 5] = [
            (|d| d.tries = 3_000_000_000, "tries = 3000000000"),
            (|d| d.tries = 0, "tries = 0"),
            (|d| d.menu_timeout = u32::MAX, "menu_timeout = 4294967295"),
            // 2^44 + 256 MiB: shifted into bytes it wrapped around to 256 MiB.
            (|d| d.esp_mib = (1 << 44) + 256, "esp_mib = 17592186044672"),
            (
                |d| d.state_mib = u64::MAX,
                "state_mib = 18446744073709551615",
            ),
        ];
        for (i, (change, expected)) in cases.into_iter().enumerate() {
            let mut defaults = good;
            change(&mut defaults);
            let out = dir.path().join(format!("bundle-{i}"));
            let bundle = write_bundle_with(&out, "1.0.0", NATIVE_ARCH, b"MZ pretend UKI", defaults);
            let err = install(&missing, &request(bundle), &mut |_| {}).unwrap_err();
            assert!(matches!(err, InstallModeError::BadSetting { .. }), "{err}");
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("the bundle's install settings: {expected}:")),
                "{text}"
            );
        }
        assert_eq!(checked_settings(&good).unwrap(), (40 * MIB, 16 * MIB));
    }

    /// issue 18: a bundle of a GRUB profile (it carries `grub` where others carry systemd-boot)
    /// installs the GRUB layout onto a blank disk — GRUB, grub.cfg, grubenv and the second
    /// record naming slot A, the UKI's kernel, initramfs and command line in slot A, slot B
    /// empty — as the image mode does; never systemd-boot.
    #[test]
    fn a_grub_bundle_installs_the_grub_layout() {
        const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
        if !slate_testkit::require_path(STUB, "apt-get install systemd-boot-efi") {
            return;
        }
        use slate_bootloader::grub::config as grub_config;
        let dir = tempfile::tempdir().unwrap();
        let stub = std::fs::read(STUB).unwrap();
        let (kernel, initramfs) = (b"kernel ".repeat(3000), b"initramfs ".repeat(2000));
        let uki = slate_uki::UkiBuilder::new(&stub)
            .osrel("ID=slate\nVERSION_ID=1.0.0\n")
            .cmdline("console=ttyS0 slate.init=/usr/bin/machined")
            .linux(kernel.clone())
            .initrd(initramfs.clone())
            .build()
            .unwrap();
        let grub_efi = b"MZ pretend GRUB".repeat(100);
        let blob = |role, file_name, media_type, bytes| BlobInput {
            role,
            file_name,
            media_type,
            bytes,
        };
        let bundle = dir.path().join("grub-bundle");
        slate_bundle::write_installable_bundle(
            &bundle,
            BundleSpec {
                name: "slate",
                version: "1.0.0",
                arch: NATIVE_ARCH,
                variant: "demo",
            },
            InstallDefaults {
                esp_mib: 40,
                state_mib: 16,
                tries: 3,
                menu_timeout: 2,
                keep_versions: DEFAULT_KEEP_VERSIONS,
            },
            &[
                blob(
                    slate_bundle::UKI_ROLE,
                    "slate.efi",
                    slate_bundle::UKI_MEDIA_TYPE,
                    &uki,
                ),
                blob(
                    slate_bundle::GRUB_ROLE,
                    "grubx64.efi",
                    slate_bundle::EFI_MEDIA_TYPE,
                    &grub_efi,
                ),
            ],
        )
        .unwrap();
        let disk = blank_disk(dir.path());
        let (seen, report) = run(&disk, &request(bundle));
        assert_eq!(seen, ["opened NotVerified", "planned A"], "{seen:?}");
        assert_eq!(report.plan.loader, LoaderKind::Grub);
        assert_eq!(report.plan.uki_len, (kernel.len() + initramfs.len()) as u64);

        let file = FileDisk::open_read_only(&disk).unwrap();
        assert_eq!(slate_bootloader::detect(&file).unwrap(), LoaderKind::Grub);
        let grub = slate_bootloader::Grub::new(file);
        let status = grub.grub_status().unwrap();
        assert!(status.slots[0].complete() && !status.slots[1].complete());
        assert_eq!(status.slots[0].version(), Some("1.0.0"));
        assert_eq!(status.env.get("saved_entry"), Some("A"));
        assert_eq!(status.record_entry(), Some("A"));
        assert_eq!(status.booted_slot(), Some("A"));
        assert!(status.warnings.is_empty(), "{:?}", status.warnings);
        let (slot, version) = grub.read_slot("A").unwrap();
        assert_eq!(
            (
                slot.kernel,
                slot.initramfs,
                slot.cmdline.as_str(),
                version.as_str()
            ),
            (
                kernel,
                initramfs,
                "console=ttyS0 slate.init=/usr/bin/machined",
                "1.0.0"
            )
        );
        assert_eq!(
            grub.read_file(slate_esp::GRUB_CFG_PATH).unwrap(),
            grub_config::grub_cfg(2).into_bytes()
        );
        assert_eq!(
            grub.read_file(slate_esp::FALLBACK_LOADER_PATH).unwrap(),
            grub_efi
        );
        assert!(grub.read_file(slate_esp::LOADER_CONF_PATH).is_err());
    }

    #[test]
    fn a_foreign_bundle_is_refused_before_the_disk_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let foreign = if NATIVE_ARCH == "arm64" {
            "amd64"
        } else {
            "arm64"
        };
        let bundle = bundle(dir.path(), "1.0.0", foreign);
        let missing = dir.path().join("no-such-disk");
        let err = install(&missing, &request(bundle), &mut |_| {}).unwrap_err();
        assert!(matches!(err, InstallModeError::WrongArch { .. }), "{err}");
        assert!(err.to_string().contains(foreign), "{err}");
    }

    #[test]
    fn a_signed_bundle_is_reported_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let (disk, v1) = (
            blank_disk(dir.path()),
            bundle(dir.path(), "1.0.0", NATIVE_ARCH),
        );
        let pair = slate_trust::generate_keypair();
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        std::fs::write(keys.join("slate.pub"), &pair.public_pem).unwrap();
        let key = slate_trust::PrivateKey::from_pem(&pair.private_pem).unwrap();
        let request = InstallRequest {
            trust: Trust::KeysIn(keys),
            dry_run: true,
            ..request(v1.clone())
        };
        let err = install(&disk, &request, &mut |_| {}).unwrap_err();
        assert!(err.to_string().starts_with("verifying the bundle"), "{err}");

        slate_trust::sign(&slate_bundle::Bundle::open(&v1, None).unwrap(), &key).unwrap();
        let mut provenance = None;
        install(&disk, &request, &mut |event| {
            if let InstallEvent::Opened(p) = event {
                provenance = Some(p.clone());
            }
        })
        .unwrap();
        match provenance {
            Some(Provenance::Signed {
                key_id, version, ..
            }) => {
                assert_eq!(key_id, pair.id);
                assert_eq!(version, "1.0.0");
            }
            other => panic!("{other:?}"),
        }
    }
}
