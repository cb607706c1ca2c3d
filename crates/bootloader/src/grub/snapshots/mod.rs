//! GRUB on a snapshot root (docs/formats.md §12.9): the Btrfs snapshot engine's ESP writes.
//! `grub/grub.cfg` is constant; the menu `grub/snapshots.cfg` ([`menu`]) gains an entry when a
//! snapshot is registered and loses it when one is pruned (temp name, flush, rename, flush);
//! the environment block `grub/grubenv` chooses: `next_entry` (a one-shot GRUB consumes before
//! the entry starts) for a new snapshot's trial, `saved_entry` for the permanent default, which
//! is also `fallback`. slate's second record `grub/slate-default.env` (as on an A/B GRUB disk,
//! §4.3) repeats `saved_entry` for a grubenv GRUB cannot load.
//!
//! Both environment blocks are rewritten in place by the A/B backend's writer (GRUB's `save_env`
//! writes grubenv through the block list it found). What boots next is
//! `slate_bootspec::grub_select_with_record` over the menu and the blocks; each writer checks
//! everything first, and the crash matrix (`tests/snapshot_crash.rs`) replays each write order.

pub mod menu;

use slate_bootspec::{grub_select_with_record, BootState, GrubEnv, GrubMenuEntry, GrubSelection};
use slate_disk::Disk;
use slate_esp::fat::write_file_atomically;
use slate_esp::{session, GRUBENV_PATH, GRUB_CFG_PATH, GRUB_DEFAULT_ENV_PATH, GRUB_DIR};
use slate_snapshot::SnapshotName;

use super::config::default_record;
use super::write_block;
use crate::parts::{esp_err, Result, FAT_EPOCH};
use menu::{
    grub_cfg, parse_menu, render_menu, MenuEntry, GRUB_CFG_MARKER, MENU_PATH, MENU_TEMP_PATH,
};

/// What the engine records of a snapshot on a GRUB root, beside its manifest (GRUB has no
/// "bad" mark of its own; docs/formats.md §12.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Put on a one-shot trial and not committed since.
    Trial,
    /// Rolled back from.
    Bad,
}

/// The GRUB side of the ESP, read in one pass.
#[derive(Debug, Clone)]
pub struct GrubScan {
    /// The menu, newest first (its order in `snapshots.cfg`).
    pub entries: Vec<MenuEntry>,
    /// grubenv; `None` when slate's reader refuses it ([`Self::env_error`]).
    pub env: Option<GrubEnv>,
    pub env_error: Option<String>,
    /// The second record, when present and readable.
    pub record: Option<GrubEnv>,
    pub record_present: bool,
    /// What GRUB does on the next boot.
    pub selection: Option<GrubSelection>,
    pub warnings: Vec<String>,
}

impl GrubScan {
    fn menu(entries: &[MenuEntry]) -> Vec<GrubMenuEntry> {
        entries
            .iter()
            .map(|e| GrubMenuEntry {
                title: e.title.clone(),
                id: e.snapshot.to_string(),
            })
            .collect()
    }

    fn select(&mut self) {
        self.selection = grub_select_with_record(
            self.env.as_ref(),
            self.record.as_ref(),
            &Self::menu(&self.entries),
        );
    }

    pub fn entry_of(&self, snapshot: &SnapshotName) -> Option<&MenuEntry> {
        self.entries.iter().find(|e| &e.snapshot == snapshot)
    }

    /// The entry GRUB starts next.
    pub fn selected(&self) -> Option<&MenuEntry> {
        self.entries.get(self.selection.as_ref()?.index)
    }

    /// The entry GRUB falls back to (`saved_entry`, from grubenv or the record): the
    /// permanent default.
    pub fn saved(&self) -> Option<&MenuEntry> {
        self.entries.get(self.selection.as_ref()?.fallback?)
    }

    /// The snapshot grubenv's one-shot `next_entry` names, if it names an entry.
    pub fn next_entry(&self) -> Option<&MenuEntry> {
        let next = self.env.as_ref()?.get_nonempty("next_entry")?;
        self.entries.iter().find(|e| e.snapshot.as_str() == next)
    }

