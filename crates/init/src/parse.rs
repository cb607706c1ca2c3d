//! init's pure decisions, apart from its syscalls: what to do after a failure, which program
//! to execute, the module list and the order of the root's layers (the extensions manifest is
//! `slate_profile::parse_extensions_manifest`).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use slate_host as host;
use slate_host::AfterFailure;

use crate::{DEFAULT_INIT, REBOOT_DELAY};

/// What PID 1 does after a failed boot (exiting would panic the kernel, hiding the message):
/// what the kernel's `panic=` says, [`REBOOT_DELAY`] without one (or without the command line).
pub(crate) fn failure_action(cmdline: Option<&str>) -> AfterFailure {
    host::after_failure(cmdline.unwrap_or(""), REBOOT_DELAY)
}

/// The program to execute in the new root: `slate.init=` or `/sbin/init`.
pub(crate) fn init_program(cmdline: &str) -> Result<&str> {
    let init = host::cmdline_value(cmdline, "slate.init")
        .filter(|v| !v.is_empty())
        .unwrap_or(DEFAULT_INIT);
    ensure!(
        init.starts_with('/'),
        "slate.init={init} is not an absolute path"
    );
    Ok(init)
}

/// `kernel/fs/squashfs/squashfs.ko[.xz]` -> `squashfs`.
pub(crate) fn module_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.find(".ko").map_or(file, |end| &file[..end])
}

/// A root on a block device, named by the kernel's own parameters: `root=UUID=<uuid>`
/// (`root=/dev/…` too), `rootfstype=`, `rootflags=` and `rw`/`ro`. A Btrfs snapshot root is
/// `root=UUID=<pool> rootflags=subvol=<snapshot> rootfstype=btrfs rw`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRoot {
    pub source: RootSource,
    /// `rootfstype=`; `None`: the type the device's head names.
    pub fstype: Option<String>,
    /// `rootflags=`, handed to mount(2) as its data.
    pub flags: Option<String>,
    /// `rw` given (and not overridden by a later `ro`): mounted writable.
    pub read_write: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSource {
    Uuid(String),
    Device(PathBuf),
}

/// The block root the command line names; `None` when it names none (the squashfs root in the
/// initramfs is then mounted).
pub fn block_root(cmdline: &str) -> Result<Option<BlockRoot>> {
    let Some(root) = host::cmdline_value(cmdline, "root").filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let source = if let Some(uuid) = root.strip_prefix("UUID=") {
        let hex: String = uuid.chars().filter(|c| *c != '-').collect();
        ensure!(
            hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()),
            "root={root}: {uuid:?} is not a UUID"
        );
        RootSource::Uuid(uuid.to_ascii_lowercase())
    } else if root.starts_with("/dev/") {
        RootSource::Device(PathBuf::from(root))
    } else {
        anyhow::bail!("root={root}: slate's init takes root=UUID=<uuid> or root=/dev/<device>");
    };
    let fstype = host::cmdline_value(cmdline, "rootfstype")
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let flags = host::cmdline_value(cmdline, "rootflags")
        .filter(|f| !f.is_empty())
        .map(str::to_owned);
    // The later of `rw` and `ro` wins, as in the kernel; the kernel's default is read-only.
    let read_write = cmdline
        .split_ascii_whitespace()
        .take_while(|t| *t != "--")
        .filter(|t| *t == "rw" || *t == "ro")
        .last()
        == Some("rw");
    Ok(Some(BlockRoot {
        source,
        fstype,
        flags,
        read_write,
    }))
}

/// One read-only squashfs layer of the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    /// `ext-N` (N from 1, manifest order) or `rootfs`.
    pub(crate) name: String,
    pub(crate) image: PathBuf,
    /// Where it is mounted when the root is an overlay.
    pub(crate) mountpoint: PathBuf,
}

