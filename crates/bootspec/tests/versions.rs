//! UAPI.10 version order: every check vector of docs/formats.md §2, and order-relation properties.

use std::cmp::Ordering::{self, *};

use proptest::prelude::*;
use slate_bootspec::compare_versions;

/// docs/formats.md §2 (and systemd's own comment): strictly increasing.
const CHAIN: [&str; 12] = [
    "122.1",
    "123~rc1-1",
    "123",
    "123-a",
    "123-a.1",
    "123-1",
    "123-1.1",
    "123^post1",
    "123.a-1",
    "123.1-1",
    "123a-1",
    "124-1",
];

#[test]
fn chain_pairwise() {
    let mut checked = 0;
    for (i, a) in CHAIN.iter().enumerate() {
        for (j, b) in CHAIN.iter().enumerate() {
            assert_eq!(compare_versions(a, b), i.cmp(&j), "{a:?} vs {b:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 144);
}

#[test]
fn formats_md_vectors() {
    let vectors: [(&str, &str, Ordering); 5] = [
        ("", "0", Less),
        ("0.", "0", Greater),
        ("0", "~", Greater),
        ("B", "a", Less),
        ("1_2_3", "1.3.3", Greater),
    ];
    for (a, b, expected) in vectors {
        assert_eq!(compare_versions(a, b), expected, "{a:?} vs {b:?}");
        assert_eq!(compare_versions(b, a), expected.reverse(), "{b:?} vs {a:?}");
    }
}

#[test]
fn slate_versions() {
    assert_eq!(
        compare_versions("slate-1.10.0.efi", "slate-1.9.3.efi"),
        Greater
    );
    assert_eq!(
        compare_versions("slate-2.0~rc1.efi", "slate-1.99.efi"),
        Greater
    );
    assert_eq!(compare_versions("slate-2.0~rc1.efi", "slate-2.0.efi"), Less);
    assert_eq!(
        compare_versions("Talos-v1.9.0.efi", "Talos-v1.9.0~1.efi"),
        Greater
    );
}

/// Short strings over the characters that matter (`+` and `_` are separators).
fn version() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[0-9aAzZ.~^+_-]{0,8}").expect("valid regex")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn reflexive(a in version()) {
        prop_assert_eq!(compare_versions(&a, &a), Equal);
    }

    #[test]
    fn antisymmetric(a in version(), b in version()) {
        prop_assert_eq!(compare_versions(&a, &b), compare_versions(&b, &a).reverse());
    }

    #[test]
    fn transitive(a in version(), b in version(), c in version()) {
        let (ab, bc, ac) = (compare_versions(&a, &b), compare_versions(&b, &c), compare_versions(&a, &c));
        if ab != Greater && bc != Greater {
            prop_assert_ne!(ac, Greater, "{:?} <= {:?} <= {:?}", a, b, c);
        }
        if ab == Equal {
            prop_assert_eq!(ac, bc, "{:?} == {:?}, compared to {:?}", a, b, c);
        }
    }

    /// Transitivity again on near-equal triples, where random strings rarely land.
    #[test]
    fn transitive_on_variants(base in version(), x in version(), y in version(), z in version()) {
        let (a, b, c) = (format!("{base}{x}"), format!("{base}{y}"), format!("{base}{z}"));
        let mut sorted = [a, b, c];
        sorted.sort_by(|p, q| compare_versions(p, q));
        prop_assert_ne!(compare_versions(&sorted[0], &sorted[2]), Greater);
        prop_assert_ne!(compare_versions(&sorted[0], &sorted[1]), Greater);
        prop_assert_ne!(compare_versions(&sorted[1], &sorted[2]), Greater);
    }

    #[test]
    fn never_panics_on_any_text(a in any::<String>(), b in any::<String>()) {
        let _ = compare_versions(&a, &b);
    }
}