    /// The state `list`, prune and the fallback see (docs/formats.md §12.9): the saved default
    /// is good; the one-shot's snapshot, and a marked trial while it runs, are on trial; a
    /// trial that is no longer the one-shot and not running ended without a commit, and a
    /// snapshot rolled back from is bad; any other entry was committed once and is good.
    /// `None` without a menu entry.
    pub fn state_of(
        &self,
        snapshot: &SnapshotName,
        running: Option<&SnapshotName>,
        mark: Option<Mark>,
    ) -> Option<BootState> {
        self.entry_of(snapshot)?;
        let is = |e: Option<&MenuEntry>| e.is_some_and(|e| &e.snapshot == snapshot);
        Some(if is(self.saved()) {
            BootState::Good
        } else if is(self.next_entry()) {
            BootState::Indeterminate
        } else {
            match mark {
                Some(Mark::Bad) => BootState::Bad,
                Some(Mark::Trial) if running == Some(snapshot) => BootState::Indeterminate,
                Some(Mark::Trial) => BootState::Bad,
                None => BootState::Good,
            }
        })
    }

    /// grubenv, if slate may write: refused while it is unreadable (it is rewritten in place
    /// and edited line by line; slate would not guess what it held).
    fn writable(&self) -> Result<&GrubEnv> {
        self.env.as_ref().ok_or_else(|| {
            esp_err(format!(
                "{GRUBENV_PATH}: {}; slate writes nothing to the boot loader until it is \
                 repaired",
                self.env_error.as_deref().unwrap_or("unreadable")
            ))
        })
    }

    /// The scan as it would be with `env` written (and `entries` as the menu).
    fn with(&self, env: &GrubEnv, entries: Vec<MenuEntry>) -> GrubScan {
        let mut after = self.clone();
        after.env = Some(env.clone());
        after.entries = entries;
        after.select();
        after
    }
}

/// Whether the ESP carries slate's GRUB layout for snapshot roots: `grub/grub.cfg` present
/// and starting with [`GRUB_CFG_MARKER`]. Absent: `false` (systemd-boot). Another `grub.cfg`
/// (an A/B GRUB disk, a distribution's) is refused: the engine would not know its menu.
pub fn is_grub_layout<D: Disk>(disk: &D) -> Result<bool> {
    let fs = session::mount_read_only(disk)?;
    match session::read(&fs, GRUB_CFG_PATH).ok() {
        None => Ok(false),
        Some(cfg) if cfg.starts_with(GRUB_CFG_MARKER.as_bytes()) => Ok(true),
        Some(_) => Err(esp_err(format!(
            "{GRUB_CFG_PATH} is not slate's GRUB configuration for snapshot roots (an A/B \
             GRUB disk?): the snapshot engine does not know its menu"
        ))),
    }
}

/// Reads the menu (or, when a cut left only it, its complete temp file), grubenv and the
/// second record. A menu not in slate's form is an error; an unreadable grubenv is recorded
/// (GRUB then loads nothing from it) and refuses every write.
pub fn scan<D: Disk>(disk: &D) -> Result<GrubScan> {
    let fs = session::mount_read_only(disk)?;
    // As grub.cfg: the menu unless its last line is missing, then the temp file.
    let read_menu = |path: &str| -> Option<Result<Vec<MenuEntry>>> {
        let bytes = session::read(&fs, path).ok()?;
        Some(
            String::from_utf8(bytes)
                .map_err(|_| esp_err(format!("{path}: not UTF-8")))
                .and_then(|t| parse_menu(&t).map_err(Into::into)),
        )
    };
    let entries = match read_menu(MENU_PATH) {
        Some(Ok(entries)) => entries,
        first => match read_menu(MENU_TEMP_PATH) {
            Some(Ok(entries)) => entries,
            temp => {
                return Err(match (first, temp) {
                    (Some(Err(e)), _) | (_, Some(Err(e))) => e,
                    _ => esp_err(format!("{MENU_PATH} is missing")),
                })
            }
        },
    };
    let mut warnings = Vec::new();
    let (env, env_error) = match session::read(&fs, GRUBENV_PATH)
        .ok()
        .map(|b| GrubEnv::parse(&b))
    {
        Some(Ok(env)) => (Some(env), None),
        Some(Err(e)) => (None, Some(e.to_string())),
        None => (None, Some("missing".to_owned())),
    };
    if let Some(e) = &env_error {
        warnings.push(format!("{GRUBENV_PATH}: {e}"));
    }
    let record_bytes = session::read(&fs, GRUB_DEFAULT_ENV_PATH).ok();
    let record_present = record_bytes.is_some();
    let record = match record_bytes.map(|b| GrubEnv::parse(&b)) {
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => {
            warnings.push(format!("{GRUB_DEFAULT_ENV_PATH}: {e}"));
            None
        }
        None => None,
    };
    let mut scan = GrubScan {
        entries,
        env,
        env_error,
        record,
        record_present,
        selection: None,
        warnings,
    };
    scan.select();
    Ok(scan)
}

