//! One build: inputs resolved, output prepared (so an unwritable destination fails first), the
//! artifact built, then moved into place.

use std::path::{Path, PathBuf};

use slate_disk::FileDisk;
use slate_esp::loader_conf;
use slate_installer::{write_grub_image, write_image, GrubImagePlan, ImagePlan};
use slate_layout::LayoutParams;

use crate::artifacts::{
    build_boot_initramfs, build_cmdline, build_initramfs, build_rootfs, build_uki, in_bytes,
    uki_name,
};
use crate::output::PendingOutput;
use crate::{ImagerError, Inputs, OutputKind, Progress};
use slate_bundle::{
    write_installable_bundle_reusing, BlobInput, BundleSpec, InstallDefaults, BINARY_MEDIA_TYPE,
    UKI_MEDIA_TYPE,
};

/// The steps a build of `inputs.kind` takes, for `--dry-run`.
pub fn plan(inputs: &Inputs) -> Vec<String> {
    if inputs.kind == OutputKind::BtrfsImage {
        return crate::btrfs_image::plan(inputs);
    }
    let p = &inputs.profile;
    let mut steps = Vec::new();
    let kind = inputs.kind;
    if !matches!(kind, OutputKind::Cmdline | OutputKind::Kernel) {
        steps.push(format!(
            "squashfs (zstd {}) of {} with /etc/os-release for {} {}{}",
            p.rootfs.zstd_level,
            inputs.base_rootfs.display(),
            p.name,
            p.version,
            node_config_summary(p)
        ));
    }
    if !matches!(
        kind,
        OutputKind::Cmdline | OutputKind::Kernel | OutputKind::Rootfs
    ) {
        steps.push(format!(
            "initramfs: /init = {}, {} modules for {} ({}), rootfs.sqsh, {} extensions{}",
            inputs.slate.display(),
            inputs.module_paths.len(),
            inputs.kernel_release,
            inputs.module_paths.join(" "),
            inputs.extensions.len(),
            inputs
                .extensions
                .iter()
                .map(|e| format!(
                    " ({} {}, {} bytes, signature verified)",
                    e.manifest.name, e.manifest.version, e.manifest.size
                ))
                .collect::<String>()
        ));
    }
    if matches!(
        kind,
        OutputKind::Uki | OutputKind::Image | OutputKind::Installer
    ) {
        steps.push(format!(
            "UKI on {}: .osrel .cmdline ({}) .uname .initrd .linux ({})",
            inputs.stub.display(),
            build_cmdline(inputs),
            inputs.kernel_image.display()
        ));
    }
    match kind {
        OutputKind::Image if inputs.grub_efi.is_some() => steps.push(format!(
            "{} MiB GPT disk: EFI {} MiB (GRUB {}, grub.cfg, grubenv and slate-default.env \
             saved_entry=A, slot A: vmlinuz, initramfs, cmdline.cfg), META 1 MiB, STATE {} MiB, \
             EPHEMERAL rest",
            p.image.size_mib,
            p.image.esp_mib,
            inputs.grub_efi.as_deref().unwrap_or(Path::new("")).display(),
            p.image.state_mib
        )),
        OutputKind::Image => steps.push(format!(
            "{} MiB GPT disk: EFI {} MiB (systemd-boot {}), META 1 MiB, STATE {} MiB, EPHEMERAL rest",
            p.image.size_mib,
            p.image.esp_mib,
            inputs.systemd_boot.display(),
            p.image.state_mib
        )),
        OutputKind::Installer => {
            steps.push(format!(
                "OCI layout: UKI + slate binary + {} + bundle manifest (signed separately: slate sign)",
                if inputs.grub_efi.is_some() { "GRUB" } else { "systemd-boot" }
            ))
        }
        OutputKind::Cmdline => steps.push(format!("command line: {}", build_cmdline(inputs))),
        OutputKind::Kernel => steps.push(format!("kernel: {}", inputs.kernel_image.display())),
        _ => {}
    }
    steps
}

/// What the image's `/etc/slate/node.toml` will hold, for the plan.
fn node_config_summary(p: &slate_profile::Profile) -> String {
    let Some(node) = p.node_config() else {
        return String::new();
    };
    let health = match &node.health {
        Some(h) => format!(
            "{} health check(s) within {}s",
            h.checks.len(),
            h.timeout_secs
        ),
        None => "no health checks".to_string(),
    };
    let watchdog = match node.enabled_watchdog() {
        Some(w) => format!("watchdog {} {}s", w.device.display(), w.timeout_secs),
        None => "no watchdog".to_string(),
    };
    format!(
        " and /{} ({health}, {watchdog})",
        slate_profile::NODE_CONFIG_PATH
    )
}

