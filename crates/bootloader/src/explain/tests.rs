//! The reasons both loaders' `explain` gives, over statuses built as the backends build them.

use slate_bootspec::{select, EfiVars, Entry, EntryName, GrubEnv, IdStyle, LoaderConf};
use slate_esp::{FatSpace, GRUB_SLOTS};

use super::*;
use crate::grub::explain::explain as grub;
use crate::grub::{menu as grub_menu, GrubStatus, SlotStatus};
use crate::sdboot::explain::explain as systemd_boot;
use crate::{BootStatus, EntryStatus};

/// A systemd-boot status the way the backend builds it: the entries in directory order
/// (`files`), the selection by the model over them.
fn sd_status(files: &[&str], conf_default: Option<&str>, vars: &EfiVars) -> BootStatus {
    let model: Vec<Entry> = files
        .iter()
        .map(|f| {
            let mut e = Entry::new(EntryName::parse(f).unwrap());
            e.version = e.name.stem().strip_prefix("slate-").map(str::to_owned);
            e
        })
        .collect();
    let conf = LoaderConf {
        default: conf_default.map(str::to_owned),
        ..LoaderConf::default()
    };
    BootStatus {
        entries: model
            .iter()
            .map(|e| EntryStatus {
                file_name: e.file_name().to_owned(),
                version: e.version.clone(),
                state: e.state(),
                len: 1000,
            })
            .collect(),
        temp_files: vec![],
        selected: select(&model, &conf, vars, IdStyle::Sd252),
        loader_conf: Some(conf),
        upgrade_tag: None,
        pinned: Vec::new(),
        free_bytes: 0,
        warnings: vec![],
    }
}

fn vars(oneshot: Option<&str>, default: Option<&str>, last: Option<&str>) -> EfiVars {
    EfiVars {
        entry_oneshot: oneshot.map(str::to_owned),
        entry_default: default.map(str::to_owned),
        entry_last_booted: last.map(str::to_owned),
    }
}

fn names(x: &BootExplanation) -> Vec<&str> {
    x.entries.iter().map(|e| e.name.as_str()).collect()
}

const MID_UPGRADE: [&str; 2] = ["slate-1.0.0+3.efi", "slate-2.0.0+3.efi"];

#[test]
fn loader_conf_pattern_mid_upgrade() {
    let v = EfiVars::default();
    let mut status = sd_status(&MID_UPGRADE, Some("slate-*"), &v);
    status.upgrade_tag = Some("slate-1.0.0+3.efi".into());
    let x = systemd_boot(&status, &v, IdStyle::Sd252);
    assert_eq!(names(&x), ["slate-2.0.0+3.efi", "slate-1.0.0+3.efi"]);
    assert_eq!(x.next_boot.as_deref(), Some("slate-2.0.0+3.efi"));
    assert_eq!(
        x.reason,
        NextBootReason::LoaderConfDefault {
            pattern: "slate-*".into()
        }
    );
    assert!(
        x.reason_text.contains("default slate-*"),
        "{}",
        x.reason_text
    );
    assert_eq!(x.renamed_to.as_deref(), Some("slate-2.0.0+2-1.efi"));
    let [new, old] = &x.entries[..] else {
        panic!("{x:?}")
    };
    assert!(new.next_boot && !new.fallback);
    assert!(old.fallback && !old.next_boot);
    assert_eq!((new.position, old.position), (0, 1));
    assert_eq!((new.tries_left, new.tries_done), (Some(3), Some(0)));
    assert_eq!(new.state, EntryState::Indeterminate);
    assert_eq!(new.version.as_deref(), Some("2.0.0"));
    assert_eq!(new.id, "slate-2.0.0+3.efi");
    assert!(x.warnings.is_empty(), "{:?}", x.warnings);
}

