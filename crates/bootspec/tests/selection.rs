//! Menu order and default selection, including a simulated update that fails to boot.

use proptest::prelude::*;
use slate_bootspec::{
    menu_ids, parse_loader_conf, select, sorted, BootState, EfiVars, Entry, EntryName, IdStyle,
    LoaderConf, OsRelease, Reason,
};

const STYLES: [IdStyle; 2] = [IdStyle::Sd252, IdStyle::Current];

fn uki(file: &str, version: &str) -> Entry {
    let osrel = OsRelease::parse(&format!(
        "ID=slate\nNAME=\"Slate OS\"\nPRETTY_NAME=\"Slate OS {version}\"\nVERSION_ID={version}\n"
    ));
    Entry::uki(EntryName::parse(file).unwrap(), &osrel).unwrap()
}

fn conf(text: &str) -> LoaderConf {
    parse_loader_conf(text).unwrap()
}

fn picked(
    entries: &[Entry],
    conf: &LoaderConf,
    vars: &EfiVars,
    style: IdStyle,
) -> (String, Reason) {
    let s = select(entries, conf, vars, style).unwrap();
    assert_eq!(entries[s.index].file_name(), s.file_name);
    (s.file_name, s.reason)
}

#[test]
fn uki_metadata_comes_from_osrel() {
    let e = uki("slate-1.2.efi", "1.2");
    assert_eq!(e.title.as_deref(), Some("Slate OS 1.2"));
    assert_eq!(e.version.as_deref(), Some("1.2"));
    assert_eq!(e.sort_key.as_deref(), Some("slate"));
    let image = OsRelease::parse("ID=debian\nIMAGE_ID=slate\nIMAGE_VERSION=7\nVERSION_ID=12\n");
    let e = Entry::uki(EntryName::parse("x.efi").unwrap(), &image).unwrap();
    assert_eq!(
        (
            e.title.as_deref(),
            e.version.as_deref(),
            e.sort_key.as_deref()
        ),
        (Some("slate"), Some("7"), Some("slate"))
    );
    assert!(Entry::uki(
        EntryName::parse("x.efi").unwrap(),
        &OsRelease::parse("VERSION_ID=1\n")
    )
    .is_none());
}

#[test]
fn failed_update_falls_back_to_the_older_good_version() {
    let loader = conf("timeout 3\ndefault slate-*\n");
    let vars = EfiVars::default();
    let old = uki("slate-1.0.efi", "1.0");
    let mut new_name = EntryName::parse("slate-1.1+3.efi").unwrap();
    for style in STYLES {
        let mut boots = Vec::new();
        loop {
            let entries = [old.clone(), uki(new_name.file_name(), "1.1")];
            let chosen = picked(&entries, &loader, &vars, style).0;
            if chosen != new_name.file_name() {
                boots.push(chosen);
                break;
            }
            new_name = new_name.after_boot_attempt().unwrap();
            boots.push(new_name.file_name().to_owned());
        }
        assert_eq!(
            boots,
            [
                "slate-1.1+2-1.efi",
                "slate-1.1+1-2.efi",
                "slate-1.1+0-3.efi",
                "slate-1.0.efi"
            ],
            "{style:?}"
        );
        assert_eq!(new_name.state(), BootState::Bad);
        let entries = [old.clone(), uki(new_name.file_name(), "1.1")];
        assert_eq!(
            menu_ids(&entries, IdStyle::Current),
            ["slate-1.0.efi", "slate-1.1.efi"],
            "bad sorts last"
        );
        new_name = EntryName::parse("slate-1.1+3.efi").unwrap();
    }
}

#[test]
fn successful_update_is_blessed_and_stays_first() {
    let loader = conf("default slate-*\n");
    let entries = [uki("slate-1.0.efi", "1.0"), uki("slate-1.1+2-1.efi", "1.1")];
    assert_eq!(
        picked(&entries, &loader, &EfiVars::default(), IdStyle::Sd252).0,
        "slate-1.1+2-1.efi"
    );
    let blessed = EntryName::parse("slate-1.1+2-1.efi")
        .unwrap()
        .blessed()
        .unwrap();
    let entries = [uki("slate-1.0.efi", "1.0"), uki(blessed.file_name(), "1.1")];
    assert_eq!(
        picked(&entries, &loader, &EfiVars::default(), IdStyle::Sd252).0,
        "slate-1.1.efi"
    );
}

