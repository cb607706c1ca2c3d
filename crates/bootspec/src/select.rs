//! systemd-boot's menu order and default-entry selection (docs/formats.md §2, "Sorting" and
//! "Default selection"), as functions over entry values.

use std::cmp::Ordering;

use crate::conf::{ucs2_lossy, LoaderConf, OsRelease};
use crate::efivars::EfiVars;
use crate::glob::fnmatch;
use crate::name::{BootState, EntryName, IdStyle};
use crate::version::compare_versions;

/// One boot entry as systemd-boot sees it after loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: EntryName,
    /// Menu title (display only).
    pub title: Option<String>,
    /// Version, compared descending among entries with equal sort keys.
    pub version: Option<String>,
    /// With a sort key the entry sorts "new style" (sort key, machine ID, version); without,
    /// by ID only, after all new-style entries.
    pub sort_key: Option<String>,
    /// Type #1 `machine-id`; UKIs have none.
    pub machine_id: Option<String>,
}

/// Why [`select`] picked its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `LoaderEntryOneShot` matched.
    OneShot,
    /// `LoaderEntryDefault` matched.
    EfiDefault,
    /// A default was `@saved` and `LoaderEntryLastBooted` matched.
    LastBooted,
    /// `default` in loader.conf matched.
    LoaderConfDefault,
    /// Nothing matched: the first entry in menu order (which is bad only if all are bad).
    FirstAutoSelectable,
}

/// The entry systemd-boot boots when nobody touches the menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Index into the `entries` slice given to [`select`].
    pub index: usize,
    /// Position in the menu (0 = top).
    pub menu_position: usize,
    pub file_name: String,
    /// The ID systemd-boot puts into `LoaderEntrySelected`.
    pub id: String,
    pub reason: Reason,
}

impl Entry {
    /// An entry without metadata (sorted by ID only).
    pub fn new(name: EntryName) -> Entry {
        Entry {
            name,
            title: None,
            version: None,
            sort_key: None,
            machine_id: None,
        }
    }

    /// A type #2 entry from its `.osrel`: title, version and sort key as systemd-boot picks them
    /// (see [`OsRelease`]). `None` when systemd-boot would skip the UKI (no PRETTY_NAME,
    /// IMAGE_ID, NAME or ID). Multi-profile UKIs (`@N` IDs) are not modelled.
    pub fn uki(name: EntryName, osrel: &OsRelease) -> Option<Entry> {
        Some(Entry {
            title: Some(osrel.title()?.to_owned()),
            version: osrel.entry_version().map(str::to_owned),
            sort_key: osrel.sort_key().map(str::to_owned),
            machine_id: None,
            name,
        })
    }

    pub fn file_name(&self) -> &str {
        self.name.file_name()
    }

    pub fn id(&self, style: IdStyle) -> String {
        self.name.id(style)
    }

    pub fn state(&self) -> BootState {
        self.name.state()
    }
}

/// `strcmp16()` on what systemd-boot holds of the strings (UCS-2 code units).
fn ucs2_cmp(a: &str, b: &str) -> Ordering {
    ucs2_lossy(a).chars().cmp(ucs2_lossy(b).chars())
}

/// systemd-boot's `boot_entry_compare()`: `Less` means `a` is shown (and preferred) first.
///
/// 1. bad entries (tries left 0) last;
/// 2. entries with a sort key first;
/// 3. both with one: sort key ascending, machine ID ascending (absent first), version
///    descending;
/// 4. ID descending by version order;
/// 5. both counted: more tries left first, then fewer tries done.
pub fn compare_entries(a: &Entry, b: &Entry, style: IdStyle) -> Ordering {
    let bad = |e: &Entry| e.state() == BootState::Bad;
    let version = |e: &Entry| e.version.clone().unwrap_or_default();
    bad(a)
        .cmp(&bad(b))
        .then_with(|| a.sort_key.is_none().cmp(&b.sort_key.is_none()))
        .then_with(|| match (&a.sort_key, &b.sort_key) {
            (Some(key_a), Some(key_b)) => ucs2_cmp(key_a, key_b)
                .then_with(|| match (&a.machine_id, &b.machine_id) {
                    (Some(ma), Some(mb)) => ucs2_cmp(ma, mb),
                    (ma, mb) => ma.is_some().cmp(&mb.is_some()),
                })
                .then_with(|| compare_versions(&version(b), &version(a))),
            _ => Ordering::Equal,
        })
        .then_with(|| compare_versions(&b.id(style), &a.id(style)))
        .then_with(|| match (a.name.counter(), b.name.counter()) {
            (Some(ca), Some(cb)) => cb
                .tries_left
                .cmp(&ca.tries_left)
                .then(ca.tries_done.cmp(&cb.tries_done)),
            _ => Ordering::Equal,
        })
}

