//! A snapshot root's systemd-boot entries (docs/formats.md §12.2), the ESP writes of the Btrfs
//! snapshot engine: the kernel and initramfs copied to `slate/<snapshot>/` and a Type #1 entry
//! `loader/entries/<snapshot>+<tries>.conf` whose text `slate_snapshot::entry` writes, over the
//! ESP's one session (`slate_esp::session`: temp name, flush, rename, flush). What boots next
//! is answered by `slate-bootspec`'s selection model, as for the UKIs of an A/B disk. Each
//! function checks everything before its first write, and each write order keeps an entry that
//! boots (the crash matrix, `tests/snapshot_crash.rs`).

use slate_bootspec::{
    parse_loader_conf, select, BootState, EfiVars, Entry, EntryKind, EntryName, IdStyle,
    LoaderConf, Type1Entry,
};
use slate_disk::Disk;
use slate_esp::fat::write_file_atomically;
use slate_esp::{session, LOADER_CONF_PATH, UKI_DIR};
use slate_snapshot::entry::{self, ENTRIES_DIR, ESP_SNAPSHOTS_DIR, LOADER_DEFAULT};
use slate_snapshot::{SnapshotError, SnapshotName};

use crate::parts::{esp_err, Result, FAT_EPOCH};

/// systemd-boot's ID style on Debian 12 (252), as slate's systemd-boot backend assumes.
const STYLE: IdStyle = IdStyle::Sd252;

/// One boot entry found on the ESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: EntryName,
    /// A Type #1 entry's keys; `None` for a UKI in `EFI/Linux` (its `.osrel` is not read).
    pub conf: Option<Type1Entry>,
    /// The snapshot a `root-…conf` entry boots.
    pub snapshot: Option<SnapshotName>,
}

/// What is on the ESP: entries in directory order (Type #1, then UKIs) and loader.conf.
#[derive(Debug, Clone, Default)]
pub struct EspScan {
    pub entries: Vec<Found>,
    pub loader_conf: Option<LoaderConf>,
    pub loader_conf_present: bool,
    pub warnings: Vec<String>,
}

impl EspScan {
    /// The entries as systemd-boot's model sees them.
    pub fn model(&self) -> Vec<Entry> {
        self.entries
            .iter()
            .map(|f| match &f.conf {
                Some(c) => c.to_entry(f.name.clone()),
                None => Entry::new(f.name.clone()),
            })
            .collect()
    }

    /// What systemd-boot starts next with no EFI variable set: index into `entries`.
    pub fn selected(&self) -> Option<&Found> {
        let conf = self.loader_conf.clone().unwrap_or_default();
        let sel = select(&self.model(), &conf, &EfiVars::default(), STYLE)?;
        self.entries.get(sel.index)
    }

    /// The entry of `snapshot`, whatever its counter.
    pub fn entry_of(&self, snapshot: &SnapshotName) -> Option<&Found> {
        self.entries
            .iter()
            .find(|f| f.snapshot.as_ref() == Some(snapshot))
    }

    /// The boot state of `snapshot`'s entry, `None` without one.
    pub fn state_of(&self, snapshot: &SnapshotName) -> Option<BootState> {
        self.entry_of(snapshot).map(|f| f.name.state())
    }
}

fn list_dir<T: fatfs::ReadWriteSeek>(fs: &fatfs::FileSystem<T>, path: &str) -> Vec<(String, bool)> {
    let Ok(dir) = fs.root_dir().open_dir(path) else {
        return Vec::new();
    };
    dir.iter()
        .filter_map(|e| e.ok())
        .map(|e| (e.file_name(), e.is_dir()))
        .filter(|(n, _)| n != "." && n != "..")
        .collect()
}