#[test]
fn oneshot_beats_efi_default_beats_loader_conf() {
    let entries = [
        uki("slate-1.0.efi", "1.0"),
        uki("slate-1.1.efi", "1.1"),
        uki("slate-1.2.efi", "1.2"),
    ];
    let loader = conf("default slate-1.0.efi\n");
    let mut vars = EfiVars::default();
    assert_eq!(
        picked(&entries, &loader, &vars, IdStyle::Current),
        ("slate-1.0.efi".into(), Reason::LoaderConfDefault)
    );
    vars.entry_default = Some("SLATE-1.1.EFI".into());
    assert_eq!(
        picked(&entries, &loader, &vars, IdStyle::Current),
        ("slate-1.1.efi".into(), Reason::EfiDefault)
    );
    vars.entry_oneshot = Some("slate-1.2.efi".into());
    assert_eq!(
        picked(&entries, &loader, &vars, IdStyle::Current),
        ("slate-1.2.efi".into(), Reason::OneShot)
    );
    // A pattern that matches nothing falls through to the next source.
    vars.entry_oneshot = Some("nothing*".into());
    assert_eq!(
        picked(&entries, &loader, &vars, IdStyle::Current).1,
        Reason::EfiDefault
    );
    let s = select(
        &entries,
        &LoaderConf::default(),
        &EfiVars::default(),
        IdStyle::Current,
    )
    .unwrap();
    assert_eq!(
        (s.file_name.as_str(), s.reason, s.menu_position),
        ("slate-1.2.efi", Reason::FirstAutoSelectable, 0)
    );
}

#[test]
fn default_glob_picks_the_highest_version() {
    // Version order, not string order: 1.10 > 1.9; the prefix keeps other OSes out.
    let entries = [
        uki("slate-1.9.0.efi", "1.9.0"),
        uki("slate-1.10.0+3.efi", "1.10.0"),
        uki("slate-1.10.0-rc1.efi", "1.10.0~rc1"),
        Entry::new(EntryName::parse("zzz-99.efi").unwrap()),
    ];
    for style in STYLES {
        let (file, reason) = picked(
            &entries,
            &conf("default slate-*\n"),
            &EfiVars::default(),
            style,
        );
        assert_eq!(
            (file.as_str(), reason),
            ("slate-1.10.0+3.efi", Reason::LoaderConfDefault),
            "{style:?}"
        );
        let order: Vec<_> = sorted(&entries, style)
            .into_iter()
            .map(|i| entries[i].file_name())
            .collect();
        assert_eq!(
            order,
            [
                "slate-1.10.0+3.efi",
                "slate-1.10.0-rc1.efi",
                "slate-1.9.0.efi",
                "zzz-99.efi"
            ]
        );
    }
}

#[test]
fn default_glob_can_pick_a_bad_entry() {
    // systemd#31215: bad entries sort last, but an exact default still finds them.
    let entries = [uki("slate-1.0.efi", "1.0"), uki("slate-1.1+0-3.efi", "1.1")];
    let loader = conf("default slate-1.1*\n");
    let (file, reason) = picked(&entries, &loader, &EfiVars::default(), IdStyle::Sd252);
    assert_eq!(
        (file.as_str(), reason),
        ("slate-1.1+0-3.efi", Reason::LoaderConfDefault)
    );
    // All bad: the first in menu order (highest version) is booted anyway.
    let all_bad = [uki("a+0-3.efi", "1"), uki("b+0-1.efi", "2")];
    let s = select(
        &all_bad,
        &LoaderConf::default(),
        &EfiVars::default(),
        IdStyle::Current,
    )
    .unwrap();
    assert_eq!(
        (s.file_name.as_str(), s.reason),
        ("b+0-1.efi", Reason::FirstAutoSelectable)
    );
}

#[test]
fn id_style_decides_whether_an_exact_default_survives_a_counter_rename() {
    // Talos-style exact LoaderEntryDefault naming the UKI without its counter.
    let entries = [uki("slate-1.0.efi", "1.0"), uki("slate-0.9+2-1.efi", "0.9")];
    let vars = EfiVars {
        entry_default: Some("slate-0.9.efi".into()),
        ..EfiVars::default()
    };
    let loader = LoaderConf::default();
    assert_eq!(
        picked(&entries, &loader, &vars, IdStyle::Current),
        ("slate-0.9+2-1.efi".into(), Reason::EfiDefault)
    );
    assert_eq!(
        picked(&entries, &loader, &vars, IdStyle::Sd252),
        ("slate-1.0.efi".into(), Reason::FirstAutoSelectable)
    );
    assert_eq!(
        menu_ids(&entries, IdStyle::Sd252),
        ["slate-1.0.efi", "slate-0.9+2-1.efi"]
    );
}

