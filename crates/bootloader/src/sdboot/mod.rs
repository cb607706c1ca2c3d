//! The systemd-boot backend: Type #2 entries (UKIs in `EFI/Linux`) with boot counting,
//! `loader.conf`'s `default <name>-*` glob, META `Upgrade`, and the EFI variables only where the
//! selection model shows they are needed. A fresh image's ESP files: [`image_files`]. A Btrfs
//! snapshot root's Type #1 entries: [`snapshots`].

pub(crate) mod explain;
mod image;
mod kexec;
mod once;
mod pin;
mod plan;
mod prune;
mod rollback;
pub mod snapshots;

pub use image::{image_files, EnrollKeys};
pub use kexec::{entry_from_cmdline, kexec_cmdline, uki_kexec_parts, KexecPlan, ENTRY_KERNEL_ARG};
pub use plan::UpgradePlan;

use std::io::{Read, Write};

use fatfs::{FileSystem, ReadWriteSeek};
use slate_bootspec::{
    parse_loader_conf, refers_to, select, BootState, Entry, EntryKind, EntryName, IdStyle,
    LoaderConf, Selection,
};
use slate_disk::{Disk, PartitionView};
use slate_esp::fat::{self, temp_name};
use slate_esp::{fat_space, session, FatSpace, LOADER_CONF_PATH, UKI_DIR};
use slate_meta::{tags, MetaStore};

use crate::efivars::{loader_vars, EfiVars, LOADER_ENTRY_DEFAULT, LOADER_ENTRY_ONESHOT};
use crate::parts::{self, fat_err, invalid, Result};
use crate::{
    BootStatus, Bootloader, BootloaderError, CommitOutcome, EntryStatus, UpgradeOutcome,
    UpgradeRequest,
};

/// The entry name slate's images use (`slate-<version>+3.efi`).
pub const DEFAULT_ENTRY_NAME: &str = "slate";

/// Versions an upgrade leaves on the ESP unless told otherwise
/// ([`SystemdBoot::with_keep_versions`]): the new one and the running one (plus a pending
/// fallback, which is never pruned).
pub const DEFAULT_KEEP_VERSIONS: u32 = 2;

/// systemd-boot on a whole disk with the slate layout (partitions `EFI` and `META`), with EFI
/// variables `V`.
#[derive(Debug)]
pub struct SystemdBoot<D, V> {
    disk: D,
    vars: V,
    name: String,
    source_date_epoch: u64,
    style: IdStyle,
    keep_versions: u32,
}

/// What is on the ESP and in META, read in one pass.
struct Scan {
    entries: Vec<Entry>,
    lens: Vec<u64>,
    temps: Vec<(String, u64)>,
    conf: Option<LoaderConf>,
    tag: Option<String>,
    /// META `PinnedVersions` (an unreadable value refuses upgrades rather than prune a pin).
    pinned: std::result::Result<Vec<String>, slate_meta::pins::PinError>,
    space: FatSpace,
    esp_len: u64,
    warnings: Vec<String>,
}

impl Scan {
    fn find(&self, reference: &str) -> Option<usize> {
        self.entries.iter().position(|e| refers_to(e, reference))
    }
    fn conf(&self) -> LoaderConf {
        self.conf.clone().unwrap_or_default()
    }
}

impl<D: Disk, V: EfiVars> SystemdBoot<D, V> {
    /// Entry name `slate`, FAT timestamps at `SOURCE_DATE_EPOCH` 0 (clamped to 1980), and entry
    /// IDs as Debian 12's systemd-boot 252 forms them.
    pub fn new(disk: D, vars: V) -> Self {
        Self {
            disk,
            vars,
            name: DEFAULT_ENTRY_NAME.to_owned(),
            source_date_epoch: 0,
            style: IdStyle::Sd252,
            keep_versions: DEFAULT_KEEP_VERSIONS,
        }
    }

