//! `slate boot explain` on GRUB: the [`BootExplanation`] of a [`GrubStatus`] (selection,
//! fallback and slots as read), with where `saved_entry` came from when grubenv could not say.

use slate_bootspec::{grub_entry_index, GrubReason};
use slate_esp::GRUB_SLOTS;

use super::{menu as grub_menu, GrubStatus};
use crate::explain::{BootExplanation, EntryState, ExplainedEntry, GrubSlotFacts, NextBootReason};
use crate::LoaderKind;

/// The explanation for GRUB, from its [`GrubStatus`] (selection, fallback and slots as read).
pub(crate) fn explain(status: &GrubStatus) -> BootExplanation {
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
