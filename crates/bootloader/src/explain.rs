//! What the boot loader will do next, and why: every entry in menu order with its version, boot
//! counter, state and whether it is the fallback in META `Upgrade`, the entry that boots next
//! and the rule that picked it (`slate boot explain`; machined will send the same value over the
//! API).
//!
//! Pure: built from values a backend has already read ([`BootStatus`] with the EFI variables it
//! consulted, or [`GrubStatus`]). The choice itself is never recomputed here: it is the
//! backend's [`Selection`](slate_bootspec::Selection) or
//! [`GrubSelection`](slate_bootspec::GrubSelection), so `explain` and `upgrade`/`commit`/
//! `revert` cannot disagree. Only the menu order is derived, with the same
//! [`slate_bootspec::sorted`] the selection uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use slate_bootspec::{
    grub_entry_index, sorted, BootState, Entry, EntryName, GrubReason, IdStyle, Reason,
};
use slate_esp::{GRUB_SLOTS, UKI_DIR};

use crate::grub::{menu as grub_menu, GrubStatus};
use crate::{BootStatus, EntryStatus, LoaderKind};

/// Everything `slate boot explain` shows, as one serializable value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootExplanation {
    /// `"systemd-boot"` or `"grub"`.
    #[serde(with = "loader_name")]
    pub loader: LoaderKind,
    /// In menu order (systemd-boot: its sort order; GRUB: slots A, B).
    pub entries: Vec<ExplainedEntry>,
    /// The entry's file name (systemd-boot) or slot label (GRUB); `None` when nothing boots.
    pub next_boot: Option<String>,
    pub reason: NextBootReason,
    /// The reason as a sentence ("next boot: X because <reason_text>").
    pub reason_text: String,
    /// systemd-boot renames a counted entry before starting it (a boot attempt): the name it
    /// will have while it runs. `None` for an uncounted entry and for GRUB.
    pub renamed_to: Option<String>,
    /// META `Upgrade` as stored: the entry to return to while an upgrade is uncommitted.
    pub upgrade_tag: Option<String>,
    /// loader.conf `default` (systemd-boot).
    pub loader_conf_default: Option<String>,
    /// The EFI variables the selection read (systemd-boot; `None` for GRUB).
    pub efi_vars: Option<ConsultedEfiVars>,
    /// The environment block's variables (GRUB; `None` for systemd-boot).
    pub grubenv: Option<BTreeMap<String, String>>,
    pub warnings: Vec<String>,
}

/// One menu entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainedEntry {
    /// Menu position, 0 = top.
    pub position: usize,
    /// systemd-boot: the file name in `EFI/Linux`; GRUB: the slot label.
    pub name: String,
    /// What `LoaderEntry*` patterns match (systemd-boot), or the menuentry `--id` (GRUB).
    pub id: String,
    /// GRUB's menu title; systemd-boot's comes from the UKI's `.osrel`, which is not read.
    pub title: Option<String>,
    pub version: Option<String>,
    /// The boot counter (systemd-boot, counted entries only).
    pub tries_left: Option<u32>,
    pub tries_done: Option<u32>,
    pub state: EntryState,
    /// The entry META `Upgrade` names: where a failed upgrade returns to.
    pub fallback: bool,
    /// Its version is pinned (META `PinnedVersions`): pruning never deletes it.
    #[serde(default)]
    pub pinned: bool,
    pub next_boot: bool,
    /// Bytes on the ESP (GRUB: kernel + initramfs).
    pub len: u64,
    /// GRUB only: what the slot holds and how grubenv names it.
    pub grub: Option<GrubSlotFacts>,
}

/// Boot assessment, systemd-boot's three states. A GRUB slot has no counter: it is good when
/// complete, indeterminate while it is the uncommitted side of an upgrade, bad when incomplete
/// (its menu entry fails and GRUB starts the fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    Good,
    Indeterminate,
    Bad,
}

impl EntryState {
    /// As serialized: `good`, `indeterminate`, `bad`.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Good => "good",
            EntryState::Indeterminate => "indeterminate",
            EntryState::Bad => "bad",
        }
    }
}