/// Reads the ESP's entries and loader.conf. Unreadable entries are skipped with a warning, as
/// systemd-boot skips them.
pub fn scan<D: Disk>(disk: &D) -> Result<EspScan> {
    let fs = session::mount_read_only(disk)?;
    let mut out = EspScan::default();
    for (dir, kind) in [
        (ENTRIES_DIR, EntryKind::Type1Conf),
        (UKI_DIR, EntryKind::Type2Efi),
    ] {
        for (file, is_dir) in list_dir(&fs, dir) {
            if is_dir || file.starts_with('.') {
                continue;
            }
            let name = match EntryName::parse(&file) {
                Ok(n) if n.kind() == kind => n,
                _ => {
                    out.warnings
                        .push(format!("{dir}/{file}: not a boot entry, ignored"));
                    continue;
                }
            };
            let conf = if kind == EntryKind::Type1Conf {
                let text = session::read(&fs, &format!("{dir}/{file}"))
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok());
                match text.as_deref().map(Type1Entry::parse) {
                    Some(Ok(c)) => Some(c),
                    other => {
                        let why = match other {
                            Some(Err(e)) => e.to_string(),
                            _ => "unreadable".into(),
                        };
                        out.warnings
                            .push(format!("{dir}/{file}: {why}; systemd-boot skips it"));
                        continue;
                    }
                }
            } else {
                None
            };
            let snapshot = entry::entry_snapshot(&name);
            out.entries.push(Found {
                name,
                conf,
                snapshot,
            });
        }
    }
    if let Ok(bytes) = session::read(&fs, LOADER_CONF_PATH) {
        out.loader_conf_present = true;
        match String::from_utf8(bytes)
            .map_err(|e| e.to_string())
            .and_then(|t| parse_loader_conf(&t).map_err(|e| e.to_string()))
        {
            Ok(c) => out.loader_conf = Some(c),
            Err(e) => out.warnings.push(format!("{LOADER_CONF_PATH}: {e}")),
        }
    }
    Ok(out)
}

