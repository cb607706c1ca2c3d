//! The artifacts: squashfs rootfs, initramfs, command line, UKI.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Cursor, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;
use slate_cpio::{concat_initrds, CpioWriter};
use slate_profile::image_contract;
use slate_rootfs::{build_squashfs_cached, build_squashfs_with_progress, SquashfsOptions};
use slate_uki::{UkiBuilder, UKI_SBAT_LINE};

use crate::extension::{extension_nodes, read_extension};
use crate::root_tree::{program_in_layers, write_generated};
use crate::{ImagerError, Inputs, Progress};

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ImagerError> {
    crate::read_input(what, path)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImagerError + '_ {
    move |source| ImagerError::MissingInput {
        what: "the base rootfs",
        path: path.to_owned(),
        source,
    }
}

/// Copy a directory tree (files, directories, symlinks) keeping modes.
fn copy_tree(from: &Path, to: &Path) -> Result<(), ImagerError> {
    for entry in fs::read_dir(from).map_err(io_err(from))? {
        let entry = entry.map_err(io_err(from))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let meta = fs::symlink_metadata(&src).map_err(io_err(&src))?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            let target = fs::read_link(&src).map_err(io_err(&src))?;
            std::os::unix::fs::symlink(target, &dst).map_err(io_err(&dst))?;
        } else if kind.is_dir() {
            fs::create_dir(&dst).map_err(io_err(&dst))?;
            copy_tree(&src, &dst)?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(io_err(&dst))?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(io_err(&src))?;
        } else {
            return Err(ImagerError::BadInput {
                what: "the base rootfs",
                reason: format!(
                    "{} is a special file; devices belong to devtmpfs",
                    src.display()
                ),
            });
        }
    }
    Ok(())
}

