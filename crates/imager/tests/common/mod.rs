//! What the imager's tests share: the smallest profile a rootfs build accepts (its inputs are
//! made up; a rootfs build reads only `[rootfs] base`).

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
