//! `slate boot explain` on systemd-boot: the [`BootExplanation`] of a [`BootStatus`] and the
//! EFI variables its selection consulted. Only the menu order is derived here, with the same
//! [`slate_bootspec::sorted`] the selection uses.

use slate_bootspec::{sorted, Entry, EntryName, IdStyle, Reason};
use slate_esp::UKI_DIR;

use crate::explain::{BootExplanation, EntryState, ExplainedEntry, NextBootReason};
use crate::{BootStatus, EntryStatus, LoaderKind};

/// The explanation for systemd-boot, from its [`BootStatus`], the EFI variables its selection
/// consulted and the ID style it used.
pub(crate) fn explain(
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