/// The root filesystem as squashfs: the tree [`assemble_root`] makes, compressed.
pub fn build_rootfs(
    inputs: &Inputs,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<u8>, ImagerError> {
    progress(Progress::Step("assembling the root filesystem"));
    let tree = tempfile::tempdir().map_err(io_err(Path::new("a temporary directory")))?;
    assemble_root(inputs, tree.path())?;

    progress(Progress::Step("compressing the root filesystem"));
    let opts = SquashfsOptions {
        source_date_epoch: u32::try_from(inputs.source_date_epoch).unwrap_or(u32::MAX),
        compression: slate_rootfs::Compression::Zstd {
            level: inputs.profile.rootfs.zstd_level,
        },
        ..SquashfsOptions::default()
    };
    let mut out = Cursor::new(Vec::new());
    let mut files = |done, total| progress(Progress::Files { done, total });
    match &inputs.cache {
        Some(cache) => build_squashfs_cached(tree.path(), &mut out, &opts, cache, &mut files)?,
        None => build_squashfs_with_progress(tree.path(), &mut out, &opts, &mut files)?,
    };
    Ok(out.into_inner())
}

/// The image's root tree, in the empty directory `tree`: the base (directory or tar), with
/// `/etc/os-release` written from the profile so the booted root names its own version, the
/// node's runtime configuration (`/etc/slate/node.toml`: health checks, watchdog) when the
/// profile has one, the keys it trusts for updates (`/etc/slate/trusted-keys/<key id>.pub`)
/// and, for a Secure Boot image, its db certificate. The squashfs root and a `btrfs-image`'s
/// first snapshot are both this tree.
pub fn assemble_root(inputs: &Inputs, tree: &Path) -> Result<(), ImagerError> {
    let base = &inputs.base_rootfs;
    if base.is_dir() {
        copy_tree(base, tree)?;
    } else {
        // A tar of the root: opened as a regular file (a FIFO would block the build), then
        // streamed; its size is its own.
        let file =
            slate_files::open_regular(base, "the base rootfs").map_err(ImagerError::Input)?;
        let mut archive = tar::Archive::new(file);
        archive.set_preserve_permissions(true);
        archive.unpack(tree).map_err(|e| ImagerError::BadInput {
            what: "the base rootfs",
            reason: format!(
                "{} is neither a directory nor a tar archive: {e}",
                base.display()
            ),
        })?;
    }
    crate::systemd_root::check_root(&inputs.profile, tree)?;
    crate::systemd_root::add_units(&inputs.profile, tree)?;
    let etc = tree.join("etc");
    write_generated(
        &etc.join("os-release"),
        inputs.profile.os_release().as_bytes(),
    )?;
    if let Some(node) = inputs.profile.node_config() {
        // Every service's program (and ready command) must be in the root being built, or in
        // one of the system extensions layered over it.
        let layers = inputs
            .extensions
            .iter()
            .map(extension_nodes)
            .collect::<Result<Vec<_>, _>>()?;
        slate_services::start_order(&node.services, &|program| {
            program_in_layers(tree, &layers, program)
        })
        .map_err(|e| ImagerError::BadInput {
            what: "the profile's services",
            reason: e.to_string(),
        })?;
        // A tpm2 /var is opened with cryptsetup and tpm2-tools at every boot: an image
        // without them would refuse to boot, so it is refused here.
        if node.var.as_ref().map(|v| v.mode) == Some(slate_profile::VarMode::Tpm2) {
            let missing: Vec<&str> = std::iter::once(image_contract::CRYPTSETUP)
                .chain(image_contract::TPM2_TOOLS.iter().copied())
                .filter(|p| !program_in_layers(tree, &layers, Path::new(p)))
                .collect();
            if !missing.is_empty() {
                return Err(ImagerError::BadInput {
                    what: "the profile's [var] mode",
                    reason: format!(
                        "tpm2 needs {} in the root or an extension (xtask tpm2-ext makes one)",
                        missing.join(", ")
                    ),
                });
            }
        }
        write_generated(
            &tree.join(slate_profile::NODE_CONFIG_PATH),
            node.to_toml().as_bytes(),
        )?;
    }
    // The image trusts exactly the profile's keys: whatever the base had there goes.
    let trusted = tree.join(image_contract::TRUSTED_KEYS_PATH);
    if let Ok(meta) = fs::symlink_metadata(&trusted) {
        let removed = if meta.is_dir() {
            fs::remove_dir_all(&trusted)
        } else {
            fs::remove_file(&trusted)
        };
        removed.map_err(|source| ImagerError::Output {
            path: trusted.clone(),
            source,
        })?;
    }
    for key in &inputs.trusted_keys {
        write_generated(
            &trusted.join(slate_trust::trusted_key_file_name(key)),
            key.to_pem().as_bytes(),
        )?;
    }

    // A Secure Boot image names its db certificate; any other image carries none, whatever
    // the base had.
    let db = tree.join(image_contract::SECURE_BOOT_DB_PATH);
    match &inputs.secure_boot {
        Some(sb) => write_generated(&db, &sb.cert_pem)?,
        None if fs::symlink_metadata(&db).is_ok() => {
            fs::remove_file(&db).map_err(|source| ImagerError::Output {
                path: db.clone(),
                source,
            })?
        }
        None => {}
    }
    Ok(())
}

/// The initramfs uncompressed (`--output initramfs`): one archive of slate-init (or slate) as
/// `/init`, the module closure with its load order and the root squashfs when there is one (a
/// `btrfs-image`'s init mounts the root named by `root=` instead); the system extensions and
/// their manifest follow as a second, gzip-compressed archive.
pub fn build_initramfs(inputs: &Inputs, rootfs: Option<&[u8]>) -> Result<Vec<u8>, ImagerError> {
    let parts = initramfs_parts(inputs, rootfs, false)?;
    Ok(join_parts(parts.main, parts.root, parts.extensions))
}

fn join_parts(main: Vec<u8>, root: Option<Vec<u8>>, extensions: Option<Vec<u8>>) -> Vec<u8> {
    if root.is_none() && extensions.is_none() {
        return main;
    }
    let members: Vec<&[u8]> = std::iter::once(&main[..])
        .chain(root.as_deref())
        .chain(extensions.as_deref())
        .collect();
    concat_initrds(&members)
}

/// The initramfs as the boot loader loads it: the main archive zstd-compressed, the root's
/// archive uncompressed (see [`Parts`]), then the extensions' gzip member as it is. The kernel unpacks compressed members one after another,
/// but a member found *inside* a decompressed one is "junk within compressed archive": the
/// extensions must not go into the zstd stream.
pub fn build_boot_initramfs(
    inputs: &Inputs,
    rootfs: Option<&[u8]>,
) -> Result<Vec<u8>, ImagerError> {
    let parts = initramfs_parts(inputs, rootfs, true)?;
    let main = match &inputs.cache {
        Some(cache) => {
            let key = crate::cache::initramfs_key(INITRAMFS_ZSTD_LEVEL, &parts.main);
            cache.get_or_make(crate::Stage::Initramfs, &key, || {
                compress_initramfs(&parts.main)
            })?
        }
        None => compress_initramfs(&parts.main)?,
    };
    Ok(join_parts(main, parts.root, parts.extensions))
}

/// The three members of an initramfs, in the order the kernel unpacks them.
struct Parts {
    /// init, the modules and their load order.
    main: Vec<u8>,
    /// The root squashfs alone in its own archive (issue 41): it is compressed already, block
    /// by block, so a whole-stream compression over it gains nothing and turns a one-file change
    /// of the root into a rewrite of every byte after it, which no delta can reuse.
    root: Option<Vec<u8>>,
    /// The system extensions' gzip-compressed archive.
    extensions: Option<Vec<u8>>,
}

/// The members of the initramfs (see [`Parts`]); the root in the main archive unless
/// `root_apart` (the one archive `--output initramfs` writes, uncompressed either way).
fn initramfs_parts(
    inputs: &Inputs,
    rootfs: Option<&[u8]>,
    root_apart: bool,
) -> Result<Parts, ImagerError> {
    let epoch = u32::try_from(inputs.source_date_epoch).unwrap_or(u32::MAX);
    let mut cpio = CpioWriter::with_mtime(epoch);
    for dir in [
        "dev",
        "proc",
        "sys",
        "run",
        "newroot",
        "etc",
        "etc/slate", // the parent of image_contract::MODULES_LOAD_PATH
        "lib",
    ] {
        cpio.dir(dir, 0o755)?;
    }
    cpio.char_device("dev/console", 0o600, 5, 1)?;
    let init = match &inputs.init {
        Some(init) => read("the init binary", init)?,
        None => read("the slate binary", &inputs.slate)?,
    };
    cpio.file("init", 0o755, init)?;

    let modules_root = format!("lib/modules/{}", inputs.kernel_release);
    let mut dirs = BTreeSet::from(["lib/modules".to_string(), modules_root.clone()]);
    for module in &inputs.module_paths {
        let mut parent = Path::new(module).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(format!("{modules_root}/{}", p.display()));
            parent = p.parent();
        }
    }
    for dir in &dirs {
        cpio.dir(dir, 0o755)?;
    }
    for module in &inputs.module_paths {
        let data = read("a kernel module", &inputs.modules_dir.join(module))?;
        cpio.file(&format!("{modules_root}/{module}"), 0o644, data)?;
    }
    // `path: what it needs first`, in a load order: init loads independent modules side by
    // side (docs/formats.md §6.3).
    let load_order: String = inputs
        .module_paths
        .iter()
        .map(|m| {
            let needs = inputs.module_dependencies.get(m).map_or(&[][..], |d| d);
            format!(
                "{m}:{}\n",
                needs.iter().map(|d| format!(" {d}")).collect::<String>()
            )
        })
        .collect();
    cpio.file(image_contract::MODULES_LOAD_PATH, 0o644, load_order)?;
    if let Some((path, marker)) = crate::systemd_root::initramfs_marker(&inputs.profile) {
        cpio.file(path, 0o644, marker.as_bytes().to_vec())?;
    }
    let root = match rootfs {
        Some(rootfs) if root_apart => {
            let mut cpio = CpioWriter::with_mtime(epoch);
            cpio.file(image_contract::ROOTFS_IMAGE_PATH, 0o644, rootfs.to_vec())?;
            Some(cpio.finish())
        }
        Some(rootfs) => {
            cpio.file(image_contract::ROOTFS_IMAGE_PATH, 0o644, rootfs.to_vec())?;
            None
        }
        None => None,
    };
    let main = cpio.finish();
    if inputs.extensions.is_empty() {
        return Ok(Parts {
            main,
            root,
            extensions: None,
        });
    }
    let mut ext = CpioWriter::with_mtime(epoch);
    ext.dir(image_contract::EXTENSIONS_PATH, 0o755)?;
    let mut entries = Vec::new();
    for extension in &inputs.extensions {
        let entry = extension.entry();
        ext.file(
            &format!("{}/{}", image_contract::EXTENSIONS_PATH, entry.file),
            0o644,
            read_extension(extension)?,
        )?;
        entries.push(entry);
    }
    // docs/formats.md §6.4: init checks each image against its line before layering it.
    ext.file(
        image_contract::EXTENSIONS_MANIFEST_PATH,
        0o644,
        slate_profile::render_extensions_manifest(&entries),
    )?;
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(&ext.finish())
        .and_then(|_| gz.flush())
        .map_err(io_err(Path::new("memory")))?;
    let compressed = gz.finish().map_err(io_err(Path::new("memory")))?;
    Ok(Parts {
        main,
        root,
        extensions: Some(compressed),
    })
}