/// The files under `slate/<snapshot>/` (path, content): what the manifest records of the ESP.
pub fn snapshot_files<D: Disk>(
    disk: &D,
    snapshot: &SnapshotName,
) -> Result<Vec<(String, Vec<u8>)>> {
    let fs = session::mount_read_only(disk)?;
    let dir = entry::esp_dir(snapshot);
    let mut out: Vec<(String, Vec<u8>)> = list_dir(&fs, &dir)
        .into_iter()
        .filter(|(n, d)| !d && !n.starts_with('.'))
        .filter_map(|(n, _)| {
            let path = format!("{dir}/{n}");
            session::read(&fs, &path).ok().map(|b| (path, b))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Step 4 and 6: copies the kernel and initramfs to `slate/<snapshot>/`, writes loader.conf
/// (`default root-*`) if the ESP has none, and last the entry `<snapshot>+<tries>.conf`.
///
/// Checked first, before any write: no entry for the snapshot exists, and with the new entry
/// in place the selection model starts it next — i.e. loader.conf's `default` (unchanged, or
/// the one written here) matches it first. Write order: files (temp name, flush, rename,
/// flush), then loader.conf, then the entry, the one name that makes the snapshot bootable:
/// a cut before it leaves the previous entry booting, with at worst unreferenced copies that
/// the next run's cleanup removes.
pub fn register<D: Disk>(
    disk: &mut D,
    snapshot: &SnapshotName,
    kernel: &[u8],
    initrd: &[u8],
    text: &str,
    tries: u32,
) -> Result<EntryName> {
    let name = entry::entry_name(snapshot, Some(tries))?;
    let parsed =
        Type1Entry::parse(text).map_err(|e| SnapshotError::Invalid(format!("entry text: {e}")))?;
    let before = scan(disk)?;
    check_selects(&before, snapshot, &name, parsed)?;
    let dir = entry::esp_dir(snapshot);
    session::ensure_dirs(
        disk,
        FAT_EPOCH,
        &[ESP_SNAPSHOTS_DIR, &dir, "loader", ENTRIES_DIR],
    )?;
    session::with_esp(disk, FAT_EPOCH, |fs| -> Result<()> {
        write_file_atomically(fs, &entry::kernel_path(snapshot), kernel).map_err(esp_err)?;
        write_file_atomically(fs, &entry::initrd_path(snapshot), initrd).map_err(esp_err)?;
        if !before.loader_conf_present {
            let conf = slate_esp::loader_conf(LOADER_DEFAULT, 3).map_err(esp_err)?;
            write_file_atomically(fs, LOADER_CONF_PATH, conf.as_bytes()).map_err(esp_err)?;
        }
        write_file_atomically(
            fs,
            &format!("{ENTRIES_DIR}/{}", name.file_name()),
            text.as_bytes(),
        )
        .map_err(esp_err)
    })?;
    Ok(name)
}

/// Refuses, before any write, a registration after which the selection model would not start
/// the new entry next (or whose snapshot has an entry already).
fn check_selects(
    before: &EspScan,
    snapshot: &SnapshotName,
    name: &EntryName,
    parsed: Type1Entry,
) -> Result<()> {
    if let Some(found) = before.entry_of(snapshot) {
        return Err(esp_err(format!(
            "{ENTRIES_DIR}/{} already exists",
            found.name.file_name()
        )));
    }
    let mut after = before.clone();
    if !after.loader_conf_present {
        after.loader_conf = Some(LoaderConf {
            default: Some(LOADER_DEFAULT.into()),
            ..LoaderConf::default()
        });
    }
    let uki_matches = after
        .loader_conf
        .as_ref()
        .and_then(|c| c.default.as_deref())
        .is_some_and(|p| {
            after.entries.iter().any(|e| {
                e.conf.is_none()
                    && slate_bootspec::fnmatch(&p.to_ascii_lowercase(), &e.name.id(STYLE))
            })
        });
    after.entries.push(Found {
        name: name.clone(),
        conf: Some(parsed),
        snapshot: Some(snapshot.clone()),
    });
    let conf = after.loader_conf.clone().unwrap_or_default();
    let selection = select(&after.model(), &conf, &EfiVars::default(), STYLE);
    let picks_new = selection
        .as_ref()
        .is_some_and(|sel| after.entries[sel.index].name == *name);
    // A UKI's sort key comes from its .osrel, which is not read here: when nothing matched the
    // default, the model cannot tell whether a UKI would sort first, so it must not be relied on.
    let by_menu_order_over_ukis = selection
        .as_ref()
        .is_some_and(|sel| sel.reason == slate_bootspec::Reason::FirstAutoSelectable)
        && after.entries.iter().any(|e| e.conf.is_none());
    if !picks_new || uki_matches || by_menu_order_over_ukis {
        return Err(esp_err(format!(
            "with loader.conf default {:?}, systemd-boot would not start {} next; set \
             `default {LOADER_DEFAULT}` in {LOADER_CONF_PATH}",
            after
                .loader_conf
                .as_ref()
                .and_then(|c| c.default.clone())
                .unwrap_or_default(),
            name.file_name()
        )));
    }
    Ok(())
}

/// The check [`register`] makes first, made before an upgrade builds anything: an entry for
/// `snapshot` registered now would boot next.
pub fn check_register<D: Disk>(disk: &D, snapshot: &SnapshotName) -> Result<()> {
    let name = entry::entry_name(snapshot, Some(entry::DEFAULT_TRIES))?;
    let placeholder = Type1Entry {
        version: Some(snapshot.to_string()),
        linux: Some(format!("/{}", entry::kernel_path(snapshot))),
        ..Type1Entry::default()
    };
    check_selects(&scan(disk)?, snapshot, &name, placeholder)
}

fn rename<D: Disk>(disk: &mut D, from: &EntryName, to: &EntryName) -> Result<()> {
    session::with_esp(disk, FAT_EPOCH, |fs| -> Result<()> {
        let dir = fs.root_dir().open_dir(ENTRIES_DIR).map_err(esp_err)?;
        dir.rename(from.file_name(), &dir, to.file_name())
            .map_err(|e| {
                esp_err(format!(
                    "renaming {} to {}: {e}",
                    from.file_name(),
                    to.file_name()
                ))
            })?;
        // Flushing the renamed file writes its entry and flushes the disk: the rename is durable.
        dir.open_file(to.file_name())
            .and_then(|mut f| std::io::Write::flush(&mut f))
            .map_err(esp_err)
    })
}

/// Step 8's bless: the entry of `snapshot` loses its counter (`root-X+1-2.conf` →
/// `root-X.conf`), one rename, flushed. `None` when it was already good.
pub fn bless<D: Disk>(disk: &mut D, snapshot: &SnapshotName) -> Result<Option<(String, String)>> {
    let scan = scan(disk)?;
    let found = scan
        .entry_of(snapshot)
        .ok_or_else(|| esp_err(format!("no boot entry for {snapshot}")))?;
    let blessed = found.name.blessed().map_err(esp_err)?;
    if blessed == found.name {
        return Ok(None);
    }
    rename(disk, &found.name, &blessed)?;
    Ok(Some((
        found.name.file_name().to_owned(),
        blessed.file_name().to_owned(),
    )))
}

/// A rollback from `from` to `to`: `to`'s entry gets `tries` fresh attempts (`+3`), then
/// `from`'s is marked bad (`+0`), each rename flushed. After the first, `from` still sorts
/// first (its ID is newer) and boots; after the second, `to` does, on trial. A cut inside a
/// rename leaves that entry nameless: the other one boots.
pub fn rollback<D: Disk>(
    disk: &mut D,
    to: &SnapshotName,
    from: &SnapshotName,
    tries: u32,
) -> Result<(String, String)> {
    let scan = scan(disk)?;
    let to_found = scan
        .entry_of(to)
        .ok_or_else(|| esp_err(format!("no boot entry for {to}")))?
        .name
        .clone();
    let from_found = scan.entry_of(from).map(|f| f.name.clone());
    let to_trial = to_found.with_tries(tries).map_err(esp_err)?;
    let from_bad = from_found
        .as_ref()
        .map(|n| n.marked_bad().map_err(esp_err))
        .transpose()?;
    // Checked before writing: afterwards the model starts `to`.
    let mut after = scan.clone();
    for f in &mut after.entries {
        if f.name == to_found {
            f.name = to_trial.clone();
        } else if Some(&f.name) == from_found.as_ref() {
            f.name = from_bad.clone().expect("from_bad exists with from_found");
        }
    }
    if after.selected().map(|f| &f.name) != Some(&to_trial) {
        return Err(esp_err(format!(
            "after the renames systemd-boot would not start {}",
            to_trial.file_name()
        )));
    }
    if to_trial != to_found {
        rename(disk, &to_found, &to_trial)?;
    }
    if let (Some(from_name), Some(bad)) = (&from_found, &from_bad) {
        if from_name != bad {
            rename(disk, from_name, bad)?;
        }
    }
    Ok((
        to_trial.file_name().to_owned(),
        from_bad
            .map(|n| n.file_name().to_owned())
            .unwrap_or_default(),
    ))
}

/// Removes everything of `snapshot` from the ESP: the entry first (from then on nothing refers
/// to the copies), then `slate/<snapshot>/` and its files. Absent parts are fine (cleanup after
/// a cut). Refused when the entry is what boots next: pruning must never remove it.
pub fn remove<D: Disk>(disk: &mut D, snapshot: &SnapshotName) -> Result<()> {
    let scan = scan(disk)?;
    if let Some(found) = scan.entry_of(snapshot) {
        if scan.selected().map(|f| &f.name) == Some(&found.name) {
            return Err(esp_err(format!(
                "{} is the entry that boots next; not removed",
                found.name.file_name()
            )));
        }
    }
    let entry = scan
        .entry_of(snapshot)
        .map(|f| f.name.file_name().to_owned());
    if let Some(file) = &entry {
        // Its own mount and flush: durable before the copies go, so a cut never leaves an
        // entry without its kernel.
        session::with_esp(disk, FAT_EPOCH, |fs| -> Result<()> {
            fs.root_dir()
                .remove(&format!("{ENTRIES_DIR}/{file}"))
                .map_err(esp_err)
        })?;
    }
    let dir = entry::esp_dir(snapshot);
    session::with_esp(disk, FAT_EPOCH, |fs| -> Result<()> {
        let root = fs.root_dir();
        for (name, _) in list_dir(fs, &dir) {
            root.remove(&format!("{dir}/{name}")).map_err(esp_err)?;
        }
        match root.remove(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(esp_err(e)),
            _ => Ok(()),
        }
    })
}

/// What systemd-boot does before starting its default entry: a counted entry is renamed
/// `+L-D` → `+(L-1)-(D+1)`, flushed. Returns the file name it starts. For tests and dry runs;
/// on a machine the loader does this.
pub fn simulate_boot_attempt<D: Disk>(disk: &mut D) -> Result<Option<String>> {
    let scan = scan(disk)?;
    let Some(found) = scan.selected() else {
        return Ok(None);
    };
    let next = found.name.after_boot_attempt().map_err(esp_err)?;
    if next != found.name {
        let from = found.name.clone();
        rename(disk, &from, &next)?;
    }
    Ok(Some(next.file_name().to_owned()))
}