#[test]
fn the_fallback_is_found_after_a_counter_rename() {
    let v = EfiVars::default();
    let mut status = sd_status(
        &["slate-1.0.0+3.efi", "slate-2.0.0+2-1.efi"],
        Some("slate-*"),
        &v,
    );
    status.upgrade_tag = Some("slate-1.0.0+3.efi".into());
    let x = systemd_boot(&status, &v, IdStyle::Sd252);
    assert_eq!(x.entries[1].name, "slate-1.0.0+3.efi");
    assert!(x.entries[1].fallback);
    assert_eq!(
        (x.entries[0].tries_left, x.entries[0].tries_done),
        (Some(2), Some(1))
    );
    status.upgrade_tag = Some("slate-0.9.efi".into());
    let x = systemd_boot(&status, &v, IdStyle::Sd252);
    assert!(x.entries.iter().all(|e| !e.fallback));
    assert!(x.warnings[0].contains("META Upgrade names slate-0.9.efi"));
}

#[test]
fn one_shot_wins_over_everything() {
    let v = vars(Some("SLATE-1.0.0+3.EFI"), Some("slate-2.0.0+3.efi"), None);
    let x = systemd_boot(
        &sd_status(&MID_UPGRADE, Some("slate-*"), &v),
        &v,
        IdStyle::Sd252,
    );
    assert_eq!(x.next_boot.as_deref(), Some("slate-1.0.0+3.efi"));
    assert_eq!(
        x.reason,
        NextBootReason::OneShot {
            pattern: "SLATE-1.0.0+3.EFI".into()
        }
    );
    assert!(x.reason_text.contains("this boot only"));
    assert_eq!(
        x.efi_vars.as_ref().and_then(|e| e.oneshot.as_deref()),
        Some("SLATE-1.0.0+3.EFI")
    );
    assert!(x.entries[1].next_boot && !x.entries[0].next_boot);
    assert!(x.warnings.is_empty(), "{:?}", x.warnings);
}

#[test]
fn efi_default_wins_over_loader_conf_and_a_stale_one_shot_is_named() {
    let v = vars(Some("nothing*"), Some("slate-1.0.0*"), None);
    let x = systemd_boot(
        &sd_status(&MID_UPGRADE, Some("slate-*"), &v),
        &v,
        IdStyle::Sd252,
    );
    assert_eq!(x.next_boot.as_deref(), Some("slate-1.0.0+3.efi"));
    assert_eq!(
        x.reason,
        NextBootReason::EfiDefault {
            pattern: "slate-1.0.0*".into()
        }
    );
    assert_eq!(x.warnings.len(), 1, "{:?}", x.warnings);
    assert!(x.warnings[0].starts_with("LoaderEntryOneShot=nothing* matches no entry"));
}

#[test]
fn saved_default_uses_last_booted() {
    let v = vars(None, Some("@saved"), Some("slate-1.0.0+3.efi"));
    let x = systemd_boot(
        &sd_status(&MID_UPGRADE, Some("slate-*"), &v),
        &v,
        IdStyle::Sd252,
    );
    assert_eq!(x.next_boot.as_deref(), Some("slate-1.0.0+3.efi"));
    assert_eq!(
        x.reason,
        NextBootReason::LastBooted {
            id: "slate-1.0.0+3.efi".into()
        }
    );
    assert!(x.reason_text.starts_with("LoaderEntryDefault is @saved"));
}

#[test]
fn a_bad_entry_sorts_last() {
    let v = EfiVars::default();
    let files = ["slate-2.0.0+0-3.efi", "slate-1.0.0.efi"];
    for conf in [None, Some("slate-*")] {
        let x = systemd_boot(&sd_status(&files, conf, &v), &v, IdStyle::Sd252);
        assert_eq!(
            names(&x),
            ["slate-1.0.0.efi", "slate-2.0.0+0-3.efi"],
            "{conf:?}"
        );
        assert_eq!(x.next_boot.as_deref(), Some("slate-1.0.0.efi"));
        assert_eq!(x.entries[1].state, EntryState::Bad);
        assert_eq!(x.entries[0].state, EntryState::Good);
        assert_eq!(x.renamed_to, None, "an uncounted entry is not renamed");
        match conf {
            None => {
                assert_eq!(x.reason, NextBootReason::FirstInSortOrder);
                assert!(x.reason_text.contains("first entry in menu order"));
            }
            Some(p) => assert_eq!(
                x.reason,
                NextBootReason::LoaderConfDefault { pattern: p.into() }
            ),
        }
    }
    // A pattern naming one version picks it even when bad (systemd#31215): said so.
    let x = systemd_boot(&sd_status(&files, Some("slate-2*"), &v), &v, IdStyle::Sd252);
    assert_eq!(x.next_boot.as_deref(), Some("slate-2.0.0+0-3.efi"));
    assert!(
        x.warnings
            .iter()
            .any(|w| w.contains("marked bad and still boots")),
        "{:?}",
        x.warnings
    );
    // A loader.conf default that matches nothing falls through to the sort order.
    let x = systemd_boot(&sd_status(&files, Some("other-*"), &v), &v, IdStyle::Sd252);
    assert_eq!(x.reason, NextBootReason::FirstInSortOrder);
    assert!(x.warnings[0].starts_with("loader.conf default=other-* matches no entry"));
}

