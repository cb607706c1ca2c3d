//! What a fresh systemd-boot image holds on its ESP (the installer lays it down).

use slate_esp::{
    FALLBACK_LOADER_PATH, LOADER_CONF_PATH, SECURE_BOOT_AUTH_FILES, SECURE_BOOT_KEYS_DIR,
    SYSTEMD_BOOT_PATH, UKI_DIR,
};

/// The Secure Boot keys a fresh image enrols at its first boot: the signed variable payloads
/// `PK.auth`, `KEK.auth` and `db.auth` (docs/formats.md §11.4).
#[derive(Clone, PartialEq, Eq)]
pub struct EnrollKeys {
    pub pk: Vec<u8>,
    pub kek: Vec<u8>,
    pub db: Vec<u8>,
}

impl std::fmt::Debug for EnrollKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EnrollKeys {{ PK.auth: {} bytes, KEK.auth: {} bytes, db.auth: {} bytes }}",
            self.pk.len(),
            self.kek.len(),
            self.db.len()
        )
    }
}

impl EnrollKeys {
    /// `(file name, content)` in [`SECURE_BOOT_AUTH_FILES`] order.
    fn files(&self) -> [(&'static str, &[u8]); 3] {
        let [db, kek, pk] = SECURE_BOOT_AUTH_FILES;
        [(db, &self.db), (kek, &self.kek), (pk, &self.pk)]
    }
}

/// The ESP files of a fresh systemd-boot image, in write order: systemd-boot at the removable
/// path and at its own, the one UKI, the Secure Boot enrolment files if any, then `loader.conf`
/// (docs/formats.md §2).
pub fn image_files<'a>(
    systemd_boot: &'a [u8],
    uki_name: &str,
    uki: &'a [u8],
    enroll: Option<&'a EnrollKeys>,
    loader_conf: &'a str,
) -> Vec<(String, &'a [u8])> {
    let mut files = vec![
        (FALLBACK_LOADER_PATH.to_string(), systemd_boot),
        (SYSTEMD_BOOT_PATH.to_string(), systemd_boot),
        (format!("{UKI_DIR}/{uki_name}"), uki),
    ];
    for (name, bytes) in enroll.iter().flat_map(|k| k.files()) {
        files.push((format!("{SECURE_BOOT_KEYS_DIR}/{name}"), bytes));
    }
    files.push((LOADER_CONF_PATH.to_string(), loader_conf.as_bytes()));
    files
}
