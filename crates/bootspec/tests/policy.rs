//! Update policy: boot the newest version that is not bad; never prune the running version.

use proptest::prelude::*;
use slate_bootspec::{
    newest_not_bad, prune_candidates, refers_to, select, EfiVars, Entry, EntryName, IdStyle,
    LoaderConf, OsRelease,
};

fn uki(file: &str, version: &str) -> Entry {
    let osrel = OsRelease::parse(&format!("ID=slate\nVERSION_ID={version}\n"));
    Entry::uki(EntryName::parse(file).unwrap(), &osrel).unwrap()
}

fn files(entries: &[Entry], picks: &[String]) -> Vec<String> {
    picks
        .iter()
        .inspect(|f| assert!(entries.iter().any(|e| e.file_name() == f.as_str())))
        .cloned()
        .collect()
}

#[test]
fn newest_not_bad_skips_bad_entries_only() {
    let entries = [
        uki("slate-1.0.efi", "1.0"),
        uki("slate-1.2+0-3.efi", "1.2"),
        uki("slate-1.1+2-1.efi", "1.1"),
    ];
    assert_eq!(
        newest_not_bad(&entries),
        Some(2),
        "indeterminate counts as not bad"
    );
    assert_eq!(newest_not_bad(&entries[..2]), Some(0));
    assert_eq!(newest_not_bad(&entries[1..2]), None);
    assert_eq!(newest_not_bad(&[]), None);
}

#[test]
fn policy_agrees_with_the_loader_for_slate_layouts() {
    // slate's layout: UKIs with ID=slate, loader.conf `default slate-*`.
    let loader = slate_bootspec::parse_loader_conf("timeout 3\ndefault slate-*\n").unwrap();
    let layouts = [
        vec![uki("slate-1.0.efi", "1.0"), uki("slate-1.1+3.efi", "1.1")],
        vec![uki("slate-1.0.efi", "1.0"), uki("slate-1.1+0-3.efi", "1.1")],
        vec![
            uki("slate-1.9.efi", "1.9"),
            uki("slate-1.10+1-2.efi", "1.10"),
            uki("slate-1.8.efi", "1.8"),
        ],
    ];
    for entries in layouts {
        for style in [IdStyle::Sd252, IdStyle::Current] {
            let chosen = select(&entries, &loader, &EfiVars::default(), style)
                .unwrap()
                .index;
            assert_eq!(Some(chosen), newest_not_bad(&entries), "{style:?}");
        }
    }
}

#[test]
fn refers_to_survives_counter_renames() {
    let e = uki("slate-1.1+2-1.efi", "1.1");
    for reference in [
        "slate-1.1+2-1.efi",
        "slate-1.1+3.efi",
        "slate-1.1.efi",
        "SLATE-1.1.EFI",
        "\\EFI\\Linux\\slate-1.1+2-1.efi",
        "/efi/EFI/Linux/slate-1.1+1-2.efi",
    ] {
        assert!(refers_to(&e, reference), "{reference}");
    }
    assert!(!refers_to(&e, "slate-1.10.efi"));
    assert!(!refers_to(&e, ""));
}

#[test]
fn prune_keeps_running_and_fallback() {
    let entries = [
        uki("slate-1.0.efi", "1.0"),
        uki("slate-1.1.efi", "1.1"),
        uki("slate-1.2+0-3.efi", "1.2"),
        uki("slate-1.3.efi", "1.3"),
        uki("slate-1.4+2-1.efi", "1.4"),
    ];
    // Running 1.1, nothing else protected, keep 3: the bad one goes first, then the oldest.
    let picks = prune_candidates(&entries, "slate-1.1.efi", None, 3);
    assert_eq!(
        files(&entries, &picks),
        ["slate-1.2+0-3.efi", "slate-1.0.efi"]
    );
    // Keep 1: everything but the running entry, least valuable first.
    let picks = prune_candidates(&entries, "slate-1.1.efi", None, 1);
    assert_eq!(
        picks,
        [
            "slate-1.2+0-3.efi",
            "slate-1.0.efi",
            "slate-1.3.efi",
            "slate-1.4+2-1.efi"
        ]
    );
    // Running the oldest and a fallback: both stay even with keep 0.
    let picks = prune_candidates(&entries, "slate-1.0.efi", Some("slate-1.3.efi"), 0);
    assert_eq!(
        picks,
        ["slate-1.2+0-3.efi", "slate-1.1.efi", "slate-1.4+2-1.efi"]
    );
    // The running entry is named by its pre-rename file name.
    let picks = prune_candidates(&entries, "slate-1.4+3.efi", None, 2);
    assert!(!picks.contains(&"slate-1.4+2-1.efi".to_owned()));
    assert_eq!(picks.len(), 3);
    // Nothing to do.
    assert!(prune_candidates(&entries, "slate-1.1.efi", None, 5).is_empty());
}

fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
    let one = (0u8..20, 0u8..20, proptest::option::of((0u8..4, 0u8..4)));
    proptest::collection::vec(one, 0..10).prop_map(|specs| {
        specs
            .into_iter()
            .map(|(major, minor, counter)| {
                let counter = counter.map_or(String::new(), |(l, d)| format!("+{l}-{d}"));
                uki(
                    &format!("slate-{major}.{minor}{counter}.efi"),
                    &format!("{major}.{minor}"),
                )
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn prune_never_returns_running_or_fallback(
        entries in arb_entries(),
        running_pick in any::<prop::sample::Index>(),
        fallback_pick in proptest::option::of(any::<prop::sample::Index>()),
        keep in 0usize..6,
    ) {
        prop_assume!(!entries.is_empty());
        let running = entries[running_pick.index(entries.len())].file_name().to_owned();
        let fallback = fallback_pick.map(|i| entries[i.index(entries.len())].file_name().to_owned());
        let picks = prune_candidates(&entries, &running, fallback.as_deref(), keep);
        for pick in &picks {
            let e = entries.iter().find(|e| e.file_name() == pick.as_str()).unwrap();
            prop_assert!(!refers_to(e, &running));
            if let Some(f) = &fallback {
                prop_assert!(!refers_to(e, f));
            }
        }
        let protected = entries
            .iter()
            .filter(|e| refers_to(e, &running) || fallback.as_deref().is_some_and(|f| refers_to(e, f)))
            .count();
        prop_assert_eq!(picks.len(), (entries.len() - protected).saturating_sub(keep.saturating_sub(protected)));
        let _ = select(&entries, &LoaderConf::default(), &EfiVars::default(), IdStyle::Sd252);
    }
}