#[test]
fn saved_entry() {
    let entries = [uki("slate-1.0.efi", "1.0"), uki("slate-1.1.efi", "1.1")];
    let last = Some("slate-1.0.efi".to_owned());
    let vars = EfiVars {
        entry_default: Some("@saved".into()),
        entry_last_booted: last.clone(),
        ..EfiVars::default()
    };
    assert_eq!(
        picked(&entries, &LoaderConf::default(), &vars, IdStyle::Current),
        ("slate-1.0.efi".into(), Reason::LastBooted)
    );
    let vars = EfiVars {
        entry_last_booted: last,
        ..EfiVars::default()
    };
    assert_eq!(
        picked(&entries, &conf("default @SAVED\n"), &vars, IdStyle::Current),
        ("slate-1.0.efi".into(), Reason::LastBooted)
    );
}

#[test]
fn sort_rules() {
    let mut type1 = Entry::new(EntryName::parse("old-style-9.conf").unwrap());
    type1.version = Some("9".into());
    let mut other_os = uki("aaa-1.efi", "1");
    other_os.sort_key = Some("aaa".into());
    let mut with_machine = uki("slate-0.1.efi", "0.1");
    with_machine.machine_id = Some("0123456789abcdef0123456789abcdef".into());
    let entries = [
        type1,
        uki("slate-2.0+1-2.efi", "2.0"),
        uki("slate-2.0+2-1.efi", "2.0"),
        with_machine,
        other_os,
        uki("slate-3.0+0-3.efi", "3.0"),
        uki("slate-1.0.efi", "1.0"),
    ];
    let order: Vec<_> = sorted(&entries, IdStyle::Current)
        .into_iter()
        .map(|i| entries[i].file_name())
        .collect();
    assert_eq!(
        order,
        [
            "aaa-1.efi",         // sort key "aaa" < "slate"
            "slate-2.0+2-1.efi", // same ID: more tries left first
            "slate-2.0+1-2.efi",
            "slate-1.0.efi", // no machine ID sorts before one
            "slate-0.1.efi",
            "old-style-9.conf",  // no sort key: after all with one
            "slate-3.0+0-3.efi", // bad: last
        ]
    );
}

fn arb_entry() -> impl Strategy<Value = Entry> {
    let file = proptest::string::string_regex(
        "(slate|other|Slate)-[0-9]{1,2}(\\.[0-9a_]{1,2})?(\\+[0-3](-[0-3])?)?\\.(efi|conf)",
    )
    .expect("valid regex");
    let text = || {
        proptest::option::of(
            proptest::string::string_regex("[a-z0-9.~-]{0,5}").expect("valid regex"),
        )
    };
    (file, text(), text(), text()).prop_map(|(file, version, sort_key, machine_id)| Entry {
        name: EntryName::parse(&file).expect("generated names are valid"),
        title: None,
        version,
        sort_key,
        machine_id,
    })
}

fn arb_pattern() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(
        proptest::string::string_regex("[a-zA-Z0-9.*?+\\[\\]!@-]{0,12}").expect("valid regex"),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn select_always_picks_an_entry(
        entries in proptest::collection::vec(arb_entry(), 0..8),
        default in arb_pattern(),
        oneshot in arb_pattern(),
        efi_default in arb_pattern(),
        last in arb_pattern(),
    ) {
        let loader = LoaderConf { default, ..LoaderConf::default() };
        let vars = EfiVars { entry_oneshot: oneshot, entry_default: efi_default, entry_last_booted: last };
        for style in STYLES {
            let order = sorted(&entries, style);
            let mut seen = order.clone();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..entries.len()).collect::<Vec<_>>());
            match select(&entries, &loader, &vars, style) {
                None => prop_assert!(entries.is_empty()),
                Some(s) => {
                    prop_assert!(s.index < entries.len());
                    prop_assert_eq!(order[s.menu_position], s.index);
                    prop_assert_eq!(&s.id, &entries[s.index].id(style));
                    if s.reason == Reason::FirstAutoSelectable {
                        prop_assert_eq!(s.menu_position, 0);
                    }
                }
            }
            // Bad entries never precede others in the menu.
            let bad: Vec<bool> = order.iter().map(|&i| entries[i].state() == BootState::Bad).collect();
            prop_assert!(bad.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
