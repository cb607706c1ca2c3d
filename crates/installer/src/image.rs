//! Image mode: a complete, bootable slate disk written onto an empty one.

use slate_disk::{Disk, PartitionView, SectorBuffer};
use slate_layout::{
    derived_u32, verify_gpt, write_gpt, DiskLayout, LayoutParams, PlacedLayout, PlacedPartition,
    EFI_LABEL, META_LABEL, MIB,
};
use slate_meta::MetaStore;

use slate_bootloader::sdboot::EnrollKeys;
use slate_esp::fat::{self, EspGeometry, TEMP_NAME_EXTRA};
use slate_esp::{
    validate_uki_file_name, EspError, MAX_FILE_NAME, SECURE_BOOT_DIRECTORIES,
    SECURE_BOOT_ENROLL_LINE, SYSTEMD_BOOT_DIRECTORIES, UKI_DIR,
};

use crate::InstallError;

/// How much of each partition the image leaves for first boot to format is zeroed.
pub const CLEARED_HEAD: u64 = MIB;

/// Everything an image is made of. Same plan, same zero-filled disk → same bytes.
#[derive(Clone)]
pub struct ImagePlan {
    /// Seeds the disk and partition GUIDs and the FAT volume id.
    pub image_id: String,
    pub layout: LayoutParams,
    /// Every FAT timestamp (UTC, clamped to FAT's 1980-2107 range).
    pub source_date_epoch: u64,
    /// The systemd-boot EFI binary (`systemd-bootx64.efi`).
    pub systemd_boot: Vec<u8>,
    /// The unified kernel image, written to `EFI/Linux/<uki_name>`.
    pub uki: Vec<u8>,
    /// Its file name, boot counter included (see [`crate::uki_file_name`]).
    pub uki_name: String,
    /// The content of `loader/loader.conf` (see [`crate::loader_conf`]); with `enroll`, the
    /// writer adds `secure-boot-enroll force`.
    pub loader_conf: String,
    /// A Secure Boot image: the keys its first boot enrols (`loader/keys/auto/`). systemd-boot
    /// and the UKI must then be signed by a certificate in its `db.auth`, checked before the
    /// first write.
    pub enroll: Option<EnrollKeys>,
}

/// Binaries are shown by size: a UKI is tens of MiB.
impl std::fmt::Debug for ImagePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagePlan")
            .field("image_id", &self.image_id)
            .field("layout", &self.layout)
            .field("source_date_epoch", &self.source_date_epoch)
            .field(
                "systemd_boot",
                &format_args!("<{} bytes>", self.systemd_boot.len()),
            )
            .field("uki", &format_args!("<{} bytes>", self.uki.len()))
            .field("uki_name", &self.uki_name)
            .field("loader_conf", &self.loader_conf)
            .field("enroll", &self.enroll)
            .finish()
    }
}

impl ImagePlan {
    /// The disk layout the plan describes.
    pub fn disk_layout(&self) -> DiskLayout {
        DiskLayout::reference(&self.image_id, &self.layout)
    }

    /// The ESP's files in the order they are written: (path, content).
    fn esp_files<'a>(&'a self, loader_conf: &'a str) -> Vec<(String, &'a [u8])> {
        slate_bootloader::sdboot::image_files(
            &self.systemd_boot,
            &self.uki_name,
            &self.uki,
            self.enroll.as_ref(),
            loader_conf,
        )
    }

    /// `loader.conf` as written: a Secure Boot image's enrols its keys.
    fn loader_conf_text(&self) -> String {
        match self.enroll {
            Some(_) if !self.loader_conf.contains(SECURE_BOOT_ENROLL_LINE) => {
                format!("{}{SECURE_BOOT_ENROLL_LINE}", self.loader_conf)
            }
            _ => self.loader_conf.clone(),
        }
    }

    /// The ESP's directories, parents first.
    fn directories(&self) -> Vec<&'static str> {
        let mut dirs = SYSTEMD_BOOT_DIRECTORIES.to_vec();
        if self.enroll.is_some() {
            dirs.extend(SECURE_BOOT_DIRECTORIES);
        }
        dirs
    }

    /// A Secure Boot image's boot files must pass the firmware it enrols.
    fn check_secure_boot(&self) -> Result<(), InstallError> {
        let Some(keys) = &self.enroll else {
            return Ok(());
        };
        let trusted = crate::trusted_from_db_auth(&keys.db)?;
        crate::check_signed("systemd-boot", &self.systemd_boot, &trusted)?;
        crate::check_signed(&format!("the UKI {}", self.uki_name), &self.uki, &trusted)?;
        Ok(())
    }
}