/// The layers of the root, topmost first: the extensions in manifest order, then the rootfs.
pub(crate) fn plan_layers(
    rootfs: &Path,
    ext_dir: &Path,
    extensions: &[String],
    layers_dir: &Path,
) -> Vec<Layer> {
    let exts = extensions.iter().enumerate().map(|(i, file)| {
        let name = format!("ext-{}", i + 1);
        Layer {
            mountpoint: layers_dir.join(&name),
            image: ext_dir.join(file),
            name,
        }
    });
    let root = Layer {
        name: "rootfs".to_string(),
        image: rootfs.to_path_buf(),
        mountpoint: layers_dir.join("rootfs"),
    };
    exts.chain(std::iter::once(root)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn block_root_reads_the_kernel_root_parameters() {
        assert_eq!(block_root("console=ttyS0 panic=10").unwrap(), None);
        let snap = block_root(
            "console=ttyS0 root=UUID=5F1C7A9E-2b3d-4e8f-9a0b-1c2d3e4f5a6b \
             rootflags=subvol=root-20260101-000000 rootfstype=btrfs rw slate.init=/usr/bin/machined",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            snap,
            BlockRoot {
                source: RootSource::Uuid("5f1c7a9e-2b3d-4e8f-9a0b-1c2d3e4f5a6b".into()),
                fstype: Some("btrfs".into()),
                flags: Some("subvol=root-20260101-000000".into()),
                read_write: true,
            }
        );
        let dev = block_root("root=/dev/vda2 rw ro").unwrap().unwrap();
        assert_eq!(dev.source, RootSource::Device("/dev/vda2".into()));
        assert!(!dev.read_write, "a later ro wins");
        assert_eq!((dev.fstype, dev.flags), (None, None));
        // After `--` the words are init's.
        assert!(
            !block_root("root=/dev/vda2 -- rw")
                .unwrap()
                .unwrap()
                .read_write
        );
        for bad in [
            "root=UUID=nope",
            "root=LABEL=x",
            "root=vda2",
            "root=UUID=0123",
        ] {
            assert!(block_root(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn init_program_defaults_and_must_be_absolute() {
        assert_eq!(init_program("console=ttyS0").unwrap(), "/sbin/init");
        assert_eq!(init_program("slate.init=").unwrap(), "/sbin/init");
        assert_eq!(init_program("slate.init=/bin/sh quiet").unwrap(), "/bin/sh");
        let err = init_program("slate.init=sh").unwrap_err();
        assert_eq!(err.to_string(), "slate.init=sh is not an absolute path");
    }

    #[test]
    fn failures_follow_the_kernels_panic_setting() {
        assert_eq!(
            failure_action(Some("console=ttyS0 panic=0")),
            AfterFailure::Halt
        );
        assert_eq!(
            failure_action(Some("panic=0 panic=5")),
            AfterFailure::Reboot(Duration::from_secs(5))
        );
        assert_eq!(
            failure_action(Some("panic=-1")),
            AfterFailure::Reboot(Duration::ZERO)
        );
        assert_eq!(
            failure_action(Some("quiet")),
            AfterFailure::Reboot(REBOOT_DELAY)
        );
        assert_eq!(failure_action(None), AfterFailure::Reboot(REBOOT_DELAY));
    }

    #[test]
    fn module_names_drop_directory_and_extension() {
        assert_eq!(module_name("kernel/fs/squashfs/squashfs.ko"), "squashfs");
        assert_eq!(
            module_name("kernel/drivers/block/virtio_blk.ko.zst"),
            "virtio_blk"
        );
        assert_eq!(module_name("loop.ko"), "loop");
    }

    #[test]
    fn layers_put_extensions_above_the_rootfs_in_manifest_order() {
        let layers = plan_layers(
            Path::new("/rootfs.sqsh"),
            Path::new("/extensions"),
            &["net.sqsh".to_string(), "debug.sqsh".to_string()],
            Path::new("/run/slate/layers"),
        );
        let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["ext-1", "ext-2", "rootfs"]);
        let images: Vec<&Path> = layers.iter().map(|l| l.image.as_path()).collect();
        assert_eq!(
            images,
            [
                "/extensions/net.sqsh",
                "/extensions/debug.sqsh",
                "/rootfs.sqsh"
            ]
        );
        let lowers: Vec<&Path> = layers.iter().map(|l| l.mountpoint.as_path()).collect();
        assert_eq!(
            host::overlay_lowerdir_option(&lowers).unwrap(),
            "lowerdir=/run/slate/layers/ext-1:/run/slate/layers/ext-2:/run/slate/layers/rootfs"
        );
        let alone = plan_layers(Path::new("/r.sqsh"), Path::new("/e"), &[], Path::new("/l"));
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].name, "rootfs");
    }
}