impl From<BootState> for EntryState {
    fn from(state: BootState) -> Self {
        match state {
            BootState::Good => EntryState::Good,
            BootState::Indeterminate => EntryState::Indeterminate,
            BootState::Bad => EntryState::Bad,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrubSlotFacts {
    /// Kernel, initramfs and `cmdline.cfg` present.
    pub complete: bool,
    /// grubenv `saved_entry` names this slot (GRUB's default, and its fallback).
    pub saved_entry: bool,
    /// grubenv `next_entry` names this slot (one boot only).
    pub next_entry: bool,
}

/// `LoaderEntry*` as the selection read them (`None`: not set, or not available offline).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsultedEfiVars {
    #[serde(rename = "LoaderEntryOneShot")]
    pub oneshot: Option<String>,
    #[serde(rename = "LoaderEntryDefault")]
    pub default: Option<String>,
    #[serde(rename = "LoaderEntryLastBooted")]
    pub last_booted: Option<String>,
}

impl From<&slate_bootspec::EfiVars> for ConsultedEfiVars {
    fn from(vars: &slate_bootspec::EfiVars) -> Self {
        Self {
            oneshot: vars.entry_oneshot.clone(),
            default: vars.entry_default.clone(),
            last_booted: vars.entry_last_booted.clone(),
        }
    }
}

/// Which rule picked the next boot. Serialized with `"kind"` in snake case, e.g.
/// `{"kind": "loader_conf_default", "pattern": "slate-*"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NextBootReason {
    /// `LoaderEntryOneShot` matched (systemd-boot deletes it once read).
    OneShot { pattern: String },
    /// `LoaderEntryDefault` matched.
    EfiDefault { pattern: String },
    /// A default was `@saved` and `LoaderEntryLastBooted` matched.
    LastBooted { id: String },
    /// loader.conf `default` matched (first match in menu order).
    LoaderConfDefault { pattern: String },
    /// Nothing matched: the first entry in menu order.
    FirstInSortOrder,
    /// grubenv `next_entry` (one shot).
    GrubNextEntry { value: String },
    /// grubenv `saved_entry`.
    GrubSavedEntry { value: String },
    /// grubenv names no slot in `saved_entry` (it is corrupted, or lost the line), so
    /// `grub.cfg` took `saved_entry` from slate's second record, `grub/slate-default.env`.
    GrubDefaultRecord { value: String },
    /// Neither names an entry: GRUB's first entry.
    GrubFirst,
    /// The selected slot is incomplete, so its menu entry fails and GRUB starts `fallback`
    /// (`saved_entry`).
    GrubFallback { selected: String },
    /// Nothing boots.
    NoEntry,
}

impl BootExplanation {
    /// `"systemd-boot"` or `"grub"`, as serialized.
    pub fn loader_name(&self) -> &'static str {
        loader_name::name(self.loader)
    }

    /// The entry that boots next.
    pub fn next_entry(&self) -> Option<&ExplainedEntry> {
        self.entries.iter().find(|e| e.next_boot)
    }
}