/// The binary inputs a profile names, each checked as a regular file (by its opened
/// descriptor) before the output's temporary file exists: a FIFO, a device, a directory or a
/// dangling link named as a kernel or a loader writes nothing at all (issue 44). A missing one
/// is left to the read that needs it, which says so — not every kind reads every input.
fn check_input_files(inputs: &Inputs) -> Result<(), ImagerError> {
    let named = [
        ("the kernel image", Some(&inputs.kernel_image)),
        ("the EFI stub", Some(&inputs.stub)),
        ("systemd-boot", Some(&inputs.systemd_boot)),
        ("the GRUB EFI image", inputs.grub_efi.as_ref()),
        ("the slate binary", Some(&inputs.slate)),
        ("the init binary", inputs.init.as_ref()),
    ];
    for (what, path) in named {
        let Some(path) = path else { continue };
        match slate_files::open_regular(path, what) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(ImagerError::Input(e)),
        }
    }
    Ok(())
}

/// Build `inputs.kind` into `out`.
pub fn build(
    inputs: &Inputs,
    out: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, ImagerError> {
    if inputs.kind == OutputKind::BtrfsImage {
        // Refused before the output's temporary file exists.
        slate_installer::require_root("building a btrfs-image")
            .map_err(crate::BtrfsImageError::from)?;
    }
    check_input_files(inputs)?;
    let pending = match inputs.kind {
        OutputKind::Installer => PendingOutput::dir(out)?,
        _ => PendingOutput::file(out)?,
    };
    let write = |bytes: &[u8]| {
        std::fs::write(pending.path(), bytes).map_err(|source| ImagerError::Output {
            path: out.to_owned(),
            source,
        })
    };
    match inputs.kind {
        OutputKind::Cmdline => write(format!("{}\n", build_cmdline(inputs)).as_bytes())?,
        OutputKind::Kernel => {
            let kernel = crate::read_input("the kernel image", &inputs.kernel_image)?;
            write(&kernel)?
        }
        OutputKind::Rootfs => write(&build_rootfs(inputs, progress)?)?,
        OutputKind::Initramfs => {
            let rootfs = build_rootfs(inputs, progress)?;
            progress(Progress::Step("packing the initramfs"));
            write(&build_initramfs(inputs, Some(&rootfs))?)?
        }
        OutputKind::Uki => write(&uki(inputs, progress)?)?,
        OutputKind::Image if inputs.grub_efi.is_some() => {
            grub_image(inputs, pending.path(), out, progress)?
        }
        OutputKind::Image => {
            let uki = uki(inputs, progress)?;
            let p = &inputs.profile;
            let plan = ImagePlan {
                image_id: inputs.image_id(),
                layout: layout_params(p)?,
                source_date_epoch: inputs.source_date_epoch,
                systemd_boot: systemd_boot(inputs)?,
                uki,
                uki_name: uki_name(inputs, Some(p.image.tries))?,
                loader_conf: loader_conf(&format!("{}-*", p.name), p.image.menu_timeout)?,
                enroll: inputs.secure_boot.as_ref().and_then(|sb| sb.enroll.clone()),
            };
            progress(Progress::Step("writing the disk image"));
            let mut disk = FileDisk::create(pending.path(), in_bytes(p.image.size_bytes())?)
                .map_err(|source| ImagerError::Output {
                    path: out.to_owned(),
                    source,
                })?;
            write_image(&mut disk, &plan, &mut |_| {})?;
        }
        OutputKind::BtrfsImage => crate::btrfs_image::build(inputs, pending.path(), progress)?,
        OutputKind::Installer => {
            let uki = uki(inputs, progress)?;
            progress(Progress::Step("laying out the installer bundle"));
            let p = &inputs.profile;
            let slate = crate::read_input("the slate binary", &inputs.slate)?;
            let uki_file = uki_name(inputs, None)?;
            // The loader an install from this bundle lays down: GRUB for a GRUB profile.
            let (loader_role, loader_file, loader) = match &inputs.grub_efi {
                Some(grub_efi) => (
                    slate_bundle::GRUB_ROLE,
                    "grubx64.efi",
                    crate::read_input("the GRUB EFI image", grub_efi)?,
                ),
                None => (
                    slate_bundle::SYSTEMD_BOOT_ROLE,
                    "systemd-bootx64.efi",
                    systemd_boot(inputs)?,
                ),
            };
            let params = slate_delta::DEFAULT_PARAMS;
            let level = slate_delta::zchunks::LEVEL;
            let (known, missing) = match &inputs.cache {
                Some(cache) => {
                    let digests: Vec<[u8; 32]> = [&uki[..], &slate, &loader]
                        .map(slate_delta::sha256)
                        .to_vec();
                    crate::frame_cache::load(cache, &digests, params, level)
                }
                None => Default::default(),
            };
            write_installable_bundle_reusing(
                pending.path(),
                BundleSpec {
                    name: &p.name,
                    version: &p.version,
                    arch: p.arch.as_str(),
                    variant: &p.variant,
                },
                InstallDefaults {
                    esp_mib: p.image.esp_mib,
                    state_mib: p.image.state_mib,
                    tries: p.image.tries,
                    menu_timeout: p.image.menu_timeout,
                    keep_versions: p.image.keep_versions,
                },
                &[
                    BlobInput {
                        role: slate_bundle::UKI_ROLE,
                        file_name: &uki_file,
                        media_type: UKI_MEDIA_TYPE,
                        bytes: &uki,
                    },
                    BlobInput {
                        role: slate_bundle::INSTALLER_ROLE,
                        file_name: "slate",
                        media_type: BINARY_MEDIA_TYPE,
                        bytes: &slate,
                    },
                    BlobInput {
                        role: loader_role,
                        file_name: loader_file,
                        media_type: slate_bundle::EFI_MEDIA_TYPE,
                        bytes: &loader,
                    },
                ],
                params,
                &known,
            )?;
            if let Some(cache) = &inputs.cache {
                crate::frame_cache::store(cache, pending.path(), &missing);
            }
        }
    }
    pending.commit()
}

/// The GRUB variant of the image: kernel, initramfs and command line into slot A.
fn grub_image(
    inputs: &Inputs,
    dest: &Path,
    out: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ImagerError> {
    let p = &inputs.profile;
    let grub_efi = inputs.grub_efi.clone().unwrap_or_default();
    let read = crate::read_input;
    let rootfs = build_rootfs(inputs, progress)?;
    progress(Progress::Step("packing the initramfs"));
    let initramfs = build_boot_initramfs(inputs, Some(&rootfs))?;
    let plan = GrubImagePlan {
        image_id: inputs.image_id(),
        layout: layout_params(p)?,
        source_date_epoch: inputs.source_date_epoch,
        grub_efi: read("the GRUB EFI image", &grub_efi)?,
        kernel: read("the kernel image", &inputs.kernel_image)?,
        initramfs,
        cmdline: build_cmdline(inputs),
        version: p.version.clone(),
        menu_timeout: p.image.menu_timeout,
    };
    progress(Progress::Step("writing the disk image (GRUB)"));
    let mut disk = FileDisk::create(dest, in_bytes(p.image.size_bytes())?).map_err(|source| {
        ImagerError::Output {
            path: out.to_owned(),
            source,
        }
    })?;
    write_grub_image(&mut disk, &plan, &mut |_| {})?;
    Ok(())
}

fn uki(inputs: &Inputs, progress: &mut dyn FnMut(Progress)) -> Result<Vec<u8>, ImagerError> {
    let rootfs = build_rootfs(inputs, progress)?;
    progress(Progress::Step("packing the initramfs"));
    let initramfs = build_boot_initramfs(inputs, Some(&rootfs))?;
    progress(Progress::Step("assembling the UKI"));
    let uki = build_uki(inputs, &initramfs)?;
    match &inputs.secure_boot {
        Some(sb) => {
            progress(Progress::Step("signing the UKI"));
            sb.sign("the UKI", &uki)
        }
        None => Ok(uki),
    }
}

/// systemd-boot as the image ships it: signed for a Secure Boot image.
fn systemd_boot(inputs: &Inputs) -> Result<Vec<u8>, ImagerError> {
    let bytes = crate::read_input("systemd-boot", &inputs.systemd_boot)?;
    match &inputs.secure_boot {
        Some(sb) => sb.sign("systemd-boot", &bytes),
        None => Ok(bytes),
    }
}

/// The partition sizes a profile asks for; the rest is slate's reference layout.
fn layout_params(profile: &slate_profile::Profile) -> Result<LayoutParams, ImagerError> {
    Ok(LayoutParams {
        esp_size: in_bytes(profile.image.esp_bytes())?,
        state_size: in_bytes(profile.image.state_bytes())?,
        ..LayoutParams::default()
    })
}