    /// How many versions an upgrade leaves on the ESP (at least 2; profile `[image]
    /// keep_versions`): the new one, the running one and a pending fallback always stay, then
    /// the newest others up to this count.
    pub fn with_keep_versions(mut self, keep_versions: u32) -> Self {
        self.keep_versions = keep_versions;
        self
    }

    pub fn with_source_date_epoch(mut self, epoch: u64) -> Self {
        self.source_date_epoch = epoch;
        self
    }

    pub fn with_id_style(mut self, style: IdStyle) -> Self {
        self.style = style;
        self
    }

    pub fn disk(&self) -> &D {
        &self.disk
    }

    pub fn vars(&self) -> &V {
        &self.vars
    }

    pub fn into_parts(self) -> (D, V) {
        (self.disk, self.vars)
    }

    /// The content of `EFI/Linux/<file_name>`.
    pub fn read_entry(&self, file_name: &str) -> Result<Vec<u8>> {
        parts::read_esp_file(&self.disk, &format!("{UKI_DIR}/{file_name}"))
    }

    fn scan(&self) -> Result<Scan> {
        let esp = session::read_only(&self.disk)?;
        let esp_len = esp.len();
        let space = fat_space(&esp).map_err(fat_err("counting free clusters of", "/"))?;
        let fs = fat::mount(esp, self.source_date_epoch)?;
        let (mut entries, mut lens, mut temps, mut warnings) = (vec![], vec![], vec![], vec![]);
        let dir = fs
            .root_dir()
            .open_dir(UKI_DIR)
            .map_err(fat_err("opening", UKI_DIR))?;
        for item in dir.iter() {
            let item = item.map_err(fat_err("listing", UKI_DIR))?;
            let file = item.file_name();
            if item.is_dir() {
                continue;
            }
            if file.starts_with('.') {
                temps.push((file, item.len()));
                continue;
            }
            match EntryName::parse(&file) {
                Ok(name) if name.kind() == EntryKind::Type2Efi => {
                    let mut entry = Entry::new(name);
                    let prefix = format!("{}-", self.name);
                    entry.version = entry.name.stem().strip_prefix(&prefix).map(str::to_owned);
                    entries.push(entry);
                    lens.push(item.len());
                }
                _ => warnings.push(format!("{UKI_DIR}/{file}: not a boot entry, ignored")),
            }
        }
        let mut text = String::new();
        let conf = match fs.root_dir().open_file(LOADER_CONF_PATH) {
            Ok(mut f) => match f.read_to_string(&mut text) {
                Ok(_) => parse_loader_conf(&text)
                    .map_err(|e| warnings.push(format!("{LOADER_CONF_PATH}: {e}")))
                    .ok(),
                Err(e) => {
                    warnings.push(format!("{LOADER_CONF_PATH}: {e}"));
                    None
                }
            },
            Err(_) => None,
        };
        drop(dir);
        drop(fs);
        let meta = parts::read_meta_facts(&self.disk)?;
        warnings.extend(meta.warnings);
        Ok(Scan {
            entries,
            lens,
            temps,
            conf,
            tag: meta.upgrade_tag,
            pinned: meta.pinned,
            space,
            esp_len,
            warnings,
        })
    }

    fn selection(
        &self,
        entries: &[Entry],
        conf: &LoaderConf,
        vars: &impl EfiVars,
    ) -> Option<Selection> {
        select(entries, conf, &loader_vars(vars), self.style)
    }

    fn with_meta<R>(
        &mut self,
        f: impl FnOnce(&mut MetaStore<PartitionView<&mut D>>) -> Result<R>,
    ) -> Result<R> {
        f(&mut parts::meta_mut(&mut self.disk)?)
    }

    /// Rename `EFI/Linux/<from>` to `<to>` and flush. `fatfs` frees the old name before writing
    /// the new one, so a cut in between leaves the entry nameless (its clusters orphaned): the
    /// callers only rename when the *other* version would then boot.
    ///
    /// Then the deleted entries at the end of `EFI/Linux` are trimmed: the firmware's FAT
    /// driver appends the entry of systemd-boot's boot-counting rename there at every boot of
    /// a new version, and the directory would grow by 96 bytes each time (`xtask soak`).
    fn rename_entry(&mut self, from: &str, to: &str) -> Result<()> {
        session::with_esp(&mut self.disk, self.source_date_epoch, |fs| {
            rename_in(fs, from, to)
        })?;
        session::trim_dir(&mut self.disk, UKI_DIR)?;
        Ok(())
    }

