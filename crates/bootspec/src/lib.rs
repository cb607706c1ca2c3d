//! slate's own reading of systemd-boot's rules (docs/formats.md §2): which UKI boots, under which
//! name, after which rename. Pure functions over values; no I/O. VM tests check these
//! predictions against the real loader.
//!
//! - [`compare_versions`]: UAPI.10 version order, as `systemd-analyze compare-versions`.
//! - [`EntryName`]: BLS file names with boot counters (`slate-1.2+3.efi`), the renames
//!   systemd-boot (`+2-1`) and systemd-bless-boot (good / bad) perform, and entry IDs in the
//!   two [`IdStyle`]s systemd-boot has used.
//! - [`parse_loader_conf`], [`OsRelease`], [`EfiVars`]: the inputs to default selection;
//!   [`Type1Entry`]: a `loader/entries/*.conf` entry's keys.
//! - [`sorted`] and [`select`]: the menu order and the entry booted by default.
//! - [`newest_not_bad`] and [`prune_candidates`]: the update policy (boot the newest version
//!   not marked bad; never delete the running version).
//! - [`GrubEnv`]: GRUB's 1024-byte environment block (docs/formats.md §4), checked against
//!   `grub-editenv`; [`grub_select`]: which menu entry GRUB boots (`next_entry` one shot,
//!   `saved_entry`, the first entry).
//! - [`plan_boot_options`]: the firmware's `Boot####` options and `BootOrder` (docs/formats.md
//!   §2.9), read and written as bytes, so that a loader that returns with an error is started
//!   again.
//!
//! Where systemd-boot versions differ, the model follows current systemd-boot and names the
//! Debian 12 (252) difference: entry IDs ([`IdStyle`]), counters above `INT_MAX`, and
//! `timeout menu-disabled`.

mod conf;
mod efivars;
mod error;
mod glob;
mod grub_select;
mod grubenv;
mod load_option;
mod name;
mod policy;
mod select;
mod type1;
mod version;

pub use conf::{parse_loader_conf, LoaderConf, OsRelease, Timeout};
pub use efivars::{
    decode_efivar_string, efivarfs_name, encode_efivar_string, EfiVars, LOADER_GUID,
    LOADER_VAR_ATTRIBUTES,
};
pub use error::{EfiVarError, LoaderConfError, NameError, Type1Error};
pub use glob::fnmatch;
pub use grub_select::{
    grub_entry_index, grub_select, grub_select_with_record, GrubMenuEntry, GrubReason,
    GrubSelection,
};
pub use grubenv::{
    check_grubenv_name, GrubEnv, GrubEnvError, GRUBENV_LEN, GRUBENV_SIGNATURE, GRUBENV_WARNING,
};
pub use load_option::{
    boot_var_name, build_boot_order, build_load_option, loader_device_path, parse_boot_order,
    parse_boot_var_name, parse_load_option, plan_boot_options, slate_description, BootOptionsPlan,
    LoadOption, LoadOptionError, LoaderLocation, BOOT_VAR_ATTRIBUTES, EFI_GLOBAL_GUID,
    LOAD_OPTION_ACTIVE, MAX_LOAD_OPTION_LEN, SLATE_OPTION_PREFIX,
};
pub use name::{
    check_install_tries, BootCounter, BootState, EntryKind, EntryName, IdStyle, InstallTriesError,
    DEFAULT_INSTALL_TRIES, INSTALL_TRIES, MAX_NAME_LEN, MAX_TRIES,
};
pub use policy::{newest_not_bad, prune_candidates, refers_to};
pub use select::{compare_entries, menu_ids, select, sorted, Entry, Reason, Selection};
pub use type1::{Type1Entry, MAX_TYPE1_LEN};
pub use version::compare_versions;

/// The menu timeouts, in seconds, slate writes into `loader.conf` (systemd-boot) and `grub.cfg`
/// (GRUB): profile `[image] menu_timeout` and a bundle's install settings.
///
/// Finite and short, so an unattended machine always boots on its own: systemd-boot reads
/// `4294967295` as `menu-force` (show the menu and wait for a key, forever) and `4294967294` as
/// "unset"; GRUB waits as long as it is told. 0 boots at once (menu on a key press); 600 s (ten
/// minutes) is more than anyone at a console needs to pick an entry.
pub const MENU_TIMEOUT_SECS: std::ops::RangeInclusive<u32> = 0..=600;