/// What [`write_image`] is about to do, for progress reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageStep {
    /// Protective MBR, both GPT copies, read back and checked.
    PartitionTable,
    FormatEsp {
        volume_id: u32,
    },
    CreateDir {
        path: String,
    },
    WriteFile {
        path: String,
        len: u64,
    },
    FormatMeta,
    /// Zeroing the head of a partition first boot formats.
    ClearPartition {
        label: String,
    },
    Flush,
    Done,
}

/// Everything [`write_image`] checks before its first write.
#[derive(Debug)]
struct Preflight {
    placed: PlacedLayout,
    geometry: EspGeometry,
}

fn preflight(disk_len: u64, plan: &ImagePlan) -> Result<Preflight, InstallError> {
    validate_uki_file_name(&plan.uki_name)?;
    if plan.uki_name.len() + TEMP_NAME_EXTRA > MAX_FILE_NAME {
        return Err(EspError::InvalidFileName {
            name: plan.uki_name.clone(),
            reason: format!(
                "must be at most {} characters, to leave room for its temporary name",
                MAX_FILE_NAME - TEMP_NAME_EXTRA
            ),
        }
        .into());
    }
    refuse_empty(&[
        ("systemd-boot binary", &plan.systemd_boot),
        ("UKI", &plan.uki),
    ])?;
    plan.check_secure_boot()?;
    let (placed, geometry) = place_with_fat32_esp(&plan.disk_layout(), disk_len)?;
    let esp = partition(&placed, EFI_LABEL)?;
    // Each directory is counted at two clusters: its `.`/`..` and long-name entries may spill
    // out of one 512-byte cluster.
    let dir_clusters = 2 * plan.directories().len() as u64;
    let loader_conf = plan.loader_conf_text();
    let others: u64 = plan
        .esp_files(&loader_conf)
        .iter()
        .filter(|(path, _)| !path.starts_with(UKI_DIR))
        .map(|(_, bytes)| geometry.clusters_for(bytes.len() as u64))
        .sum();
    let left = geometry.data_clusters.saturating_sub(dir_clusters + others) * geometry.cluster_size;
    if plan.uki.len() as u64 > left {
        return Err(InstallError::UkiDoesNotFit {
            name: plan.uki_name.clone(),
            uki_len: plan.uki.len() as u64,
            esp_len: esp.len(),
            available: left,
        });
    }
    Ok(Preflight { placed, geometry })
}

pub(crate) fn refuse_empty(inputs: &[(&str, &Vec<u8>)]) -> Result<(), InstallError> {
    match inputs.iter().find(|(_, bytes)| bytes.is_empty()) {
        Some((what, _)) => Err(InstallError::InvalidPlan(format!("the {what} is empty"))),
        None => Ok(()),
    }
}

/// The layout placed on a disk of `disk_len` bytes, with the geometry its ESP is formatted
/// with; refused when the layout lacks an ESP or META, or the ESP is too small for FAT32.
pub(crate) fn place_with_fat32_esp(
    layout: &DiskLayout,
    disk_len: u64,
) -> Result<(PlacedLayout, EspGeometry), InstallError> {
    let placed = layout.place(disk_len)?;
    let esp = partition(&placed, EFI_LABEL)?;
    partition(&placed, META_LABEL)?;
    let geometry = EspGeometry::new(esp.len(), placed.sector_size);
    if !geometry.is_fat32() {
        return Err(InstallError::EspTooSmall {
            esp_len: esp.len(),
            cluster_size: geometry.cluster_size,
            clusters: geometry.data_clusters,
        });
    }
    Ok((placed, geometry))
}