fn write_menu<D: Disk>(disk: &mut D, entries: &[MenuEntry]) -> Result<()> {
    let text = render_menu(entries);
    session::with_esp(disk, FAT_EPOCH, |fs| {
        write_file_atomically(fs, MENU_PATH, text.as_bytes()).map_err(esp_err)
    })
}

/// The second record rewritten to name `snapshot`, when it is present and names another.
fn sync_record<D: Disk>(disk: &mut D, scan: &GrubScan, snapshot: &SnapshotName) -> Result<()> {
    let names = scan
        .record
        .as_ref()
        .and_then(|r| r.get("saved_entry"))
        .is_some_and(|s| s == snapshot.as_str());
    if scan.record_present && !names {
        write_block(
            disk,
            FAT_EPOCH,
            GRUB_DEFAULT_ENV_PATH,
            &default_record(snapshot.as_str()),
        )?;
    }
    Ok(())
}

/// The GRUB files of a new image's ESP, after its GRUB EFI binary: `grub/grub.cfg`, the menu
/// with `first`, grubenv and the record both `saved_entry=<first>`. The disk's ESP must be
/// formatted; `grub/` is created.
pub fn lay_down<D: Disk>(disk: &mut D, menu_timeout: u32, first: &MenuEntry) -> Result<()> {
    let block = default_record(first.snapshot.as_str()).to_bytes();
    session::ensure_dirs(disk, FAT_EPOCH, &[GRUB_DIR])?;
    session::with_esp(disk, FAT_EPOCH, |fs| -> Result<()> {
        for (path, bytes) in [
            (GRUB_CFG_PATH, grub_cfg(menu_timeout).into_bytes()),
            (
                MENU_PATH,
                render_menu(std::slice::from_ref(first)).into_bytes(),
            ),
            (GRUBENV_PATH, block.clone()),
            (GRUB_DEFAULT_ENV_PATH, block.clone()),
        ] {
            write_file_atomically(fs, path, &bytes).map_err(esp_err)?;
        }
        Ok(())
    })
}

/// The checks of [`register`], made before an upgrade builds anything; the block to write.
fn plan_register(scan: &GrubScan, entry: &MenuEntry) -> Result<(Vec<MenuEntry>, GrubEnv)> {
    let env = scan.writable()?;
    if scan.entry_of(&entry.snapshot).is_some() {
        return Err(esp_err(format!(
            "{MENU_PATH} has an entry for {} already",
            entry.snapshot
        )));
    }
    if scan.saved().is_none() {
        return Err(esp_err(
            "grubenv's saved_entry (and the second record's) names no menu entry: after a \
             failed trial GRUB would have no default to return to; commit a snapshot first",
        ));
    }
    let mut env = env.clone();
    env.set("next_entry", entry.snapshot.as_str())
        .map_err(|e| esp_err(e.to_string()))?;
    let mut entries = scan.entries.clone();
    entries.push(entry.clone());
    entries.sort_by(|a, b| b.snapshot.cmp(&a.snapshot));
    let after = scan.with(&env, entries.clone());
    if after.selected().map(|e| &e.snapshot) != Some(&entry.snapshot)
        || after.saved().map(|e| &e.snapshot) != scan.saved().map(|e| &e.snapshot)
    {
        return Err(esp_err(format!(
            "with next_entry={} GRUB would not start it once and keep its default",
            entry.snapshot
        )));
    }
    Ok((entries, env))
}

/// What [`register`] checks first: `snapshot`, registered now, would boot next once.
pub fn check_register<D: Disk>(disk: &D, entry: &MenuEntry) -> Result<()> {
    plan_register(&scan(disk)?, entry).map(|_| ())
}

/// Steps 4 and 6 on GRUB: the menu gains `entry` (temp name, rename, flushed), then grubenv's
/// one-shot `next_entry=<snapshot>` (in place, flushed); `saved_entry` is unchanged. A cut
/// before the grubenv write leaves an entry nothing names: the saved default boots.
pub fn register<D: Disk>(disk: &mut D, entry: &MenuEntry) -> Result<()> {
    let (entries, env) = plan_register(&scan(disk)?, entry)?;
    write_menu(disk, &entries)?;
    write_block(disk, FAT_EPOCH, GRUBENV_PATH, &env)
}