#[test]
fn no_entry_means_nothing_boots() {
    let v = EfiVars::default();
    let x = systemd_boot(&sd_status(&[], Some("slate-*"), &v), &v, IdStyle::Sd252);
    assert_eq!((x.next_boot, x.reason), (None, NextBootReason::NoEntry));
}

#[test]
fn json_shape_and_round_trip() {
    let v = vars(None, None, None);
    let mut status = sd_status(&MID_UPGRADE, Some("slate-*"), &v);
    status.upgrade_tag = Some("slate-1.0.0+3.efi".into());
    let x = systemd_boot(&status, &v, IdStyle::Sd252);
    let json = serde_json::to_value(&x).unwrap();
    assert_eq!(json["loader"], "systemd-boot");
    assert_eq!(json["reason"]["kind"], "loader_conf_default");
    assert_eq!(json["reason"]["pattern"], "slate-*");
    assert_eq!(json["entries"][0]["state"], "indeterminate");
    assert!(json["efi_vars"]
        .as_object()
        .unwrap()
        .contains_key("LoaderEntryOneShot"));
    let back: BootExplanation = serde_json::from_value(json).unwrap();
    assert_eq!(back, x);

    let g = grub(&grub_status(&[("saved_entry", "A")], &[true, false], None));
    let json = serde_json::to_value(&g).unwrap();
    assert_eq!(json["loader"], "grub");
    assert_eq!(json["reason"]["kind"], "grub_saved_entry");
    assert_eq!(serde_json::from_value::<BootExplanation>(json).unwrap(), g);
    let bad = serde_json::to_string(&g)
        .unwrap()
        .replace("\"grub\"", "\"lilo\"");
    assert!(serde_json::from_str::<BootExplanation>(&bad).is_err());
}

/// Slot A holds 1.0.0, B 2.0.0 (when `complete`), grubenv as given.
fn grub_status(env: &[(&str, &str)], complete: &[bool; 2], tag: Option<&str>) -> GrubStatus {
    let mut block = GrubEnv::new();
    for (n, v) in env {
        block.set(n, v).unwrap();
    }
    let slots = GRUB_SLOTS
        .iter()
        .zip(complete)
        .zip(["1.0.0", "2.0.0"])
        .map(|((&label, &full), version)| SlotStatus {
            label,
            kernel_len: Some(100),
            initramfs_len: full.then_some(200),
            config: full.then(|| (version.to_owned(), "console=ttyS0".to_owned())),
        })
        .collect();
    GrubStatus {
        slots,
        selection: slate_bootspec::grub_select(Some(&block), &grub_menu()),
        env: block,
        env_error: None,
        default_record: None,
        upgrade_tag: tag.map(str::to_owned),
        temp_files: vec![],
        space: FatSpace {
            cluster_size: 4096,
            free_clusters: 0,
        },
        warnings: vec![],
    }
}