pub(crate) fn partition<'a>(
    placed: &'a PlacedLayout,
    label: &str,
) -> Result<&'a PlacedPartition, InstallError> {
    placed
        .get(label)
        .ok_or_else(|| InstallError::InvalidPlan(format!("the layout has no {label} partition")))
}

fn view<D: Disk>(disk: D, p: &PlacedPartition) -> Result<PartitionView<D>, InstallError> {
    PartitionView::new(disk, p.start(), p.len()).map_err(|source| InstallError::Disk {
        label: p.label.clone(),
        action: "opening a view of the partition",
        source,
    })
}

/// Write a complete slate disk image onto `disk`: partition table, FAT32 ESP with systemd-boot,
/// the UKI and `loader.conf`, an empty META, and zeroed heads of STATE and EPHEMERAL (formatted
/// on first boot). Flushes at the end.
///
/// Everything that can be known in advance is checked before the first write — the layout fits
/// the disk, the ESP can be FAT32, the UKI fits the ESP, its name follows the Boot Loader
/// Specification — so a refused plan leaves the disk untouched.
///
/// Bytes the image does not define (free FAT clusters, partition bodies beyond their cleared
/// heads) are left as they were: on a zero-filled disk the result is bit-identical for the same
/// plan.
pub fn write_image(
    disk: &mut impl Disk,
    plan: &ImagePlan,
    progress: &mut dyn FnMut(ImageStep),
) -> Result<(), InstallError> {
    let Preflight { placed, geometry } = preflight(disk.len(), plan)?;
    let loader_conf = plan.loader_conf_text();
    let files = plan.esp_files(&loader_conf);
    let directories = plan.directories();
    write_prepared(
        disk,
        &EspImage {
            image_id: &plan.image_id,
            layout: &plan.disk_layout(),
            placed: &placed,
            geometry: &geometry,
            source_date_epoch: plan.source_date_epoch,
            directories: &directories,
            files: &files,
        },
        progress,
    )
}

/// What [`write_prepared`] lays down: checked by the caller's preflight.
pub(crate) struct EspImage<'a> {
    pub image_id: &'a str,
    pub layout: &'a DiskLayout,
    pub placed: &'a PlacedLayout,
    pub geometry: &'a EspGeometry,
    pub source_date_epoch: u64,
    /// Created in order, each with its parents.
    pub directories: &'a [&'a str],
    /// Written in order, each under a temp name and renamed: (path, content).
    pub files: &'a [(String, &'a [u8])],
}

