//! The boot entry of a snapshot (docs/formats.md §12.2): where its kernel and initramfs are
//! copied on the ESP, the Type #1 entry's file name with its boot counter, and its text.

use slate_bootspec::{EntryKind, EntryName};

use crate::{SnapshotError, SnapshotName};

/// Directory of Type #1 entries on the ESP.
pub const ENTRIES_DIR: &str = "loader/entries";
/// Parent of every snapshot's kernel copies on the ESP: `slate/<snapshot>/`.
pub const ESP_SNAPSHOTS_DIR: &str = "slate";
pub const KERNEL_FILE: &str = "vmlinuz";
pub const INITRD_FILE: &str = "initrd.img";
/// The loader.conf `default` slate writes when the ESP has none: the first entry in menu order
/// whose ID starts `root-`, i.e. the newest snapshot entry that is not bad.
pub const LOADER_DEFAULT: &str = "root-*";
/// Boot attempts a new entry gets before systemd-boot marks it bad.
pub const DEFAULT_TRIES: u32 = 3;

/// `slate/<snapshot>`.
pub fn esp_dir(snapshot: &SnapshotName) -> String {
    format!("{ESP_SNAPSHOTS_DIR}/{snapshot}")
}

/// `slate/<snapshot>/vmlinuz`.
pub fn kernel_path(snapshot: &SnapshotName) -> String {
    format!("{}/{KERNEL_FILE}", esp_dir(snapshot))
}

/// `slate/<snapshot>/initrd.img`.
pub fn initrd_path(snapshot: &SnapshotName) -> String {
    format!("{}/{INITRD_FILE}", esp_dir(snapshot))
}

/// `<snapshot>[+<tries>].conf`, checked by the boot-counting name rules.
pub fn entry_name(snapshot: &SnapshotName, tries: Option<u32>) -> Result<EntryName, SnapshotError> {
    let file = match tries {
        Some(0) => {
            return Err(SnapshotError::Invalid(
                "a new entry with 0 tries would start out bad".into(),
            ))
        }
        Some(t) => format!("{snapshot}+{t}.conf"),
        None => format!("{snapshot}.conf"),
    };
    let name =
        EntryName::parse(&file).map_err(|e| SnapshotError::Invalid(format!("{file}: {e}")))?;
    debug_assert_eq!(name.kind(), EntryKind::Type1Conf);
    Ok(name)
}

/// The snapshot an entry file name belongs to (`root-…[+L[-D]].conf`), if any.
pub fn entry_snapshot(name: &EntryName) -> Option<SnapshotName> {
    if name.kind() != EntryKind::Type1Conf {
        return None;
    }
    SnapshotName::parse(name.stem()).ok()
}

/// What a snapshot's entry says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySpec {
    pub snapshot: SnapshotName,
    /// The Btrfs pool's file system UUID (`root=UUID=`).
    pub pool_uuid: String,
    /// The OS name in the title (`PRETTY_NAME` of the snapshot's os-release, or "Linux").
    pub os_name: String,
    /// Options carried over from the running entry, root options removed ([`carried_options`]).
    pub extra_options: Vec<String>,
}

/// Kernel options that name the root and so are written per snapshot, never carried over; and
/// options boot loaders add themselves.
fn is_root_option(option: &str) -> bool {
    let key = option.split_once('=').map_or(option, |(k, _)| k);
    matches!(
        key,
        "root" | "rootflags" | "rootfstype" | "rw" | "ro" | "BOOT_IMAGE" | "initrd" | "slate.entry"
    )
}

/// The running command line's options minus those that name the root: what a new entry
/// carries over (console, quiet, module options…).
pub fn carried_options(cmdline: &str) -> Vec<String> {
    cmdline
        .split_ascii_whitespace()
        .filter(|o| !is_root_option(o))
        .map(str::to_owned)
        .collect()
}

/// `root=UUID=<pool> rootflags=subvol=<snapshot> rootfstype=btrfs rw`.
pub fn root_options(pool_uuid: &str, snapshot: &SnapshotName) -> String {
    format!("root=UUID={pool_uuid} rootflags=subvol={snapshot} rootfstype=btrfs rw")
}

/// The entry text (`title`, `version`, `linux`, `initrd`, `options`). No `sort-key`: entries
/// then sort by ID, newest snapshot first, like slate's UKIs (docs/formats.md §2.6).
pub fn entry_text(spec: &EntrySpec) -> Result<String, SnapshotError> {
    let uuid_ok = !spec.pool_uuid.is_empty()
        && spec
            .pool_uuid
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == '-');
    if !uuid_ok {
        return Err(SnapshotError::Invalid(format!(
            "pool UUID {:?} is not a UUID",
            spec.pool_uuid
        )));
    }
    let printable = |s: &str| s.chars().all(|c| !c.is_control());
    if !printable(&spec.os_name) || spec.os_name.trim().is_empty() {
        return Err(SnapshotError::Invalid(format!(
            "OS name {:?} is empty or has control characters",
            spec.os_name
        )));
    }
    if let Some(bad) = spec
        .extra_options
        .iter()
        .find(|o| o.is_empty() || o.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(SnapshotError::Invalid(format!(
            "kernel option {bad:?} is empty or has spaces or control characters"
        )));
    }
    let mut options = root_options(&spec.pool_uuid, &spec.snapshot);
    for o in &spec.extra_options {
        options.push(' ');
        options.push_str(o);
    }
    let snap = &spec.snapshot;
    Ok(format!(
        "title {} {} ({snap})\nversion {snap}\nlinux /{}\ninitrd /{}\noptions {options}\n",
        spec.os_name.trim(),
        snap.display_time(),
        kernel_path(snap),
        initrd_path(snap),
    ))
}

#[cfg(test)]
mod tests {
    use slate_bootspec::Type1Entry;

    use super::*;

    #[test]
    fn entry_text_round_trips_through_the_model() {
        let snapshot = SnapshotName::parse("root-20260628-093000").unwrap();
        let spec = EntrySpec {
            snapshot: snapshot.clone(),
            pool_uuid: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
            os_name: "Debian GNU/Linux 12".into(),
            extra_options: carried_options(
                "BOOT_IMAGE=/x root=UUID=a rootflags=subvol=root-1 ro quiet console=ttyS0",
            ),
        };
        let text = entry_text(&spec).unwrap();
        assert_eq!(
            text,
            "title Debian GNU/Linux 12 2026-06-28 09:30:00 (root-20260628-093000)\n\
             version root-20260628-093000\n\
             linux /slate/root-20260628-093000/vmlinuz\n\
             initrd /slate/root-20260628-093000/initrd.img\n\
             options root=UUID=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0 \
             rootflags=subvol=root-20260628-093000 rootfstype=btrfs rw quiet console=ttyS0\n"
        );
        let parsed = Type1Entry::parse(&text).unwrap();
        assert_eq!(
            parsed.linux.as_deref(),
            Some("/slate/root-20260628-093000/vmlinuz")
        );
        let name = entry_name(&snapshot, Some(3)).unwrap();
        assert_eq!(name.file_name(), "root-20260628-093000+3.conf");
        assert_eq!(entry_snapshot(&name), Some(snapshot));
        assert!(entry_text(&EntrySpec {
            pool_uuid: "x y".into(),
            ..spec.clone()
        })
        .is_err());
        assert!(entry_text(&EntrySpec {
            extra_options: vec!["a\nb".into()],
            ..spec
        })
        .is_err());
    }
}