    /// What systemd-boot does before starting its default entry: rename a counted entry
    /// `+L-D` → `+(L-1)-(D+1)` (flushed) and consume `LoaderEntryOneShot`. Returns the file
    /// name booted. For tests and dry runs: on a real machine the loader does this.
    pub fn simulate_boot_attempt(&mut self) -> Result<Option<String>> {
        let scan = self.scan()?;
        let Some(sel) = self.selection(&scan.entries, &scan.conf(), &self.vars) else {
            return Ok(None);
        };
        let name = &scan.entries[sel.index].name;
        let next = name
            .after_boot_attempt()
            .map_err(|e| BootloaderError::Invalid(e.to_string()))?;
        if next != *name {
            self.rename_entry(name.file_name(), next.file_name())?;
        }
        self.vars.remove(LOADER_ENTRY_ONESHOT)?;
        Ok(Some(next.file_name().to_owned()))
    }
}

fn rename_in<T: ReadWriteSeek>(fs: &FileSystem<T>, from: &str, to: &str) -> Result<()> {
    let dir = fs
        .root_dir()
        .open_dir(UKI_DIR)
        .map_err(fat_err("opening", UKI_DIR))?;
    dir.rename(from, &dir, to)
        .map_err(fat_err("renaming", &format!("{UKI_DIR}/{from} to {to}")))?;
    dir.open_file(to)
        .and_then(|mut f| f.flush())
        .map_err(fat_err("flushing", &format!("{UKI_DIR}/{to}")))
}

impl<D: Disk, V: EfiVars> Bootloader for SystemdBoot<D, V> {
    fn boot_once(&mut self, reference: &str) -> Result<String> {
        SystemdBoot::boot_once(self, reference)
    }

    fn status(&self) -> Result<BootStatus> {
        let scan = self.scan()?;
        let selected = self.selection(&scan.entries, &scan.conf(), &self.vars);
        let entries = scan
            .entries
            .iter()
            .zip(&scan.lens)
            .map(|(e, &len)| EntryStatus {
                file_name: e.file_name().to_owned(),
                version: e.version.clone(),
                state: e.state(),
                len,
            })
            .collect();
        Ok(BootStatus {
            entries,
            temp_files: scan.temps.into_iter().map(|(n, _)| n).collect(),
            loader_conf: scan.conf,
            upgrade_tag: scan.tag,
            pinned: scan.pinned.unwrap_or_default(),
            selected,
            free_bytes: scan.space.free_clusters * scan.space.cluster_size,
            warnings: scan.warnings,
        })
    }

    fn explain(&self) -> Result<crate::BootExplanation> {
        let vars = loader_vars(&self.vars);
        Ok(explain::explain(&self.status()?, &vars, self.style))
    }

    /// The entry found by its name or ID in the directory listing, its length checked there,
    /// then the file read.
    fn read_uki(&self, reference: &str, limit: u64) -> Result<Vec<u8>> {
        let status = self.status()?;
        let entry = status
            .entry(reference)
            .ok_or_else(|| BootloaderError::EntryNotFound(reference.to_owned()))?;
        if entry.len > limit {
            return Err(invalid(format!(
                "{UKI_DIR}/{} is {} bytes, more than the {limit} bytes it may be read into",
                entry.file_name, entry.len
            )));
        }
        self.read_entry(&entry.file_name)
    }