/// The explanation for systemd-boot, from its [`BootStatus`], the EFI variables its selection
/// consulted and the ID style it used.
pub fn systemd_boot(
    status: &BootStatus,
    vars: &slate_bootspec::EfiVars,
    style: IdStyle,
) -> BootExplanation {
    let mut warnings = status.warnings.clone();
    warnings.extend(status.temp_files.iter().map(|t| {
        format!("{UKI_DIR}/{t}: left by an interrupted write; never booted, reclaimed by the next upgrade")
    }));
    // The same entry values the backend selected over (its scan: the name, the version from
    // the name), so that `sorted` gives the menu the selection saw.
    let (listed, model): (Vec<&EntryStatus>, Vec<Entry>) = status
        .entries
        .iter()
        .filter_map(|e| match EntryName::parse(&e.file_name) {
            Ok(name) => {
                let mut entry = Entry::new(name);
                entry.version = e.version.clone();
                Some((e, entry))
            }
            Err(err) => {
                warnings.push(format!("{UKI_DIR}/{}: {err}", e.file_name));
                None
            }
        })
        .unzip();
    let tag = status.upgrade_tag.as_deref().filter(|t| !t.is_empty());
    let fallback = tag
        .and_then(|t| status.entry(t))
        .map(|e| e.file_name.clone());
    if let (Some(t), None) = (tag, &fallback) {
        warnings.push(format!(
            "META Upgrade names {t}, which matches no entry: a failed upgrade has nothing to return to"
        ));
    }
    let selected = status.selected.as_ref();
    let order = sorted(&model, style);
    let entries: Vec<ExplainedEntry> = order
        .iter()
        .enumerate()
        .map(|(position, &i)| {
            let (e, m) = (listed[i], &model[i]);
            let counter = m.name.counter();
            ExplainedEntry {
                position,
                name: e.file_name.clone(),
                id: m.id(style),
                title: None,
                version: e.version.clone(),
                tries_left: counter.map(|c| c.tries_left),
                tries_done: counter.map(|c| c.tries_done),
                state: e.state.into(),
                fallback: fallback.as_deref() == Some(e.file_name.as_str()),
                pinned: e
                    .version
                    .as_ref()
                    .is_some_and(|v| status.pinned.contains(v)),
                next_boot: selected.is_some_and(|s| s.file_name == e.file_name),
                len: e.len,
                grub: None,
            }
        })
        .collect();
    if let Some(s) = selected {
        let position = entries.iter().position(|e| e.next_boot);
        if position != Some(s.menu_position) {
            warnings.push(format!(
                "internal: {} is at menu position {position:?} here but {} in the selection",
                s.file_name, s.menu_position
            ));
        }
    }

    let conf_default = status.loader_conf.as_ref().and_then(|c| c.default.clone());
    let is_saved = |p: &Option<String>| {
        p.as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("@saved"))
    };
    let lost = |what: &str, value: &str| {
        format!("{what}={value} matches no entry, so it did not decide the next boot")
    };
    let (reason, reason_text) = match selected.map(|s| s.reason) {
        None => (
            NextBootReason::NoEntry,
            format!("{UKI_DIR} holds no boot entry: systemd-boot has nothing to boot"),
        ),
        Some(Reason::OneShot) => {
            let pattern = vars.entry_oneshot.clone().unwrap_or_default();
            let text = format!(
                "LoaderEntryOneShot={pattern} matches it (this boot only: systemd-boot deletes \
                 the variable when it reads it)"
            );
            (NextBootReason::OneShot { pattern }, text)
        }
        Some(Reason::EfiDefault) => {
            let pattern = vars.entry_default.clone().unwrap_or_default();
            let text = format!(
                "LoaderEntryDefault={pattern} matches it, first in menu order (the EFI variable \
                 overrides loader.conf)"
            );
            (NextBootReason::EfiDefault { pattern }, text)
        }
        Some(Reason::LastBooted) => {
            let id = vars.entry_last_booted.clone().unwrap_or_default();
            let which = if is_saved(&vars.entry_default) {
                "LoaderEntryDefault"
            } else {
                "loader.conf's default"
            };
            let text = format!("{which} is @saved and LoaderEntryLastBooted={id} names it");
            (NextBootReason::LastBooted { id }, text)
        }
        Some(Reason::LoaderConfDefault) => {
            let pattern = conf_default.clone().unwrap_or_default();
            let text = format!(
                "loader.conf's `default {pattern}` matches it first in menu order (highest \
                 version first, entries marked bad last)"
            );
            (NextBootReason::LoaderConfDefault { pattern }, text)
        }
        Some(Reason::FirstAutoSelectable) => (
            NextBootReason::FirstInSortOrder,
            "no one-shot, EFI default or loader.conf default matches an entry, so the first \
             entry in menu order boots (highest version first, entries marked bad last)"
                .to_owned(),
        ),
    };
    // What was set but lost to a rule of lower precedence matched nothing (the rules are tried
    // in this order; see `slate_bootspec::select`).
    let rank = |r: &NextBootReason| match r {
        NextBootReason::OneShot { .. } => 0,
        NextBootReason::EfiDefault { .. } | NextBootReason::LastBooted { .. } => 1,
        NextBootReason::LoaderConfDefault { .. } => 2,
        _ => 3,
    };
    if selected.is_some() {
        if let Some(v) = vars.entry_oneshot.as_deref().filter(|_| rank(&reason) > 0) {
            warnings.push(lost("LoaderEntryOneShot", v));
        }
        if let Some(v) = vars.entry_default.as_deref().filter(|_| rank(&reason) > 1) {
            warnings.push(lost("LoaderEntryDefault", v));
        }
        if let Some(v) = conf_default.as_deref().filter(|_| rank(&reason) > 2) {
            warnings.push(lost("loader.conf default", v));
        }
    }
    let next = entries.iter().find(|e| e.next_boot);
    if let Some(e) = next.filter(|e| e.state == EntryState::Bad) {
        warnings.push(format!(
            "{} is marked bad and still boots: {}",
            e.name,
            if entries.iter().all(|e| e.state == EntryState::Bad) {
                "every entry is bad"
            } else {
                "a pattern matched it (systemd-boot matches bad entries too)"
            }
        ));
    }
    let renamed_to = next
        .and_then(|e| EntryName::parse(&e.name).ok())
        .and_then(|n| n.after_boot_attempt().ok().filter(|a| *a != n))
        .map(|a| a.file_name().to_owned());

    BootExplanation {
        loader: LoaderKind::SystemdBoot,
        next_boot: next.map(|e| e.name.clone()),
        entries,
        reason,
        reason_text,
        renamed_to,
        upgrade_tag: status.upgrade_tag.clone(),
        loader_conf_default: conf_default,
        efi_vars: Some(vars.into()),
        grubenv: None,
        warnings,
    }
}