#[test]
fn grub_next_entry_then_saved_entry() {
    let staged = [("saved_entry", "A"), ("next_entry", "B")];
    let x = grub(&grub_status(&staged, &[true, true], Some("A")));
    assert_eq!(names(&x), ["A", "B"]);
    assert_eq!(x.next_boot.as_deref(), Some("B"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubNextEntry { value: "B".into() }
    );
    assert!(
        x.reason_text.contains("saved_entry=A boots after it"),
        "{}",
        x.reason_text
    );
    let [a, b] = &x.entries[..] else {
        panic!("{x:?}")
    };
    assert!(a.fallback && !a.next_boot && a.state == EntryState::Good);
    assert!(b.next_boot && !b.fallback && b.state == EntryState::Indeterminate);
    assert_eq!(
        a.grub.as_ref().map(|g| (g.saved_entry, g.next_entry)),
        Some((true, false))
    );
    assert_eq!(
        b.grub.as_ref().map(|g| (g.saved_entry, g.next_entry)),
        Some((false, true))
    );
    assert_eq!(
        (a.title.as_deref(), b.version.as_deref()),
        (Some("slate A"), Some("2.0.0"))
    );
    assert_eq!(x.grubenv.as_ref().unwrap()["next_entry"], "B");
    assert!(x.warnings.is_empty(), "{:?}", x.warnings);

    // The one-shot consumed, nothing committed: back to saved_entry.
    let consumed = [("saved_entry", "A"), ("next_entry", "")];
    let x = grub(&grub_status(&consumed, &[true, true], Some("A")));
    assert_eq!(x.next_boot.as_deref(), Some("A"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubSavedEntry { value: "A".into() }
    );

    // Committed: B is saved_entry, the tag gone, both slots good.
    let x = grub(&grub_status(&[("saved_entry", "B")], &[true, true], None));
    assert_eq!(x.next_boot.as_deref(), Some("B"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubSavedEntry { value: "B".into() }
    );
    assert!(x
        .entries
        .iter()
        .all(|e| e.state == EntryState::Good && !e.fallback));
}

#[test]
fn grub_falls_back_from_an_incomplete_slot_and_defaults_to_the_first() {
    let staged = [("saved_entry", "A"), ("next_entry", "B")];
    let x = grub(&grub_status(&staged, &[true, false], Some("A")));
    assert_eq!(x.next_boot.as_deref(), Some("A"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubFallback {
            selected: "B".into()
        }
    );
    assert_eq!(x.entries[1].state, EntryState::Bad);

    let x = grub(&grub_status(&[], &[true, false], None));
    assert_eq!(x.next_boot.as_deref(), Some("A"));
    assert_eq!(x.reason, NextBootReason::GrubFirst);

    let x = grub(&grub_status(&[("next_entry", "Z")], &[true, true], None));
    assert_eq!(x.reason, NextBootReason::GrubFirst);
    assert!(x.warnings[0].contains("next_entry=Z names no menu entry"));

    // Selected B incomplete and no saved_entry to fall back to: nothing boots.
    let x = grub(&grub_status(&[("next_entry", "B")], &[true, false], None));
    assert_eq!((x.next_boot, x.reason), (None, NextBootReason::NoEntry));
}

/// issue 18: a corrupted grubenv — GRUB loads nothing from it, and grub.cfg takes saved_entry
/// from the second record: explain says so, and names the damage.
#[test]
fn grub_an_unreadable_grubenv_falls_back_to_the_second_record() {
    let mut status = grub_status(&[], &[true, true], None);
    let record = crate::grub::config::default_record("B");
    let err = slate_bootspec::GrubEnvError::MissingSignature;
    status.selection = slate_bootspec::grub_select_with_record(None, Some(&record), &grub_menu());
    status.env_error = Some(err.clone());
    status.default_record = Some(Ok(record));
    let x = grub(&status);
    assert_eq!(x.next_boot.as_deref(), Some("B"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubDefaultRecord { value: "B".into() }
    );
    assert!(
        x.reason_text.contains("grubenv is unreadable")
            && x.reason_text
                .contains("saved_entry=B from slate's second record")
            && x.reason_text.contains("grub/slate-default.env"),
        "{}",
        x.reason_text
    );
    assert!(x.entries[1].grub.as_ref().unwrap().saved_entry);
    let json = serde_json::to_value(&x).unwrap();
    assert_eq!(json["reason"]["kind"], "grub_default_record");

    // No record to fall back to: the first entry, and the text says why.
    status.selection = slate_bootspec::grub_select_with_record(None, None, &grub_menu());
    status.default_record = None;
    let x = grub(&status);
    assert_eq!(
        (x.next_boot.as_deref(), &x.reason),
        (Some("A"), &NextBootReason::GrubFirst)
    );
    assert!(
        x.reason_text.contains("grubenv is unreadable"),
        "{}",
        x.reason_text
    );
}