    /// Every check first ([`SystemdBoot::plan_upgrade`]: names, the running entry exists and is
    /// not the target, what to prune and that the new UKI then fits, that the selection model
    /// boots the new entry afterwards), then:
    ///
    /// 1. prune (flush): older copies of the target version, then down to `keep_versions`
    ///    versions, then more if room demands it — never the running entry, never the pending
    ///    fallback;
    /// 2. write the UKI under the hidden temp name `.<file>.tmp` (flush) — systemd-boot skips
    ///    dot-names, so a torn UKI is never offered;
    /// 3. META `Upgrade` = the running entry's file name (copy 1, flush, copy 2, flush) —
    ///    recorded *before* the flip, so whenever the new entry can boot, its way back is known;
    ///    a cut before the flip leaves the old version booting with a tag naming itself, which
    ///    its own commit clears;
    /// 4. remove `LoaderEntryDefault` / `LoaderEntryOneShot` only if the model shows they would
    ///    keep the new entry from booting (with slate's `default <name>-*` glob and no variables
    ///    set — the normal case — nothing is touched: the glob picks the highest version not
    ///    bad, and a counted Sd252 ID changes on every boot attempt, so pinning it would go
    ///    stale);
    /// 5. the flip: rename the temp file to `<name>-<version>+<tries>.efi` (flush). A cut inside
    ///    the rename leaves no name (old boots) or the new name over complete, flushed data.
    fn upgrade(&mut self, req: &UpgradeRequest<'_>) -> Result<UpgradeOutcome> {
        let plan = self.plan_upgrade(req)?;
        let file = plan.file_name;
        let tmp = temp_name(&file);

        // Writes start here.
        if !plan.prune.is_empty() {
            session::with_esp(&mut self.disk, self.source_date_epoch, |fs| -> Result<()> {
                let dir = fs
                    .root_dir()
                    .open_dir(UKI_DIR)
                    .map_err(fat_err("opening", UKI_DIR))?;
                for name in &plan.prune {
                    dir.remove(name).map_err(fat_err("removing", name))?;
                }
                Ok(())
            })?;
        }
        let (disk, epoch) = (&mut self.disk, self.source_date_epoch);
        session::with_esp_writing(disk, epoch, req.uki, |fs| -> Result<()> {
            let dir = fs
                .root_dir()
                .open_dir(UKI_DIR)
                .map_err(fat_err("opening", UKI_DIR))?;
            if dir
                .iter()
                .filter_map(|e| e.ok())
                .any(|e| e.file_name() == tmp)
            {
                dir.remove(&tmp)
                    .map_err(fat_err("removing a stale", &tmp))?;
            }
            let mut f = dir.create_file(&tmp).map_err(fat_err("creating", &tmp))?;
            f.write_all(req.uki).map_err(fat_err("writing", &tmp))?;
            f.flush().map_err(fat_err("flushing", &tmp))
        })?;
        self.with_meta(|meta| {
            meta.set(tags::UPGRADE, plan.fallback.as_bytes())?;
            Ok(meta.flush()?)
        })?;
        for name in &plan.clear_vars {
            self.vars.remove(name)?;
        }
        self.rename_entry(&tmp, &file)?;
        Ok(UpgradeOutcome {
            file_name: file,
            fallback: plan.fallback,
            removed: plan.prune,
            cleared_vars: plan.clear_vars,
        })
    }

    /// Bless first (rename dropping the counter, flush), then delete META `Upgrade` (flush).
    /// A cut after the bless leaves a blessed entry and the tag: the next boot reaches Running
    /// and commits again (both steps are idempotent), or fails and reverts with the tag. The
    /// other order could leave a committed entry still counted, which boot counting would later
    /// demote with no fallback recorded. A cut inside the rename leaves the entry nameless and
    /// the old version (still on disk, never deleted here) boots.
    fn commit(&mut self, running_entry: &str) -> Result<CommitOutcome> {
        let scan = self.scan()?;
        let idx = scan
            .find(running_entry)
            .ok_or_else(|| BootloaderError::EntryNotFound(running_entry.to_owned()))?;
        let name = scan.entries[idx].name.clone();
        let blessed = name.blessed().map_err(invalid)?;
        if blessed != name {
            if scan
                .entries
                .iter()
                .any(|e| e.file_name().eq_ignore_ascii_case(blessed.file_name()))
            {
                return Err(invalid(format!("{blessed} already exists next to {name}")));
            }
            self.rename_entry(name.file_name(), blessed.file_name())?;
        }
        let previous = scan.tag.clone();
        if previous.is_some() {
            self.with_meta(|meta| {
                meta.delete(tags::UPGRADE);
                Ok(meta.flush()?)
            })?;
        }
        Ok(CommitOutcome {
            blessed: blessed.file_name().to_owned(),
            previous,
        })
    }