/// The explanation for GRUB, from its [`GrubStatus`] (selection, fallback and slots as read).
pub fn grub(status: &GrubStatus) -> BootExplanation {
    let menu = grub_menu();
    let slot_of = |reference: Option<&str>| reference.and_then(|r| grub_entry_index(&menu, r));
    let next_entry = status.env.get_nonempty("next_entry");
    let from_record = status
        .selection
        .as_ref()
        .is_some_and(|s| s.saved_from_record);
    // The saved_entry GRUB goes by: grubenv's, or the second record's when grubenv names no
    // slot.
    let saved_entry = if from_record {
        status.record_entry()
    } else {
        status.env.get_nonempty("saved_entry")
    };
    let saved_name = if from_record {
        slate_esp::GRUB_DEFAULT_ENV_PATH
    } else {
        "grubenv"
    };
    // Where saved_entry came from, when it is not grubenv.
    let saved_from = if from_record {
        format!(" (from {saved_name})")
    } else {
        String::new()
    };
    let (next_idx, saved_idx) = (slot_of(next_entry), slot_of(saved_entry));
    let tag = status.upgrade_tag.as_deref().filter(|t| !t.is_empty());
    let tag_idx = slot_of(tag);
    let booted = status.booted_slot();

    let mut warnings = status.warnings.clone();
    warnings.extend(status.temp_files.iter().map(|t| {
        format!("{t}: left by an interrupted write; never booted, removed by the next upgrade")
    }));
    if let (Some(v), None) = (next_entry, next_idx) {
        warnings.push(format!(
            "grubenv next_entry={v} names no menu entry: GRUB starts the first entry and empties it"
        ));
    }
    if let (Some(v), None) = (saved_entry, saved_idx) {
        warnings.push(format!(
            "{saved_name} saved_entry={v} names no menu entry: GRUB has no fallback"
        ));
    }
    match (tag, tag_idx) {
        (Some(t), None) => warnings.push(format!(
            "META Upgrade names {t}, which is no slot: a failed upgrade has nothing to return to"
        )),
        (Some(t), Some(i)) if !status.slots[i].complete() => warnings.push(format!(
            "META Upgrade names slot {t}, which is incomplete: a failed upgrade cannot return to it"
        )),
        _ => {}
    }

    let entries = status
        .slots
        .iter()
        .zip(&menu)
        .enumerate()
        .map(|(i, (slot, item))| {
            let complete = slot.complete();
            let state = match (complete, tag_idx) {
                (false, _) => EntryState::Bad,
                // While an upgrade is uncommitted the other slot is on trial.
                (true, Some(t)) if t != i => EntryState::Indeterminate,
                (true, _) => EntryState::Good,
            };
            ExplainedEntry {
                position: i,
                name: slot.label.to_owned(),
                id: item.id.clone(),
                title: Some(item.title.clone()),
                version: slot.version().map(str::to_owned),
                tries_left: None,
                tries_done: None,
                state,
                fallback: tag_idx == Some(i),
                pinned: false,
                next_boot: booted == Some(slot.label),
                len: slot.kernel_len.unwrap_or(0) + slot.initramfs_len.unwrap_or(0),
                grub: Some(GrubSlotFacts {
                    complete,
                    saved_entry: saved_idx == Some(i),
                    next_entry: next_idx == Some(i),
                }),
            }
        })
        .collect();

    let label = |i: usize| GRUB_SLOTS.get(i).copied().unwrap_or("?");
    let after_one_shot = match saved_idx {
        Some(s) => format!(
            "saved_entry={}{saved_from} boots after it unless it is committed",
            label(s)
        ),
        None => "GRUB's first entry boots after it unless it is committed".to_owned(),
    };
    let (reason, reason_text) = match (&status.selection, booted) {
        (None, _) => (NextBootReason::NoEntry, "GRUB's menu is empty".to_owned()),
        (Some(sel), None) => (
            NextBootReason::NoEntry,
            format!(
                "slot {} is selected but incomplete, and saved_entry names no complete slot to \
                 fall back to",
                label(sel.index)
            ),
        ),
        (Some(sel), Some(b)) if label(sel.index) != b => (
            NextBootReason::GrubFallback {
                selected: label(sel.index).to_owned(),
            },
            format!(
                "slot {} is selected but incomplete (kernel, initramfs or cmdline.cfg missing): \
                 its menu entry fails and GRUB starts its fallback, saved_entry={b}{saved_from}",
                label(sel.index)
            ),
        ),
        (Some(sel), Some(_)) => match sel.reason {
            GrubReason::NextEntry => {
                let value = next_entry.unwrap_or_default().to_owned();
                let text = format!(
                    "grubenv next_entry={value} names it: a one-shot GRUB empties before \
                     starting it; {after_one_shot}"
                );
                (NextBootReason::GrubNextEntry { value }, text)
            }
            GrubReason::SavedEntry if from_record => {
                let value = saved_entry.unwrap_or_default().to_owned();
                let why = match &status.env_error {
                    Some(err) => format!("grubenv is unreadable ({err})"),
                    None => "grubenv's saved_entry names no slot".to_owned(),
                };
                let text = format!(
                    "{why}, so grub.cfg takes saved_entry={value} from slate's second record of \
                     the committed slot, {saved_name}, and no next_entry is set"
                );
                (NextBootReason::GrubDefaultRecord { value }, text)
            }
            GrubReason::SavedEntry => {
                let value = saved_entry.unwrap_or_default().to_owned();
                let text = format!("grubenv saved_entry={value} names it and no next_entry is set");
                (NextBootReason::GrubSavedEntry { value }, text)
            }
            GrubReason::FirstEntry => (
                NextBootReason::GrubFirst,
                match &status.env_error {
                    Some(err) => format!(
                        "grubenv is unreadable ({err}) and slate's second record names no slot, \
                         so GRUB starts the first entry"
                    ),
                    None => "neither grubenv next_entry nor saved_entry names a menu entry, so \
                             GRUB starts the first one"
                        .to_owned(),
                },
            ),
        },
    };

    BootExplanation {
        loader: LoaderKind::Grub,
        next_boot: booted.map(str::to_owned),
        entries,
        reason,
        reason_text,
        renamed_to: None,
        upgrade_tag: status.upgrade_tag.clone(),
        loader_conf_default: None,
        efi_vars: None,
        grubenv: Some(
            status
                .env
                .vars()
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .collect(),
        ),
        warnings,
    }
}

/// [`LoaderKind`] as the strings the API and `--output json` use.
mod loader_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::LoaderKind;

    pub(super) fn name(kind: LoaderKind) -> &'static str {
        match kind {
            LoaderKind::SystemdBoot => "systemd-boot",
            LoaderKind::Grub => "grub",
        }
    }

    pub(super) fn serialize<S: Serializer>(kind: &LoaderKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name(*kind))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LoaderKind, D::Error> {
        let text = String::deserialize(d)?;
        [LoaderKind::SystemdBoot, LoaderKind::Grub]
            .into_iter()
            .find(|k| name(*k) == text)
            .ok_or_else(|| serde::de::Error::unknown_variant(&text, &["systemd-boot", "grub"]))
    }
}

#[cfg(test)]
mod tests;
