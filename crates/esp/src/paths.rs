//! Where slate's files live on the ESP, for both boot loaders (docs/formats.md §2, §4).

/// The removable-media path firmware boots without any boot entry in NVRAM: systemd-boot, or
/// GRUB on a GRUB disk.
pub const FALLBACK_LOADER_PATH: &str = "EFI/BOOT/BOOTX64.EFI";
/// systemd's own path for systemd-boot, which `bootctl` recognises and updates.
pub const SYSTEMD_BOOT_PATH: &str = "EFI/systemd/systemd-bootx64.efi";
/// Directory of Type #2 (UKI) boot entries.
pub const UKI_DIR: &str = "EFI/Linux";
pub const LOADER_CONF_PATH: &str = "loader/loader.conf";
/// The directories of a systemd-boot ESP, parents first.
pub const SYSTEMD_BOOT_DIRECTORIES: [&str; 5] =
    ["EFI", "EFI/BOOT", "EFI/systemd", UKI_DIR, "loader"];

/// The GRUB directory on the ESP (`$prefix`).
pub const GRUB_DIR: &str = "grub";
pub const GRUB_CFG_PATH: &str = "grub/grub.cfg";
pub const GRUBENV_PATH: &str = "grub/grubenv";
/// slate's second record of the committed slot: a 1024-byte environment block holding only
/// `saved_entry`, which `grub.cfg` reads when `grubenv` names no slot (docs/formats.md §4.3).
/// GRUB never writes it.
pub const GRUB_DEFAULT_ENV_PATH: &str = "grub/slate-default.env";
/// The two slots, in menu order (the first is what GRUB boots when nothing names an entry).
pub const GRUB_SLOTS: [&str; 2] = ["A", "B"];
pub const SLOT_KERNEL: &str = "vmlinuz";
pub const SLOT_INITRAMFS: &str = "initramfs";
pub const SLOT_CMDLINE: &str = "cmdline.cfg";
/// The directories of a GRUB ESP, parents first.
pub const GRUB_DIRECTORIES: [&str; 5] = ["EFI", "EFI/BOOT", GRUB_DIR, "A", "B"];

/// Where systemd-boot looks for Secure Boot keys to enrol (`PK.auth`, `KEK.auth`, `db.auth`) when
/// the firmware is in setup mode and `loader.conf` says `secure-boot-enroll force`.
pub const SECURE_BOOT_KEYS_DIR: &str = "loader/keys/auto";
/// The enrolment files, in the order the firmware needs them (db and KEK before PK, whose
/// enrolment ends setup mode; systemd-boot orders them itself, the list is for the writer).
pub const SECURE_BOOT_AUTH_FILES: [&str; 3] = ["db.auth", "KEK.auth", "PK.auth"];
/// The ESP's `db.auth`: the certificates a Secure Boot image enrols and its firmware then trusts.
pub const SECURE_BOOT_DB_AUTH_PATH: &str = "loader/keys/auto/db.auth";
/// The directories of a Secure Boot systemd-boot ESP beyond [`SYSTEMD_BOOT_DIRECTORIES`].
pub const SECURE_BOOT_DIRECTORIES: [&str; 2] = ["loader/keys", SECURE_BOOT_KEYS_DIR];
/// The `loader.conf` line that makes systemd-boot enrol the keys in setup mode.
pub const SECURE_BOOT_ENROLL_LINE: &str = "secure-boot-enroll force\n";