    /// Mark the failed entry bad (`+0-DONE`, flush), then delete META `Upgrade` (flush). A
    /// bad entry sorts after every other one, so the `default <name>-*` glob falls to the
    /// previous version; only if the model says otherwise is `LoaderEntryDefault` set to the
    /// previous entry's ID. A cut before the mark leaves the failed entry counted (tried
    /// again, and boot counting still ends it); after the mark, the previous version boots
    /// with the tag naming itself and its commit clears it. The other order could leave the
    /// failed version booting with no way back recorded.
    fn rollback(&mut self, running_entry: &str, tries: u32) -> Result<crate::RollbackPlan> {
        let plan = self.plan_rollback(running_entry, tries)?;
        self.execute_rollback(&plan)?;
        Ok(plan)
    }

    fn plan_rollback(&self, running_entry: &str, tries: u32) -> Result<crate::RollbackPlan> {
        SystemdBoot::plan_rollback(self, running_entry, tries)
    }

    fn pin(&mut self, version: &str, pin: bool, dry_run: bool) -> Result<crate::PinOutcome> {
        if dry_run {
            self.plan_pin(version, pin)
        } else {
            self.set_pin(version, pin)
        }
    }

    fn revert(&mut self, failed_entry: &str) -> Result<Option<String>> {
        let scan = self.scan()?;
        let Some(label) = scan.tag.clone() else {
            return Ok(None);
        };
        if label.is_empty() {
            self.with_meta(|meta| {
                meta.delete(tags::UPGRADE);
                Ok(meta.flush()?)
            })?;
            return Ok(None);
        }
        let prev = scan
            .find(&label)
            .ok_or_else(|| BootloaderError::EntryNotFound(label.clone()))?;
        let mut after = scan.entries.clone();
        let mut rename = None;
        if let Some(failed) = scan.find(failed_entry).filter(|&f| f != prev) {
            let name = &scan.entries[failed].name;
            if name.state() != BootState::Bad {
                let bad = name.marked_bad().map_err(invalid)?;
                after[failed].name = bad.clone();
                rename = Some((name.file_name().to_owned(), bad.file_name().to_owned()));
            }
        }
        let conf = scan.conf();
        let prev_file = scan.entries[prev].file_name().to_owned();
        let mut set_default = None;
        let boots = |vars: &dyn Fn() -> slate_bootspec::EfiVars| {
            select(&after, &conf, &vars(), self.style).map(|s| s.file_name)
        };
        if boots(&|| loader_vars(&self.vars)).as_deref() != Some(prev_file.as_str()) {
            let id = scan.entries[prev].id(self.style);
            let pinned = || slate_bootspec::EfiVars {
                entry_oneshot: None,
                entry_default: Some(id.clone()),
                entry_last_booted: None,
            };
            match boots(&pinned) {
                Some(f) if f == prev_file && self.vars.get(LOADER_ENTRY_ONESHOT).is_none() => {
                    set_default = Some(id.clone())
                }
                selected => {
                    return Err(BootloaderError::WouldNotBoot {
                        wanted: prev_file,
                        selected: selected.unwrap_or_default(),
                    })
                }
            }
        }
        if let Some((from, to)) = rename {
            self.rename_entry(&from, &to)?;
        }
        if let Some(id) = set_default {
            self.vars.set(LOADER_ENTRY_DEFAULT, &id)?;
        }
        self.with_meta(|meta| {
            meta.delete(tags::UPGRADE);
            Ok(meta.flush()?)
        })?;
        Ok(Some(label))
    }
}
