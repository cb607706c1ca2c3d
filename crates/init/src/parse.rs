//! init's pure decisions, apart from its syscalls: what to do after a failure, which program
//! to execute, the module list, the extensions manifest and the order of the root's layers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Result};
use slate_host as host;

use crate::{DEFAULT_INIT, MANIFEST, REBOOT_DELAY};

/// What PID 1 does after a failed boot: exiting would panic the kernel, hiding the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureAction {
    /// `panic=0`: the operator asked the machine to stay put after a failure.
    Halt,
    /// Reboot after showing the message, so the firmware's boot counting can pick a fallback.
    Reboot(Duration),
}

pub(crate) fn failure_action(cmdline: Option<&str>) -> FailureAction {
    match cmdline.and_then(|c| host::cmdline_value(c, "panic")) {
        Some("0") => FailureAction::Halt,
        _ => FailureAction::Reboot(REBOOT_DELAY),
    }
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

/// The module paths of `modules.load`, in order: one path relative to
/// `/lib/modules/<release>/` per line; blank lines and `#` comments are skipped.
pub(crate) fn parse_modules_load(text: &str) -> Result<Vec<&str>> {
    let mut modules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let path = Path::new(line);
        let escapes = path
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)));
        ensure!(
            !escapes,
            "line {}: {line:?} must be a plain path relative to /lib/modules/<release>/",
            i + 1
        );
        modules.push(line);
    }
    Ok(modules)
}

/// `kernel/fs/squashfs/squashfs.ko[.xz]` -> `squashfs`.
pub(crate) fn module_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.find(".ko").map_or(file, |end| &file[..end])
}

/// Extension file names, one per line, topmost first; blank lines and `#` comments skipped.
pub(crate) fn parse_manifest(text: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let name = line.trim();
        if name.is_empty() || name.starts_with('#') {
            continue;
        }
        let line_no = i + 1;
        ensure!(
            !name.contains('/') && name != "." && name != ".." && name != MANIFEST,
            "line {line_no}: {name:?} is not a file name in the extensions directory"
        );
        ensure!(
            !names.iter().any(|n| n == name),
            "line {line_no}: {name} is listed twice"
        );
        names.push(name.to_string());
    }
    Ok(names)
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

    #[test]
    fn init_program_defaults_and_must_be_absolute() {
        assert_eq!(init_program("console=ttyS0").unwrap(), "/sbin/init");
        assert_eq!(init_program("slate.init=").unwrap(), "/sbin/init");
        assert_eq!(init_program("slate.init=/bin/sh quiet").unwrap(), "/bin/sh");
        let err = init_program("slate.init=sh").unwrap_err();
        assert_eq!(err.to_string(), "slate.init=sh is not an absolute path");
    }

    #[test]
    fn only_panic_zero_halts() {
        assert_eq!(
            failure_action(Some("console=ttyS0 panic=0")),
            FailureAction::Halt
        );
        assert_eq!(
            failure_action(Some("panic=0 panic=5")),
            FailureAction::Reboot(REBOOT_DELAY)
        );
        assert_eq!(
            failure_action(Some("panic=-1")),
            FailureAction::Reboot(REBOOT_DELAY)
        );
        assert_eq!(
            failure_action(Some("quiet")),
            FailureAction::Reboot(REBOOT_DELAY)
        );
        assert_eq!(failure_action(None), FailureAction::Reboot(REBOOT_DELAY));
    }

    #[test]
    fn modules_load_keeps_order_and_skips_comments() {
        let text = "# generated by slate imager\n\
                    kernel/drivers/block/loop.ko\n\n  kernel/fs/squashfs/squashfs.ko  \n\
                    kernel/fs/overlayfs/overlay.ko.xz\n";
        assert_eq!(
            parse_modules_load(text).unwrap(),
            [
                "kernel/drivers/block/loop.ko",
                "kernel/fs/squashfs/squashfs.ko",
                "kernel/fs/overlayfs/overlay.ko.xz"
            ]
        );
        assert!(parse_modules_load("").unwrap().is_empty());
    }

    #[test]
    fn modules_load_refuses_paths_leaving_the_release_dir() {
        for bad in ["/lib/modules/x.ko", "kernel/../../x.ko", "./x.ko"] {
            let err = parse_modules_load(&format!("a.ko\n{bad}\n")).unwrap_err();
            assert!(err.to_string().starts_with("line 2: "), "{err}");
        }
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
    fn manifest_names_are_plain_and_unique() {
        let text = "# topmost first\nnet.sqsh\n\ndebug.sqsh\n";
        assert_eq!(parse_manifest(text).unwrap(), ["net.sqsh", "debug.sqsh"]);
        assert!(parse_manifest("a.sqsh\na.sqsh\n").is_err());
        assert!(parse_manifest("../rootfs.sqsh\n").is_err());
        assert!(parse_manifest("manifest\n").is_err());
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