/// The zstd level of the initramfs in a UKI or beside GRUB's kernel: the archive is mostly the
/// static slate binary (the root squashfs is outside it); level 3 takes it from
/// 26 to 14 MB in half a second, higher levels gain under 1 MB for seconds more.
const INITRAMFS_ZSTD_LEVEL: i32 = 3;

/// The initramfs as the boot loader loads it: zstd-compressed (the kernel unpacks it; Debian's
/// has `CONFIG_RD_ZSTD`). The firmware reads every byte of the UKI from the ESP before the
/// kernel starts, and under emulation that read costs far more than the decompression.
/// Deterministic: one thread, a fixed level.
pub fn compress_initramfs(archive: &[u8]) -> Result<Vec<u8>, ImagerError> {
    zstd::bulk::compress(archive, INITRAMFS_ZSTD_LEVEL).map_err(ImagerError::CompressInitramfs)
}

/// The kernel command line.
pub fn build_cmdline(inputs: &Inputs) -> String {
    inputs.profile.cmdline()
}

/// The UKI's file name on the ESP, with its boot-counting tries.
pub fn uki_name(inputs: &Inputs, tries: Option<u32>) -> Result<String, ImagerError> {
    Ok(slate_esp::uki_file_name(
        &inputs.profile.name,
        &inputs.profile.version,
        tries,
    )?)
}

