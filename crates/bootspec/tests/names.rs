//! Boot-counting file names: parsing, the renames of systemd-boot and systemd-bless-boot, IDs.

use proptest::prelude::*;
use slate_bootspec::{BootCounter, BootState, EntryKind, EntryName, IdStyle, NameError};

fn name(s: &str) -> EntryName {
    EntryName::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

#[test]
fn parts_of_a_counted_name() {
    let n = name("slate-1.2.3+2-1.efi");
    assert_eq!(n.stem(), "slate-1.2.3");
    assert_eq!(n.suffix(), ".efi");
    assert_eq!(n.kind(), EntryKind::Type2Efi);
    assert_eq!(
        n.counter(),
        Some(BootCounter {
            tries_left: 2,
            tries_done: 1
        })
    );
    assert_eq!(n.state(), BootState::Indeterminate);
    assert_eq!(n.file_name(), "slate-1.2.3+2-1.efi");

    let n = name("Foo+0-3.CONF");
    assert_eq!(
        (n.stem(), n.suffix(), n.kind()),
        ("Foo", ".CONF", EntryKind::Type1Conf)
    );
    assert_eq!(n.state(), BootState::Bad);

    let n = name("slate-1.2.3.efi");
    assert_eq!(
        (n.stem(), n.counter(), n.state()),
        ("slate-1.2.3", None, BootState::Good)
    );
}

#[test]
fn padded_and_unpadded_counters() {
    for (file, left, done) in [
        ("a+3.efi", 3, 0),
        ("a+03.efi", 3, 0),
        ("a+03-00.efi", 3, 0),
        ("a+10.efi", 10, 0),
        ("a+09-01.efi", 9, 1),
        ("a+0.conf", 0, 0),
        ("a+00-0003.conf", 0, 3),
    ] {
        let n = name(file);
        assert_eq!(
            n.counter(),
            Some(BootCounter {
                tries_left: left,
                tries_done: done
            }),
            "{file}"
        );
        assert_eq!(n.file_name(), file, "spelling is kept");
    }
    // sd-boot writes unpadded decimal.
    assert_eq!(
        name("a+10.efi").after_boot_attempt().unwrap().file_name(),
        "a+9-1.efi"
    );
    assert_eq!(
        name("a+03-00.efi")
            .after_boot_attempt()
            .unwrap()
            .file_name(),
        "a+2-1.efi"
    );
}

#[test]
fn counter_only_after_the_last_plus_and_right_before_the_suffix() {
    let n = name("a+1+2-3.efi");
    assert_eq!(
        (n.stem(), n.counter().map(|c| c.tries_left)),
        ("a+1", Some(2))
    );
    for uncounted in [
        "a+3x.efi",
        "a+3.x.efi",
        "a+3+x.efi",
        "a+3-1-2.efi",
        "a+.efi",
        "a+2147483648.efi",
    ] {
        let n = name(uncounted);
        assert_eq!(n.counter(), None, "{uncounted}");
        assert_eq!(n.state(), BootState::Good, "{uncounted}");
        assert_eq!(n.id(IdStyle::Current), uncounted.to_ascii_lowercase());
    }
}

#[test]
fn simulated_boot_sequence() {
    let mut n = name("a+3.efi");
    let mut seen = vec![n.file_name().to_owned()];
    while n.state() != BootState::Bad {
        n = n.after_boot_attempt().unwrap();
        seen.push(n.file_name().to_owned());
    }
    assert_eq!(seen, ["a+3.efi", "a+2-1.efi", "a+1-2.efi", "a+0-3.efi"]);
    // Booted anyway (e.g. chosen in the menu): stays bad, counts up.
    assert_eq!(n.after_boot_attempt().unwrap().file_name(), "a+0-4.efi");
    // Uncounted entries are not renamed.
    assert_eq!(
        name("a.efi").after_boot_attempt().unwrap().file_name(),
        "a.efi"
    );
    // Type #1 works the same way (docs/formats.md example).
    let c = name("a+3.conf").after_boot_attempt().unwrap();
    assert_eq!(c.after_boot_attempt().unwrap().file_name(), "a+1-2.conf");
}

#[test]
fn blessed_and_marked_bad() {
    let tried = name("slate-2.0+2-1.efi");
    assert_eq!(tried.blessed().unwrap().file_name(), "slate-2.0.efi");
    assert_eq!(tried.blessed().unwrap().state(), BootState::Good);
    assert_eq!(tried.marked_bad().unwrap().file_name(), "slate-2.0+0-1.efi");
    assert_eq!(tried.marked_bad().unwrap().state(), BootState::Bad);
    // DONE == 0 (never renamed by the loader, or "-0"): "+0" alone, as bless-boot does.
    assert_eq!(name("x+3.efi").marked_bad().unwrap().file_name(), "x+0.efi");
    assert_eq!(
        name("x+3-0.efi").marked_bad().unwrap().file_name(),
        "x+0.efi"
    );
    // Suffix spelling is kept by bless-boot.
    assert_eq!(name("X+1-2.EFI").blessed().unwrap().file_name(), "X.EFI");
    // A good entry stays as it is when blessed; marking it bad adds "+0".
    assert_eq!(name("g.efi").blessed().unwrap().file_name(), "g.efi");
    assert_eq!(name("g.efi").marked_bad().unwrap().file_name(), "g+0.efi");
    // Round trips back to the same stem.
    for file in ["s+3.efi", "s+2-1.efi", "s+0-3.efi", "s.efi", "s+09-01.conf"] {
        let n = name(file);
        let bad = n.marked_bad().unwrap();
        assert_eq!(bad.stem(), n.stem());
        assert_eq!(
            bad.blessed().unwrap().file_name(),
            n.blessed().unwrap().file_name()
        );
        assert_eq!(
            bad.blessed().unwrap().with_tries(3).unwrap().file_name(),
            n.with_tries(3).unwrap().file_name()
        );
    }
    // bless-boot re-reads nothing, but the ESP does: a stem ending in +N becomes counted.
    assert_eq!(
        name("a+5+2-1.efi")
            .blessed()
            .unwrap()
            .counter()
            .map(|c| c.tries_left),
        Some(5)
    );
}

#[test]
fn with_tries_and_new() {
    let n = EntryName::new("slate-1.2.3", EntryKind::Type2Efi).unwrap();
    assert_eq!(n.file_name(), "slate-1.2.3.efi");
    assert_eq!(n.with_tries(3).unwrap().file_name(), "slate-1.2.3+3.efi");
    assert_eq!(
        name("a+1-2.efi").with_tries(5).unwrap().file_name(),
        "a+5.efi"
    );
    assert_eq!(
        n.with_tries(u32::MAX),
        Err(NameError::TriesOutOfRange { tries: u32::MAX })
    );
    assert_eq!(
        EntryName::new("slate+1", EntryKind::Type2Efi),
        Err(NameError::PlusInStem { offset: 5 })
    );
    let long = "a".repeat(250);
    assert_eq!(
        EntryName::new(&long, EntryKind::Type2Efi)
            .unwrap()
            .with_tries(3),
        Err(NameError::TooLong { len: 256 })
    );
}

#[test]
fn ids_in_both_styles() {
    let n = name("Slate-1.2+2-1.EFI");
    assert_eq!(n.id(IdStyle::Sd252), "slate-1.2+2-1.efi");
    assert_eq!(n.id(IdStyle::Current), "slate-1.2.efi");
    let good = name("Slate-1.2.efi");
    assert_eq!(good.id(IdStyle::Sd252), "slate-1.2.efi");
    assert_eq!(good.id(IdStyle::Current), "slate-1.2.efi");
    assert_eq!(name("foo+3-0.conf").id(IdStyle::Current), "foo.conf");
}

#[test]
fn invalid_names_are_refused_clearly() {
    let cases: [(&str, NameError); 8] = [
        ("", NameError::Empty),
        ("a b.efi", NameError::BadChar { ch: ' ', offset: 1 }),
        (
            "ä.efi",
            NameError::BadChar {
                ch: 'ä', offset: 0
            },
        ),
        (".hidden.efi", NameError::Hidden),
        ("AUTO-windows.efi", NameError::AutoPrefix),
        ("slate.img", NameError::NoSuffix),
        ("+3.efi", NameError::EmptyStem),
        ("a/b.efi", NameError::BadChar { ch: '/', offset: 1 }),
    ];
    for (file, err) in cases {
        assert_eq!(EntryName::parse(file), Err(err.clone()), "{file:?}");
        assert!(!err.to_string().is_empty());
    }
    assert_eq!(
        EntryName::parse(&format!("{}.efi", "a".repeat(252))),
        Err(NameError::TooLong { len: 256 })
    );
    assert!(EntryName::parse(&format!("{}.efi", "a".repeat(251))).is_ok());
    assert_eq!(
        EntryName::parse("auto.efi").map(|n| n.stem().to_owned()),
        Ok("auto".into())
    );
}

fn stem() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[A-Za-z0-9_][A-Za-z0-9_.+-]{0,40}").expect("valid regex")
}

