//! The upgrade's plan: every check and every decision of the systemd-boot upgrade (what to
//! prune, which EFI variables to clear), made with the disk only read. A dry run shows it.

use slate_bootspec::{Entry, EntryName, IdStyle};
use slate_disk::Disk;
use slate_esp::fat::{temp_name, TEMP_NAME_EXTRA};
use slate_esp::{uki_file_name, MAX_FILE_NAME};

use super::{prune, SystemdBoot};
use crate::efivars::{EfiVars, LOADER_ENTRY_DEFAULT, LOADER_ENTRY_ONESHOT};
use crate::parts::{invalid, Result};
use crate::{BootloaderError, UpgradeRequest};

/// What the upgrade ([`crate::Bootloader::upgrade`]) writes, decided with the disk only read
/// ([`SystemdBoot::plan_upgrade`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradePlan {
    /// The new entry's file name.
    pub file_name: String,
    /// The running entry's file name, recorded in META `Upgrade`.
    pub fallback: String,
    /// Entries deleted first, in order: older copies of the target version, then what
    /// `keep_versions` and room call for (docs/update-transaction.md, "Pruning").
    pub prune: Vec<String>,
    /// EFI variables removed because they would keep the old version booting.
    pub clear_vars: Vec<&'static str>,
    /// The new UKI's length, and the ESP's free bytes before the upgrade.
    pub uki_len: u64,
    pub free_bytes: u64,
}