/// The writes of the image mode, shared by the systemd-boot and GRUB variants: GPT, FAT32 ESP
/// with `directories` and `files`, META formatted, STATE and EPHEMERAL heads zeroed, flush.
pub(crate) fn write_prepared(
    disk: &mut impl Disk,
    image: &EspImage<'_>,
    progress: &mut dyn FnMut(ImageStep),
) -> Result<(), InstallError> {
    let placed = image.placed;
    let layout = image.layout;

    progress(ImageStep::PartitionTable);
    write_gpt(&mut *disk, layout)?;
    verify_gpt(&mut *disk, layout)?;

    let esp = partition(placed, EFI_LABEL)?;
    let volume_id = derived_u32(image.image_id, "esp-volume-id");
    progress(ImageStep::FormatEsp { volume_id });
    fat::format(view(&mut *disk, esp)?, image.geometry, volume_id, EFI_LABEL)?;
    {
        let mut esp_view = view(&mut *disk, esp)?;
        for dir in image.directories {
            progress(ImageStep::CreateDir {
                path: dir.to_string(),
            });
            fat::create_dirs(&mut esp_view, image.source_date_epoch, &[dir])?;
        }
        // Whole sectors at each flush: fatfs updates a directory entry field by field, and a
        // cut between two of those writes must not show a new name over old content.
        let mut sectors = SectorBuffer::new(esp_view);
        let fs = fat::mount(&mut sectors, image.source_date_epoch)?;
        for (path, bytes) in image.files {
            progress(ImageStep::WriteFile {
                path: path.clone(),
                len: bytes.len() as u64,
            });
            fat::write_file_atomically(&fs, path, bytes)?;
        }
        fat::unmount(fs)?;
        sectors.flush().map_err(|source| InstallError::Disk {
            label: EFI_LABEL.into(),
            action: "flushing",
            source,
        })?;
    }

    progress(ImageStep::FormatMeta);
    let meta = partition(placed, META_LABEL)?;
    MetaStore::format(view(&mut *disk, meta)?).map_err(InstallError::Meta)?;

    // A filesystem left on the disk by its previous life must never be taken for ours, so first
    // boot sees these partitions blank and formats them. The first MiB holds the primary
    // superblock of every filesystem slate might find (ext4, XFS, Btrfs, LUKS, swap).
    for p in placed
        .partitions
        .iter()
        .filter(|p| p.label != EFI_LABEL && p.label != META_LABEL)
    {
        progress(ImageStep::ClearPartition {
            label: p.label.clone(),
        });
        let zeros = vec![0u8; p.len().min(CLEARED_HEAD) as usize];
        view(&mut *disk, p)?
            .write_at(0, &zeros)
            .map_err(|source| InstallError::Disk {
                label: p.label.clone(),
                action: "zeroing the head of the partition",
                source,
            })?;
    }

    progress(ImageStep::Flush);
    disk.flush().map_err(|source| InstallError::Disk {
        label: "(whole disk)".into(),
        action: "flushing",
        source,
    })?;
    progress(ImageStep::Done);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn plan(uki_len: usize) -> ImagePlan {
        ImagePlan {
            image_id: "unit".into(),
            layout: LayoutParams {
                esp_size: 40 * MIB,
                state_size: 4 * MIB,
                ephemeral_min_size: 4 * MIB,
                ..LayoutParams::default()
            },
            source_date_epoch: 1_700_000_000,
            systemd_boot: vec![0x4d; 1000],
            uki: vec![0x5a; uki_len],
            uki_name: "slate-1+3.efi".into(),
            loader_conf: slate_esp::loader_conf("slate-*", 3).unwrap(),
            enroll: None,
        }
    }

    #[test]
    fn preflight_accepts_what_fits_and_refuses_what_does_not() {
        let len = 64 * MIB;
        let ok = preflight(len, &plan(1 << 20)).unwrap();
        assert_eq!(ok.geometry.cluster_size, 512);
        let left = ok.geometry.data_clusters * 512;
        let err = preflight(len, &plan(left as usize)).unwrap_err();
        assert!(matches!(err, InstallError::UkiDoesNotFit { .. }), "{err}");

        let mut small_esp = plan(1);
        small_esp.layout.esp_size = 32 * MIB;
        let err = preflight(len, &small_esp).unwrap_err();
        assert!(matches!(err, InstallError::EspTooSmall { .. }), "{err}");

        let mut bad_name = plan(1);
        bad_name.uki_name = "slate 1.efi".into();
        assert!(preflight(len, &bad_name).is_err());
        bad_name.uki_name = format!("{}.efi", "a".repeat(247));
        assert!(preflight(len, &bad_name)
            .unwrap_err()
            .to_string()
            .contains("temporary"));

        let mut empty = plan(0);
        empty.uki.clear();
        assert!(matches!(
            preflight(len, &empty),
            Err(InstallError::InvalidPlan(_))
        ));
    }
}
