//! `--output btrfs-image` (docs/formats.md §12.8): the snapshot engine's disk. A GPT with the
//! ESP (systemd-boot, `loader.conf` `default root-*`, the first snapshot's kernel copies and
//! its blessed Type #1 entry; or, for `bootloader = "grub"`, GRUB at the removable path with
//! the constant `grub.cfg`, the generated menu and grubenv `saved_entry=<first snapshot>`,
//! §12.9) and one Btrfs pool (`SLATE-POOL`) holding the first snapshot
//! `root-<SOURCE_DATE_EPOCH>` — the profile's root tree with its kernel and initramfs under
//! `/boot` and an fstab mounting itself — plus `@home`, `@state` and the engine's `.slate/`.
//!
//! The pool is made by `mkfs.btrfs` in a temporary file the size of its partition,
//! loop-mounted (so building one needs root), filled, unmounted, and then copied into the
//! partition through the `Disk` trait like every other byte of the image. Its UUID derives
//! from the image id, so the entry and fstab are reproducible; Btrfs's own metadata is not
//! (mkfs.btrfs stamps generations and times of its own).

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_bootloader::grub::snapshots as grub;
use slate_bootloader::grub::snapshots::menu::{MenuEntry, MENU_PATH};
use slate_bootloader::sdboot::snapshots as sdboot;
use slate_disk::{Disk, DiskError, FileDisk, PartitionView, SectorBuffer};
use slate_esp::fat::{self, EspGeometry};
use slate_esp::GRUB_DIRECTORIES;
use slate_esp::{
    loader_conf, FALLBACK_LOADER_PATH, LOADER_CONF_PATH, SYSTEMD_BOOT_DIRECTORIES,
    SYSTEMD_BOOT_PATH,
};
use slate_installer::{MountedPool, HOME_SUBVOLUME, STATE_SUBVOLUME};
use slate_layout::{
    derived_u32, partition_guid, verify_gpt, write_gpt, DiskLayout, LayoutError, PartitionSize,
    PartitionSpec, PlacedPartition, EFI_LABEL, ESP_TYPE, LINUX_ROOT_X86_64_TYPE, MIB, POOL_LABEL,
};
use slate_profile::{Bootloader, Profile};
use slate_snapshot::entry::{self, carried_options, entry_text, EntrySpec, LOADER_DEFAULT};
use slate_snapshot::{fstab, validate, SnapshotName};
use slate_snapshot_engine::tree;

use crate::artifacts::{assemble_root, build_boot_initramfs, in_bytes};
use crate::root_tree::write_generated;
use crate::{ImagerError, Inputs, Progress};

/// The smallest pool slate lays out, in MiB: mkfs.btrfs 6.2 refuses devices under 109 MiB
/// (114294784 bytes, with DUP metadata), and the first upgrade needs room beside the root.
pub const POOL_MIN_MIB: u64 = 128;
/// The pool's file system label.
pub const POOL_FS_LABEL: &str = "slate";
/// The GPT's own overhead (both tables, 1 MiB alignment), in MiB.
const GPT_MIB: u64 = 2;