impl<D: Disk, V: EfiVars> SystemdBoot<D, V> {
    /// Every check of [`crate::Bootloader::upgrade`], with the disk only read: the new entry's name,
    /// the running entry (found, not the target), the fallback (not the target), what to prune
    /// and that the new UKI then fits, and that the selection model boots the new entry. A
    /// dry run shows this plan; the upgrade executes it.
    ///
    /// Pruning (docs/update-transaction.md, "Pruning"): older copies of the target version go;
    /// then the OS's entries (`<name>-…`; another OS's are never touched) down to
    /// `keep_versions` versions, counting the new one, the running one and the pending fallback,
    /// which always stay (pinned versions stay too, and are not counted); then more, bad entries first and then the oldest, only if the new UKI
    /// still lacks room. If it cannot fit even then, the refusal names the UKI's size, the free
    /// and the reclaimable bytes and the ESP's size.
    pub fn plan_upgrade(&self, req: &UpgradeRequest<'_>) -> Result<UpgradePlan> {
        if self.keep_versions < 2 {
            return Err(invalid(format!(
                "keep_versions {}: at least 2 (the new version and the running one)",
                self.keep_versions
            )));
        }
        let file = uki_file_name(req.name, req.version, Some(req.tries))?;
        if file.len() + TEMP_NAME_EXTRA > MAX_FILE_NAME {
            return Err(invalid(format!("{file}: too long for its temporary name")));
        }
        if req.uki.is_empty() {
            return Err(invalid("the UKI is empty"));
        }
        let new_name = EntryName::parse(&file).map_err(invalid)?;
        let scan = self.scan()?;
        let running = scan
            .find(req.running_entry)
            .ok_or_else(|| BootloaderError::EntryNotFound(req.running_entry.to_owned()))?;
        let new_id = new_name.id(IdStyle::Current);
        if scan.entries[running].id(IdStyle::Current) == new_id {
            return Err(invalid(format!("{file}: this version is the running one")));
        }
        // The OS's own entries, `<name>-<version>` with the version starting with a digit (as
        // profiles require), versioned by their names, and any copy of the target version;
        // another OS's UKIs (say `<name>-extra-…`) are never pruned.
        // Pinned versions (META `PinnedVersions`) are kept like another OS's: not pruned and not
        // counted against `keep_versions` — unless running or the fallback, which count as such.
        let pinned = scan.pinned.as_ref().map_err(|e| {
            invalid(format!(
                "META PinnedVersions cannot be read ({e}), so pruning could delete a pinned \
                 version: fix it with `slate meta set PinnedVersions …` or delete it"
            ))
        })?;
        let prefix = format!("{}-", req.name);
        let fallback = scan.tag.clone().filter(|t| !t.is_empty());
        let fallback_idx = fallback.as_deref().and_then(|f| scan.find(f));
        let ours: Vec<usize> = (0..scan.entries.len())
            .filter(|&i| {
                let entry = &scan.entries[i];
                let version = entry.name.stem().strip_prefix(&prefix);
                let kept_by_role = i == running || Some(i) == fallback_idx;
                entry.id(IdStyle::Current) == new_id
                    || version.is_some_and(|v| {
                        v.starts_with(|c: char| c.is_ascii_digit())
                            && (kept_by_role || !pinned.iter().any(|p| p == v))
                    })
            })
            .collect();
        let our_entries: Vec<Entry> = ours
            .iter()
            .map(|&i| {
                let mut e = scan.entries[i].clone();
                e.version = e.name.stem().strip_prefix(&prefix).map(str::to_owned);
                e
            })
            .collect();
        // An older copy of the target version (e.g. marked bad by an earlier attempt) goes.
        let replaced: Vec<usize> = (0..ours.len())
            .filter(|&i| our_entries[i].id(IdStyle::Current) == new_id)
            .collect();
        if replaced.iter().any(|&i| Some(ours[i]) == fallback_idx) {
            return Err(invalid(format!(
                "{file}: this version is the pending fallback"
            )));
        }
        let space = scan.space;
        let tmp = temp_name(&file);
        let stale: u64 = scan
            .temps
            .iter()
            .filter(|(n, _)| *n == tmp)
            .map(|(_, l)| space.clusters_for(*l))
            .sum();
        let clusters: Vec<u64> = ours
            .iter()
            .map(|&i| space.clusters_for(scan.lens[i]))
            .collect();
        let running_file = scan.entries[running].file_name().to_owned();
        // One spare cluster: the directory may grow by the new long-name entries.
        let room = prune::Room {
            free: space.free_clusters + stale,
            needed: space.clusters_for(req.uki.len() as u64) + 1,
        };
        let plan = prune::plan(
            &our_entries,
            &clusters,
            &replaced,
            &running_file,
            fallback.as_deref(),
            self.keep_versions,
            room,
        );
        let removed: Vec<usize> = match plan {
            prune::Plan::Fits { prune } => prune.iter().map(|&i| ours[i]).collect(),
            prune::Plan::NoRoom {
                prunable,
                reclaimable,
            } => {
                let mut names: Vec<String> = prunable
                    .iter()
                    .map(|&i| scan.entries[ours[i]].file_name().to_owned())
                    .collect();
                if stale > 0 {
                    names.push(tmp.clone());
                }
                let fallback_file = fallback_idx.map(|i| scan.entries[i].file_name());
                return Err(invalid(prune::no_room_message(&prune::NoRoom {
                    file: &file,
                    uki_len: req.uki.len() as u64,
                    esp_len: scan.esp_len,
                    free: space.free_clusters * space.cluster_size,
                    reclaimable: (reclaimable + stale) * space.cluster_size,
                    prunable: &names,
                    running: &running_file,
                    fallback: fallback_file,
                })));
            }
        };
        // The state after the flip, as the loader will see it.
        let mut after: Vec<Entry> = (0..scan.entries.len())
            .filter(|i| !removed.contains(i))
            .map(|i| scan.entries[i].clone())
            .collect();
        let mut new_entry = Entry::new(new_name);
        new_entry.version = Some(req.version.to_owned());
        after.push(new_entry);
        let conf = scan.conf();
        let mut vars = crate::MemEfiVars::new();
        for name in [
            LOADER_ENTRY_ONESHOT,
            LOADER_ENTRY_DEFAULT,
            crate::LOADER_ENTRY_LAST_BOOTED,
        ] {
            if let Some(v) = self.vars.get(name) {
                vars.set(name, &v)?;
            }
        }
        let picks_new =
            |vars: &crate::MemEfiVars| self.selection(&after, &conf, vars).map(|s| s.file_name);
        let mut clear_vars = Vec::new();
        for name in [LOADER_ENTRY_ONESHOT, LOADER_ENTRY_DEFAULT] {
            if picks_new(&vars).as_deref() != Some(file.as_str()) && vars.get(name).is_some() {
                vars.remove(name)?;
                clear_vars.push(name);
            }
        }
        if let Some(selected) = picks_new(&vars).filter(|s| *s != file) {
            return Err(BootloaderError::WouldNotBoot {
                wanted: file,
                selected,
            });
        }
        Ok(UpgradePlan {
            file_name: file,
            fallback: running_file,
            prune: removed
                .iter()
                .map(|&i| scan.entries[i].file_name().to_owned())
                .collect(),
            clear_vars,
            uki_len: req.uki.len() as u64,
            free_bytes: space.free_clusters * space.cluster_size,
        })
    }
}
