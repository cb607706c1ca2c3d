//! What the boot loader will do next, and why, as one value for both loaders: every entry in
//! menu order with its version, boot counter, state and whether it is the fallback in META
//! `Upgrade`, the entry that boots next and the rule that picked it (`slate boot explain`, and
//! machined over the API).
//!
//! Each loader builds it in its own component (`sdboot/explain.rs`, `grub/explain.rs`), from
//! values its backend has already read. The choice itself is never recomputed there: it is the
//! backend's [`Selection`](slate_bootspec::Selection) or
//! [`GrubSelection`](slate_bootspec::GrubSelection), so `explain` and `upgrade`/`commit`/
//! `revert` cannot disagree.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use slate_bootspec::BootState;

use crate::LoaderKind;

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
