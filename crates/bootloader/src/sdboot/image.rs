//! What a fresh systemd-boot image holds on its ESP (the installer lays it down).

use slate_esp::{FALLBACK_LOADER_PATH, LOADER_CONF_PATH, SYSTEMD_BOOT_PATH, UKI_DIR};

/// The ESP files of a fresh systemd-boot image, in write order: systemd-boot at the removable
/// path and at its own, the one UKI, then `loader.conf` (docs/formats.md §2).
pub fn image_files<'a>(
    systemd_boot: &'a [u8],
    uki_name: &str,
    uki: &'a [u8],
    loader_conf: &'a str,
) -> Vec<(String, &'a [u8])> {
    vec![
        (FALLBACK_LOADER_PATH.to_string(), systemd_boot),
        (SYSTEMD_BOOT_PATH.to_string(), systemd_boot),
        (format!("{UKI_DIR}/{uki_name}"), uki),
        (LOADER_CONF_PATH.to_string(), loader_conf.as_bytes()),
    ]
}