/// A counter as written: tries left, its zero padding, and `-DONE` (value, padding) if present.
type WrittenCounter = Option<(u32, usize, Option<(u32, usize)>)>;

fn counter() -> impl Strategy<Value = WrittenCounter> {
    proptest::option::of((
        0u32..=1000,
        0usize..3,
        proptest::option::of((0u32..=1000, 0usize..3)),
    ))
}

fn write_counter(c: &WrittenCounter) -> String {
    match c {
        None => String::new(),
        Some((left, lpad, done)) => {
            let mut s = format!("+{}{left}", "0".repeat(*lpad));
            if let Some((done, dpad)) = done {
                s += &format!("-{}{done}", "0".repeat(*dpad));
            }
            s
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn parse_of_file_name_round_trips(
        stem in stem(),
        c in counter(),
        suffix in prop::sample::select(vec![".efi", ".conf", ".EFI", ".Conf"]),
    ) {
        prop_assume!(!stem.to_ascii_lowercase().starts_with("auto-"));
        let file = format!("{stem}{}{suffix}", write_counter(&c));
        let x = EntryName::parse(&file).unwrap();
        prop_assert_eq!(EntryName::parse(x.file_name()).unwrap(), x.clone());
        prop_assert_eq!(x.file_name(), file.as_str());
        if let Some((left, _, done)) = c {
            prop_assert_eq!(x.stem(), stem.as_str());
            prop_assert_eq!(x.counter(), Some(BootCounter {
                tries_left: left,
                tries_done: done.map_or(0, |d| d.0),
            }));
            let next = x.after_boot_attempt().unwrap();
            prop_assert_eq!(next.stem(), x.stem());
            prop_assert_eq!(next.counter().map(|c| c.tries_done), Some(done.map_or(0, |d| d.0) + 1));
        }
        for derived in [x.blessed(), x.marked_bad(), x.with_tries(3), x.after_boot_attempt()] {
            let derived = derived.unwrap();
            prop_assert_eq!(EntryName::parse(derived.file_name()).unwrap(), derived);
        }
    }

    #[test]
    fn parse_never_panics(s in any::<String>()) {
        let _ = EntryName::parse(&s);
    }
}