/// The unified kernel image: systemd-stub with os-release, command line, kernel release,
/// initramfs and kernel.
pub fn build_uki(inputs: &Inputs, initramfs: &[u8]) -> Result<Vec<u8>, ImagerError> {
    let stub = read("systemd-stub", &inputs.stub)?;
    let kernel = read("the kernel image", &inputs.kernel_image)?;
    let os_release = inputs.profile.os_release();
    let cmdline = build_cmdline(inputs);
    Ok(UkiBuilder::new(&stub)
        .osrel(&os_release)
        .cmdline(&cmdline)
        .uname(&inputs.kernel_release)
        .initrd(initramfs)
        .linux(kernel)
        .sbat(UKI_SBAT_LINE)
        .build()?)
}

/// A profile size in bytes. A parsed profile's sizes are bounded so that this never fails; the
/// conversion is checked all the same, because a size that wrapped around would build an image
/// of the wrong size without a word.
pub(crate) fn in_bytes(size: Result<u64, slate_profile::ProfileError>) -> Result<u64, ImagerError> {
    size.map_err(|e| ImagerError::BadInput {
        what: "profile",
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt as _};

    use super::*;
    use crate::root_tree::program_in;

    /// busybox's applets are links: `/bin/httpd -> busybox`, `/usr/bin/web -> /bin/busybox`.
    #[test]
    fn a_program_is_found_through_links_inside_the_root_only() {
        let tree = tempfile::tempdir().unwrap();
        let root = tree.path();
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::write(root.join("bin/busybox"), b"#!").unwrap();
        fs::set_permissions(root.join("bin/busybox"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("bin/data"), b"x").unwrap();
        symlink("busybox", root.join("bin/httpd")).unwrap();
        symlink("/bin/busybox", root.join("usr/bin/web")).unwrap();
        symlink("../../../../../../bin/busybox", root.join("usr/bin/deep")).unwrap();
        symlink("loop", root.join("bin/loop")).unwrap();
        for (path, found) in [
            ("/bin/busybox", true),
            ("/bin/httpd", true),
            ("/usr/bin/web", true),
            ("/usr/bin/deep", true),
            ("/bin/data", false),
            ("/bin/loop", false),
            ("/bin", false),
            ("/bin/nginx", false),
        ] {
            assert_eq!(program_in(root, Path::new(path)), found, "{path}");
        }
    }
}
