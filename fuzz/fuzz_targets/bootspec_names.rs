//! Arbitrary bytes into slate-bootspec's readers: entry file names, loader.conf, version
//! comparison, globs, .osrel text and EFI variable bytes. Nothing may panic, and what parses
//! must keep its invariants (names round-trip; the version order is antisymmetric).
#![no_main]

use std::cmp::Ordering;

use libfuzzer_sys::fuzz_target;
use slate_bootspec::{
    compare_versions, decode_efivar_string, encode_efivar_string, fnmatch, parse_loader_conf,
    select, EfiVars, Entry, EntryName, IdStyle, OsRelease,
};

fn check_name(name: &EntryName) {
    assert_eq!(EntryName::parse(name.file_name()).as_ref(), Ok(name));
    for derived in [
        name.after_boot_attempt(),
        name.blessed(),
        name.marked_bad(),
        name.with_tries(3),
    ]
    .into_iter()
    .flatten()
    {
        assert_eq!(EntryName::parse(derived.file_name()).as_ref(), Ok(&derived));
    }
    let _ = (
        name.id(IdStyle::Sd252),
        name.id(IdStyle::Current),
        name.state(),
    );
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);

    if let Ok(name) = EntryName::parse(&text) {
        check_name(&name);
    }
    let conf = parse_loader_conf(&text);
    let _ = OsRelease::parse(&text);

    let (a, b) = text.split_once('\n').unwrap_or((&text, ""));
    let order = compare_versions(a, b);
    assert_eq!(compare_versions(b, a), order.reverse());
    assert_eq!(compare_versions(a, a), Ordering::Equal);
    let _ = fnmatch(a, b);

    if let Ok((7, value)) = decode_efivar_string(data) {
        let encoded = encode_efivar_string(&value);
        assert!(encoded == data || encoded[..encoded.len() - 2] == *data);
    }

    // Lines that are valid names become entries; the first line doubles as a pattern.
    let entries: Vec<Entry> = text
        .lines()
        .filter_map(|line| EntryName::parse(line).ok())
        .map(Entry::new)
        .collect();
    let vars = EfiVars {
        entry_oneshot: Some(a.to_owned()),
        ..EfiVars::default()
    };
    for style in [IdStyle::Sd252, IdStyle::Current] {
        let chosen = select(&entries, &conf.clone().unwrap_or_default(), &vars, style);
        assert_eq!(chosen.is_some(), !entries.is_empty());
    }
});