/// Step 8 on GRUB: grubenv `saved_entry=<snapshot>`, `next_entry` (unless it names another
/// entry: an upgrade staged since this boot stays staged) and `recordfail` removed, flushed;
/// then the second record names it (flushed). Returns the saved default before and after, or
/// `None` when it was the default already.
pub fn commit<D: Disk>(disk: &mut D, snapshot: &SnapshotName) -> Result<Option<(String, String)>> {
    let scan = scan(disk)?;
    let old = scan.writable()?;
    if scan.entry_of(snapshot).is_none() {
        return Err(esp_err(format!("{MENU_PATH} has no entry for {snapshot}")));
    }
    let mut env = old.clone();
    env.set("saved_entry", snapshot.as_str())
        .map_err(|e| esp_err(e.to_string()))?;
    let staged = scan.next_entry().is_some_and(|e| &e.snapshot != snapshot);
    if !staged {
        env.unset("next_entry");
    }
    env.unset("recordfail");
    let before = scan
        .saved()
        .map(|e| e.snapshot.to_string())
        .unwrap_or_default();
    if &env != old {
        write_block(disk, FAT_EPOCH, GRUBENV_PATH, &env)?;
    }
    sync_record(disk, &scan, snapshot)?;
    Ok((before != snapshot.as_str()).then(|| (before, snapshot.to_string())))
}

/// A rollback to `to`: grubenv `saved_entry=<to>` and `next_entry` removed (flushed), then the
/// second record names `to` (flushed). GRUB has no "bad" mark: the engine records `from`.
pub fn rollback<D: Disk>(disk: &mut D, to: &SnapshotName) -> Result<()> {
    let scan = scan(disk)?;
    let mut env = scan.writable()?.clone();
    if scan.entry_of(to).is_none() {
        return Err(esp_err(format!("{MENU_PATH} has no entry for {to}")));
    }
    env.set("saved_entry", to.as_str())
        .map_err(|e| esp_err(e.to_string()))?;
    env.unset("next_entry");
    let after = scan.with(&env, scan.entries.clone());
    if after.selected().map(|e| &e.snapshot) != Some(to) {
        return Err(esp_err(format!(
            "after the rollback GRUB would not start {to}"
        )));
    }
    if Some(&env) != scan.env.as_ref() {
        write_block(disk, FAT_EPOCH, GRUBENV_PATH, &env)?;
    }
    sync_record(disk, &scan, to)
}

/// Removes `snapshot`'s menu entry (absent is fine: cleanup after a cut). Refused for the entry
/// that boots next, the saved default and the one-shot's. A second record naming it (it lags
/// only after a cut commit) is first brought in line with grubenv.
pub fn remove<D: Disk>(disk: &mut D, snapshot: &SnapshotName) -> Result<()> {
    let scan = scan(disk)?;
    if scan.entry_of(snapshot).is_none() {
        return Ok(());
    }
    scan.writable()?;
    for (what, e) in [
        ("boots next", scan.selected()),
        ("is GRUB's saved default", scan.saved()),
        ("is the one-shot next_entry", scan.next_entry()),
    ] {
        if e.is_some_and(|e| &e.snapshot == snapshot) {
            return Err(esp_err(format!("{snapshot} {what}; not removed")));
        }
    }
    let record_names = scan
        .record
        .as_ref()
        .and_then(|r| r.get("saved_entry"))
        .is_some_and(|s| s == snapshot.as_str());
    if record_names {
        if let Some(saved) = scan.saved().map(|e| e.snapshot.clone()) {
            sync_record(disk, &scan, &saved)?;
        }
    }
    let entries: Vec<MenuEntry> = scan
        .entries
        .iter()
        .filter(|e| &e.snapshot != snapshot)
        .cloned()
        .collect();
    write_menu(disk, &entries)
}

/// What GRUB does at power-on, for tests and dry runs: select, consume a one-shot
/// `next_entry` (grubenv rewritten in place, as `save_env` does). Returns the snapshot started.
pub fn simulate_boot<D: Disk>(disk: &mut D) -> Result<Option<SnapshotName>> {
    let scan = scan(disk)?;
    if let Some(after) = scan.selection.as_ref().and_then(|s| s.env_after.clone()) {
        write_block(disk, FAT_EPOCH, GRUBENV_PATH, &after)?;
    }
    Ok(scan.selected().map(|e| e.snapshot.clone()))
}