/// Stable insertion sort of indices, exactly systemd-boot's `sort_pointer_array()`: an element
/// moves before its predecessor only while that one compares strictly greater. Unlike
/// `slice::sort_by` it never panics on a comparator that is not a total order, and it gives
/// the same result as systemd-boot even then.
pub(crate) fn insertion_sort(order: &mut [usize], mut cmp: impl FnMut(usize, usize) -> Ordering) {
    for i in 1..order.len() {
        let item = order[i];
        let mut k = i;
        while k > 0 && cmp(order[k - 1], item) == Ordering::Greater {
            order[k] = order[k - 1];
            k -= 1;
        }
        order[k] = item;
    }
}

/// Indices of `entries` in systemd-boot's menu order. `entries` must be in the order
/// systemd-boot loads them (directory order), which decides between entries that compare equal.
pub fn sorted(entries: &[Entry], style: IdStyle) -> Vec<usize> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    insertion_sort(&mut order, |a, b| {
        compare_entries(&entries[a], &entries[b], style)
    });
    order
}

/// The IDs in menu order: what systemd-boot writes to `LoaderEntries`.
pub fn menu_ids(entries: &[Entry], style: IdStyle) -> Vec<String> {
    sorted(entries, style)
        .into_iter()
        .map(|i| entries[i].id(style))
        .collect()
}

/// The entry systemd-boot boots by default: `LoaderEntryOneShot` → `LoaderEntryDefault` (or
/// `LoaderEntryLastBooted` when it is `@saved`) → loader.conf `default` (idem) → first entry in
/// menu order. Each pattern is lower-cased and glob-matched against the lower-cased IDs in menu
/// order; the first match wins, **bad entries included** (systemd#31215). `None` only when
/// `entries` is empty. `LoaderEntrySysFail` (systemd ≥ 258, failure-triggered) is not modelled.
pub fn select(
    entries: &[Entry],
    loader_conf: &LoaderConf,
    efi_vars: &EfiVars,
    style: IdStyle,
) -> Option<Selection> {
    let order = sorted(entries, style);
    let ids: Vec<String> = order.iter().map(|&i| entries[i].id(style)).collect();
    let lower = |s: &Option<String>| s.as_deref().map(str::to_ascii_lowercase);
    let find = |pattern: Option<String>, reason: Reason| {
        let pattern = pattern?;
        let position = ids.iter().position(|id| fnmatch(&pattern, id))?;
        Some((position, reason))
    };

    let efi_default = lower(&efi_vars.entry_default);
    let conf_default = lower(&loader_conf.default);
    let efi_saved = efi_default.as_deref() == Some("@saved");
    let conf_saved = conf_default.as_deref() == Some("@saved");
    let last_booted = lower(&efi_vars.entry_last_booted);

    let (menu_position, reason) = find(lower(&efi_vars.entry_oneshot), Reason::OneShot)
        .or_else(|| {
            if efi_saved {
                find(last_booted.clone(), Reason::LastBooted)
            } else {
                find(efi_default, Reason::EfiDefault)
            }
        })
        .or_else(|| match (conf_saved, efi_saved) {
            (true, true) => None,
            (true, false) => find(last_booted.clone(), Reason::LastBooted),
            (false, _) => find(conf_default, Reason::LoaderConfDefault),
        })
        .or_else(|| (!order.is_empty()).then_some((0, Reason::FirstAutoSelectable)))?;
    let index = order[menu_position];
    Some(Selection {
        index,
        menu_position,
        file_name: entries[index].file_name().to_owned(),
        id: ids[menu_position].clone(),
        reason,
    })
}