/// Why a btrfs-image could not be built. Each variant names the step or the path.
#[derive(Debug, thiserror::Error)]
pub enum BtrfsImageError {
    #[error("making the pool with mkfs.btrfs (Debian package btrfs-progs): {0}")]
    Mkfs(String),
    #[error(transparent)]
    Pool(#[from] slate_installer::PoolError),
    #[error(transparent)]
    Host(#[from] slate_host::HostError),
    #[error("writing the snapshot engine's directory")]
    Engine(#[from] slate_snapshot_engine::EngineError),
    #[error(transparent)]
    Snapshot(#[from] slate_snapshot::SnapshotError),
    #[error(transparent)]
    Boot(#[from] slate_bootloader::BootloaderError),
    #[error("the partition table")]
    Layout(#[from] LayoutError),
    #[error("the first snapshot {snapshot} does not validate: {}", problems.join("; "))]
    Validation {
        snapshot: String,
        problems: Vec<String>,
    },
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("partition {label}: {action}")]
    Disk {
        label: &'static str,
        action: &'static str,
        #[source]
        source: DiskError,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BtrfsImageError {
    let path = path.to_owned();
    move |source| BtrfsImageError::Io {
        action,
        path,
        source,
    }
}

fn disk_err(
    label: &'static str,
    action: &'static str,
) -> impl FnOnce(DiskError) -> BtrfsImageError {
    move |source| BtrfsImageError::Disk {
        label,
        action,
        source,
    }
}

fn refuse(what: &'static str, reason: impl Into<String>) -> ImagerError {
    ImagerError::BadInput {
        what,
        reason: reason.into(),
    }
}

/// What a btrfs-image cannot be made of, refused when the inputs are resolved: before anything
/// is built or any output file exists. `[image] state_mib` and `keep_versions` do not apply
/// (the configuration lives in `@state`; the engine keeps three snapshots).
pub(crate) fn check_profile(p: &Profile) -> Result<(), ImagerError> {
    if p.bootloader == Bootloader::Grub && p.boot.grub_efi.is_none() {
        return Err(refuse(
            "boot.grub_efi",
            "bootloader = \"grub\" needs the GRUB EFI image (grub-mkstandalone) to put on the ESP",
        ));
    }
    if p.bootloader == Bootloader::Grub {
        // The kernel arguments go into GRUB's script unquoted: what it would interpret is
        // refused now, not after the pool is built.
        let spec = EntrySpec {
            snapshot: SnapshotName::at(0),
            pool_uuid: pool_uuid("check"),
            os_name: "Linux".into(),
            extra_options: carried_options(&p.cmdline()),
        };
        MenuEntry::new(&spec, "boot/vmlinuz", "boot/initrd.img")
            .map_err(|e| refuse("kernel.args", format!("a GRUB btrfs-image: {e}")))?;
    }
    if p.secureboot.is_some() {
        return Err(refuse(
            "secureboot",
            "btrfs-image does not support Secure Boot yet: its snapshots boot a plain kernel \
             and initramfs copied to the ESP, not signed UKIs",
        ));
    }
    if !p.rootfs.extensions.is_empty() {
        return Err(refuse(
            "rootfs.extensions",
            "system extensions are overlaid on a squashfs root; a btrfs-image root is a \
             mutable snapshot: put their files into the base root instead",
        ));
    }
    let needed = p.image.esp_mib + POOL_MIN_MIB + GPT_MIB;
    if p.image.size_mib < needed {
        return Err(refuse(
            "image.size_mib",
            format!(
                "{} MiB is too small for a btrfs-image: the ESP ({} MiB), a Btrfs pool of at \
                 least {POOL_MIN_MIB} MiB and the partition tables need {needed} MiB",
                p.image.size_mib, p.image.esp_mib
            ),
        ));
    }
    Ok(())
}

/// The pool's file system UUID: SHA-256 of `slate:<image id>:SLATE-POOL-filesystem`, stamped
/// as a version-4 UUID (`slate_layout::partition_guid`). The same image, the same UUID, so
/// the entry's `root=UUID=` and the fstab are reproducible.
pub fn pool_uuid(image_id: &str) -> String {
    partition_guid(image_id, &format!("{POOL_LABEL}-filesystem")).to_string()
}

/// The first snapshot's name: `root-<SOURCE_DATE_EPOCH as UTC>`.
pub fn first_snapshot(inputs: &Inputs) -> SnapshotName {
    SnapshotName::at(inputs.source_date_epoch)
}

/// `/etc/fstab` of the first snapshot: the root and `/home`, both by the pool's UUID.
pub fn fstab_text(uuid: &str, snapshot: &SnapshotName) -> String {
    format!(
        "UUID={uuid}\t/\tbtrfs\tsubvol={snapshot}\t0\t0\n\
         UUID={uuid}\t/home\tbtrfs\tsubvol={HOME_SUBVOLUME}\t0\t0\n"
    )
}

fn disk_layout(inputs: &Inputs) -> Result<DiskLayout, ImagerError> {
    Ok(DiskLayout {
        image_id: inputs.image_id(),
        partitions: vec![
            PartitionSpec {
                label: EFI_LABEL.into(),
                type_guid: ESP_TYPE,
                size: PartitionSize::Bytes(in_bytes(inputs.profile.image.esp_bytes())?),
                attributes: 0,
            },
            PartitionSpec {
                label: POOL_LABEL.into(),
                type_guid: LINUX_ROOT_X86_64_TYPE,
                size: PartitionSize::RestOfDisk {
                    min: POOL_MIN_MIB * MIB,
                },
                attributes: 0,
            },
        ],
        alignment: MIB,
        sector_size: 512,
    })
}

fn entry_options(inputs: &Inputs) -> Vec<String> {
    carried_options(&inputs.profile.cmdline())
}

/// The first snapshot's GRUB menu entry: its own /boot files in the pool.
fn grub_entry(
    inputs: &Inputs,
    snap: &SnapshotName,
    uuid: &str,
    os_name: &str,
) -> Result<MenuEntry, ImagerError> {
    let rel = &inputs.kernel_release;
    let spec = EntrySpec {
        snapshot: snap.clone(),
        pool_uuid: uuid.to_owned(),
        os_name: os_name.to_owned(),
        extra_options: entry_options(inputs),
    };
    MenuEntry::new(
        &spec,
        &format!("boot/vmlinuz-{rel}"),
        &format!("boot/initrd.img-{rel}"),
    )
    .map_err(|e| refuse("kernel.args", e.to_string()))
}

fn is_grub(inputs: &Inputs) -> bool {
    inputs.profile.bootloader == Bootloader::Grub
}

/// The steps of a build, for `--dry-run`.
pub(crate) fn plan(inputs: &Inputs) -> Vec<String> {
    let p = &inputs.profile;
    let snap = first_snapshot(inputs);
    let uuid = pool_uuid(&inputs.image_id());
    let esp_step = if is_grub(inputs) {
        format!(
            "{} MiB GPT disk: EFI {} MiB (GRUB {} at {FALLBACK_LOADER_PATH}, the constant \
             grub/grub.cfg with timeout {}, {MENU_PATH} with the entry --id {snap}: \
             /{snap}/boot/vmlinuz-{rel} {}, grubenv and the second record saved_entry={snap}), \
             {POOL_LABEL} rest (Linux root x86-64)",
            p.image.size_mib,
            p.image.esp_mib,
            inputs
                .grub_efi
                .as_deref()
                .unwrap_or(Path::new(""))
                .display(),
            p.image.menu_timeout,
            entry::root_options(&uuid, &snap),
            rel = inputs.kernel_release,
        )
    } else {
        format!(
            "{} MiB GPT disk: EFI {} MiB (systemd-boot {}, loader.conf default {LOADER_DEFAULT} \
             timeout {}, {} and {}, loader/entries/{snap}.conf: {}), {POOL_LABEL} rest \
             (Linux root x86-64)",
            p.image.size_mib,
            p.image.esp_mib,
            inputs.systemd_boot.display(),
            p.image.menu_timeout,
            entry::kernel_path(&snap),
            entry::initrd_path(&snap),
            entry_options(inputs).join(" "),
        )
    };
    vec![
        format!(
            "initramfs: /init = {}, {} modules for {} ({}), no root image (init mounts root=)",
            inputs.slate.display(),
            inputs.module_paths.len(),
            inputs.kernel_release,
            inputs.module_paths.join(" "),
        ),
        format!(
            "Btrfs pool (mkfs.btrfs -U {uuid} -L {POOL_FS_LABEL}, loop-mounted: needs root): \
             subvolume {snap} = {} with /etc/os-release for {} {}, /boot/vmlinuz-{rel} and \
             /boot/initrd.img-{rel}, /etc/fstab (/ subvol={snap}, /home subvol={HOME_SUBVOLUME}); \
             subvolumes {HOME_SUBVOLUME} and {STATE_SUBVOLUME}; .slate/ with the manifest key and \
             {snap}'s manifest",
            inputs.base_rootfs.display(),
            p.name,
            p.version,
            rel = inputs.kernel_release,
        ),
        esp_step,
    ]
}

/// Build the image into `dest` (the pending output). The caller checked root.
pub(crate) fn build(
    inputs: &Inputs,
    dest: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ImagerError> {
    let p = &inputs.profile;
    let snap = first_snapshot(inputs);
    let uuid = pool_uuid(&inputs.image_id());
    let layout = disk_layout(inputs)?;
    let disk_len = in_bytes(p.image.size_bytes())?;
    let placed = layout.place(disk_len).map_err(BtrfsImageError::from)?;
    let part = |label: &str| -> Result<PlacedPartition, ImagerError> {
        placed
            .get(label)
            .cloned()
            .ok_or_else(|| refuse("layout", format!("no {label} partition")))
    };
    let (esp_part, pool_part) = (part(EFI_LABEL)?, part(POOL_LABEL)?);
    let geometry = EspGeometry::new(esp_part.len(), placed.sector_size);
    if !geometry.is_fat32() {
        return Err(refuse(
            "image.esp_mib",
            format!(
                "{} MiB is too small for FAT32 (about {} clusters of {} bytes; at least {} needed)",
                p.image.esp_mib,
                geometry.data_clusters,
                geometry.cluster_size,
                fat::FAT32_MIN_CLUSTERS
            ),
        ));
    }
    let read = crate::read_input;
    let kernel = read("the kernel image", &inputs.kernel_image)?;
    let loader = match &inputs.grub_efi {
        Some(path) if is_grub(inputs) => read("the GRUB EFI image", path)?,
        _ => read("systemd-boot", &inputs.systemd_boot)?,
    };
    progress(Progress::Step("packing the initramfs"));
    let initrd = build_boot_initramfs(inputs, None)?;

    progress(Progress::Step("making the Btrfs pool"));
    let parent = dest.parent().unwrap_or(Path::new("."));
    let work = tempfile::Builder::new()
        .prefix(".slate-imager-pool-")
        .tempdir_in(parent)
        .map_err(io_err("creating a temporary directory in", parent))?;
    let pool_file = work.path().join("pool.btrfs");
    fs::File::create(&pool_file)
        .and_then(|f| f.set_len(pool_part.len()))
        .map_err(io_err("creating", &pool_file))?;
    mkfs(&pool_file, &uuid)?;
    let mounted = MountedPool::mount(&pool_file, 0, 0, false).map_err(BtrfsImageError::from)?;
    progress(Progress::Step("filling the Btrfs pool"));
    let os_name = fill_pool(inputs, mounted.path(), &snap, &uuid, &kernel, &initrd)?;
    mounted.release().map_err(BtrfsImageError::from)?;

    progress(Progress::Step("writing the disk image"));
    let mut disk = FileDisk::create(dest, disk_len).map_err(io_err("creating", dest))?;
    write_gpt(&mut disk, &layout).map_err(BtrfsImageError::from)?;
    verify_gpt(&mut disk, &layout).map_err(BtrfsImageError::from)?;
    if is_grub(inputs) {
        // GRUB reads the first snapshot's /boot in the pool: no copies, nothing on trial.
        let first = grub_entry(inputs, &snap, &uuid, &os_name)?;
        write_grub_esp(inputs, &mut disk, &esp_part, &geometry, &loader)?;
        grub::lay_down(&mut disk, p.image.menu_timeout, &first).map_err(BtrfsImageError::from)?;
        progress(Progress::Step("copying the pool into its partition"));
        copy_pool(&pool_file, &mut disk, &pool_part)?;
        disk.flush().map_err(disk_err("(whole disk)", "flushing"))?;
        return Ok(());
    }
    write_esp(inputs, &mut disk, &esp_part, &geometry, &loader)?;
    let text = entry_text(&EntrySpec {
        snapshot: snap.clone(),
        pool_uuid: uuid,
        os_name,
        extra_options: entry_options(inputs),
    })
    .map_err(BtrfsImageError::from)?;
    sdboot::register(
        &mut disk,
        &snap,
        &kernel,
        &initrd,
        &text,
        entry::DEFAULT_TRIES,
    )
    .map_err(BtrfsImageError::from)?;
    // The image's first boot is not a trial: nothing older to fall back to.
    sdboot::bless(&mut disk, &snap).map_err(BtrfsImageError::from)?;
    progress(Progress::Step("copying the pool into its partition"));
    copy_pool(&pool_file, &mut disk, &pool_part)?;
    disk.flush().map_err(disk_err("(whole disk)", "flushing"))?;
    Ok(())
}

fn mkfs(file: &Path, uuid: &str) -> Result<(), BtrfsImageError> {
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-U", uuid, "-L", POOL_FS_LABEL])
        .arg(file)
        .output()
        .map_err(|e| BtrfsImageError::Mkfs(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BtrfsImageError::Mkfs(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

/// The subvolumes, the first snapshot's tree, its validation and the engine's directory, on
/// the pool mounted at `top`. Returns the OS name for the entry's title.
fn fill_pool(
    inputs: &Inputs,
    top: &Path,
    snap: &SnapshotName,
    uuid: &str,
    kernel: &[u8],
    initrd: &[u8],
) -> Result<String, ImagerError> {
    for name in [snap.as_str(), HOME_SUBVOLUME, STATE_SUBVOLUME] {
        slate_host::create_subvolume(top, name).map_err(BtrfsImageError::from)?;
    }
    let root = top.join(snap.as_str());
    assemble_root(inputs, &root)?;
    let rel = &inputs.kernel_release;
    write_generated(&root.join(format!("boot/vmlinuz-{rel}")), kernel)?;
    write_generated(&root.join(format!("boot/initrd.img-{rel}")), initrd)?;
    let fstab = fstab_text(uuid, snap);
    fstab::check_root(&fstab, snap).map_err(BtrfsImageError::from)?;
    write_generated(&root.join("etc/fstab"), fstab.as_bytes())?;
    // The fstab mounts /home: its mount point must exist.
    let home = root.join("home");
    if fs::symlink_metadata(&home).is_err() {
        fs::create_dir(&home)
            .and_then(|()| fs::set_permissions(&home, fs::Permissions::from_mode(0o755)))
            .map_err(io_err("creating", &home))?;
    }
    validate::validate(&tree::facts(&root), snap).map_err(|problems| {
        BtrfsImageError::Validation {
            snapshot: snap.to_string(),
            problems,
        }
    })?;
    let copies = (!is_grub(inputs)).then_some((kernel, initrd));
    slate_snapshot_engine::seed_engine_dir(top, uuid, snap, copies)
        .map_err(BtrfsImageError::from)?;
    Ok(tree::os_name(&root))
}

/// The ESP as the `image` output lays it down for systemd-boot (FAT32, volume id from the image
/// id, timestamps from SOURCE_DATE_EPOCH), with `loader.conf` `default root-*` and the
/// profile's timeout; the entry follows through `slate_bootloader::sdboot::snapshots::register`.
fn write_esp(
    inputs: &Inputs,
    disk: &mut FileDisk,
    esp: &PlacedPartition,
    geometry: &EspGeometry,
    systemd_boot: &[u8],
) -> Result<(), ImagerError> {
    let epoch = inputs.source_date_epoch;
    let volume_id = derived_u32(&inputs.image_id(), "esp-volume-id");
    fat::format(esp_view(disk, esp)?, geometry, volume_id, EFI_LABEL)?;
    let mut esp_view = esp_view(disk, esp)?;
    for dir in SYSTEMD_BOOT_DIRECTORIES {
        fat::create_dirs(&mut esp_view, epoch, &[dir])?;
    }
    let conf = loader_conf(LOADER_DEFAULT, inputs.profile.image.menu_timeout)?;
    let mut sectors = SectorBuffer::new(esp_view);
    let fs = fat::mount(&mut sectors, epoch)?;
    for (path, bytes) in [
        (FALLBACK_LOADER_PATH, systemd_boot),
        (SYSTEMD_BOOT_PATH, systemd_boot),
        (LOADER_CONF_PATH, conf.as_bytes()),
    ] {
        fat::write_file_atomically(&fs, path, bytes)?;
    }
    fat::unmount(fs)?;
    sectors.flush().map_err(disk_err(EFI_LABEL, "flushing"))?;
    Ok(())
}

/// The ESP of a GRUB btrfs-image: FAT32 as for systemd-boot, its directories, and the GRUB EFI
/// image at the removable path; `slate_bootloader::grub::snapshots::lay_down` writes the rest.
fn write_grub_esp(
    inputs: &Inputs,
    disk: &mut FileDisk,
    esp: &PlacedPartition,
    geometry: &EspGeometry,
    grub_efi: &[u8],
) -> Result<(), ImagerError> {
    let epoch = inputs.source_date_epoch;
    let volume_id = derived_u32(&inputs.image_id(), "esp-volume-id");
    fat::format(esp_view(disk, esp)?, geometry, volume_id, EFI_LABEL)?;
    let mut esp_view = esp_view(disk, esp)?;
    // EFI, EFI/BOOT and grub (not the A/B slots).
    for dir in &GRUB_DIRECTORIES[..3] {
        fat::create_dirs(&mut esp_view, epoch, &[dir])?;
    }
    let mut sectors = SectorBuffer::new(esp_view);
    let fs = fat::mount(&mut sectors, epoch)?;
    fat::write_file_atomically(&fs, FALLBACK_LOADER_PATH, grub_efi)?;
    fat::unmount(fs)?;
    sectors.flush().map_err(disk_err(EFI_LABEL, "flushing"))?;
    Ok(())
}

fn esp_view<'a>(
    disk: &'a mut FileDisk,
    esp: &PlacedPartition,
) -> Result<PartitionView<&'a mut FileDisk>, BtrfsImageError> {
    PartitionView::new(disk, esp.start(), esp.len()).map_err(disk_err(EFI_LABEL, "opening"))
}

/// The pool file into its partition, through the `Disk` trait; all-zero blocks are skipped
/// (the new image is zero-filled and stays sparse).
fn copy_pool(
    pool_file: &Path,
    disk: &mut FileDisk,
    part: &PlacedPartition,
) -> Result<(), BtrfsImageError> {
    const BLOCK: usize = 64 << 10;
    let mut file = fs::File::open(pool_file).map_err(io_err("opening", pool_file))?;
    let len = file.metadata().map_err(io_err("reading", pool_file))?.len();
    if len != part.len() {
        return Err(BtrfsImageError::Io {
            action: "sizing",
            path: pool_file.to_owned(),
            source: std::io::Error::other(format!("{len} bytes, the partition has {}", part.len())),
        });
    }
    let mut view = PartitionView::new(&mut *disk, part.start(), part.len())
        .map_err(disk_err(POOL_LABEL, "opening"))?;
    let mut buf = vec![0u8; BLOCK];
    let mut offset = 0u64;
    while offset < len {
        let n = usize::try_from((len - offset).min(BLOCK as u64)).unwrap_or(BLOCK);
        file.read_exact(&mut buf[..n])
            .map_err(io_err("reading", pool_file))?;
        if buf[..n].iter().any(|&b| b != 0) {
            view.write_at(offset, &buf[..n])
                .map_err(disk_err(POOL_LABEL, "writing the pool"))?;
        }
        offset += n as u64;
    }
    view.flush().map_err(disk_err(POOL_LABEL, "flushing"))
}
