#![allow(dead_code)] // each test binary uses a part
//! What the imager's tests share: the smallest profile a rootfs build accepts (its inputs are
//! made up; a rootfs build reads only `[rootfs] base`), and resolving `dir/profile.toml` for one.

use std::path::Path;

use slate_imager::{ImagerError, Inputs, OutputKind};

pub const BASE_PROFILE: &str = r#"name = "slate"
version = "1.0.0"
arch = "amd64"
platform = "qemu"
[kernel]
image = "vmlinuz"
modules_dir = "modules"
[rootfs]
base = "rootfs"
zstd_level = 3
[boot]
stub = "stub.efi"
systemd_boot = "sd.efi"
slate = "slate"
"#;

/// `dir/profile.toml` resolved for a rootfs build at a fixed `SOURCE_DATE_EPOCH`.
pub fn resolve_rootfs(dir: &Path) -> Result<Inputs, ImagerError> {
    resolve(dir, OutputKind::Rootfs, 1_700_000_000)
}

/// `dir/profile.toml` resolved for a build of `kind` at `source_date_epoch`.
pub fn resolve(
    dir: &Path,
    kind: OutputKind,
    source_date_epoch: u64,
) -> Result<Inputs, ImagerError> {
    Inputs::resolve(
        &dir.join("profile.toml"),
        None,
        &[],
        kind,
        source_date_epoch,
    )
}
