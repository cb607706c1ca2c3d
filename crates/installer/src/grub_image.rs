//! The GRUB variant of the image mode: the same partitions as the systemd-boot image, with
//! GRUB, its `grub.cfg` and `grubenv`, and slot A on the ESP (the files themselves:
//! `slate_bootloader::grub::config`).

use slate_bootloader::grub::config as grub_config;
use slate_esp::fat::EspGeometry;
use slate_esp::GRUB_DIRECTORIES;
use slate_layout::{DiskLayout, LayoutParams, PlacedLayout, EFI_LABEL};

use crate::image::{partition, place_with_fat32_esp, refuse_empty, write_prepared, EspImage};
use crate::{ImageStep, InstallError};

/// Everything a GRUB image is made of: slot A holds the version, slot B is empty.
#[derive(Clone)]
pub struct GrubImagePlan {
    pub image_id: String,
    pub layout: LayoutParams,
    pub source_date_epoch: u64,
    /// The GRUB EFI image (`grub-mkstandalone -O x86_64-efi` with [`grub_config::GRUB_EMBEDDED_CFG`]).
    pub grub_efi: Vec<u8>,
    pub kernel: Vec<u8>,
    pub initramfs: Vec<u8>,
    pub cmdline: String,
    pub version: String,
    /// Menu timeout, seconds.
    pub menu_timeout: u32,
}

impl std::fmt::Debug for GrubImagePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrubImagePlan")
            .field("image_id", &self.image_id)
            .field("layout", &self.layout)
            .field("grub_efi", &format_args!("<{} bytes>", self.grub_efi.len()))
            .field("kernel", &format_args!("<{} bytes>", self.kernel.len()))
            .field(
                "initramfs",
                &format_args!("<{} bytes>", self.initramfs.len()),
            )
            .field("cmdline", &self.cmdline)
            .field("version", &self.version)
            .finish()
    }
}

impl GrubImagePlan {
    pub fn disk_layout(&self) -> DiskLayout {
        DiskLayout::reference(&self.image_id, &self.layout)
    }

    fn esp_files(&self) -> Result<Vec<(String, Vec<u8>)>, InstallError> {
        grub_config::image_files(
            &self.grub_efi,
            self.menu_timeout,
            &self.kernel,
            &self.initramfs,
            &self.version,
            &self.cmdline,
        )
        .map_err(|err| InstallError::InvalidPlan(err.to_string()))
    }
}

fn grub_preflight(
    disk_len: u64,
    plan: &GrubImagePlan,
    files: &[(String, Vec<u8>)],
) -> Result<(PlacedLayout, EspGeometry), InstallError> {
    refuse_empty(&[
        ("GRUB EFI image", &plan.grub_efi),
        ("kernel", &plan.kernel),
        ("initramfs", &plan.initramfs),
    ])?;
    let (placed, geometry) = place_with_fat32_esp(&plan.disk_layout(), disk_len)?;
    let esp = partition(&placed, EFI_LABEL)?;
    // Room for every file, and for a second slot of the same size (the first upgrade writes
    // one next to slot A), directories at two clusters each.
    let slot_clusters: u64 = files
        .iter()
        .filter(|(p, _)| p.starts_with("A/"))
        .map(|(_, b)| geometry.clusters_for(b.len() as u64))
        .sum();
    let all: u64 = files
        .iter()
        .map(|(_, b)| geometry.clusters_for(b.len() as u64))
        .sum::<u64>()
        + slot_clusters
        + 2 * GRUB_DIRECTORIES.len() as u64;
    if all > geometry.data_clusters {
        return Err(InstallError::UkiDoesNotFit {
            name: "two GRUB slots (kernel + initramfs)".into(),
            uki_len: slot_clusters * geometry.cluster_size,
            esp_len: esp.len(),
            available: geometry
                .data_clusters
                .saturating_sub(all - 2 * slot_clusters)
                * geometry.cluster_size
                / 2,
        });
    }
    Ok((placed, geometry))
}

/// Write a complete slate disk booted by GRUB: GPT, the FAT32 ESP with GRUB, `grub.cfg`,
/// `grubenv` (`saved_entry=A`) and slot A, an empty META, zeroed STATE and EPHEMERAL heads.
/// Every check first, as [`crate::write_image`].
pub fn write_grub_image(
    disk: &mut impl slate_disk::Disk,
    plan: &GrubImagePlan,
    progress: &mut dyn FnMut(ImageStep),
) -> Result<(), InstallError> {
    let owned = plan.esp_files()?;
    let (placed, geometry) = grub_preflight(disk.len(), plan, &owned)?;
    let files: Vec<(String, &[u8])> = owned
        .iter()
        .map(|(p, b)| (p.clone(), b.as_slice()))
        .collect();
    write_prepared(
        disk,
        &EspImage {
            image_id: &plan.image_id,
            layout: &plan.disk_layout(),
            placed: &placed,
            geometry: &geometry,
            source_date_epoch: plan.source_date_epoch,
            directories: &GRUB_DIRECTORIES,
            files: &files,
        },
        progress,
    )
}
