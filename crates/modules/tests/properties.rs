//! Property tests: the parser never panics, and resolution of any acyclic modules.dep yields
//! the full closure, dependencies first, deterministically.

use proptest::prelude::*;
use slate_modules::{ModuleDeps, ModulesError};

/// Text built from the characters modules.dep is made of, so random input often gets deep
/// into the parser instead of failing on the first byte.
fn dep_like_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("a.ko".to_owned()),
            Just("b/c-d.ko.xz".to_owned()),
            Just("b/c_d.ko".to_owned()),
            Just("e.ko.zst".to_owned()),
            Just(":".to_owned()),
            Just(" ".to_owned()),
            Just("\n".to_owned()),
            Just("\r\n".to_owned()),
            Just("#".to_owned()),
            Just("/".to_owned()),
            Just("..".to_owned()),
            "[a-z.\\-_/: \\t\\n]{0,8}",
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

/// A random DAG: module `i` may only depend on modules `< i`, written in shuffled line order.
fn dag() -> impl Strategy<Value = (Vec<Vec<usize>>, Vec<usize>)> {
    (1usize..30).prop_flat_map(|n| {
        let edges = (0..n)
            .map(|i| proptest::collection::btree_set(0..i.max(1), 0..=i.min(4)))
            .collect::<Vec<_>>();
        (
            edges.prop_map(|sets| {
                sets.into_iter()
                    .enumerate()
                    .map(|(i, s)| s.into_iter().filter(|&d| d < i).collect())
                    .collect::<Vec<Vec<usize>>>()
            }),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
        )
    })
}

fn path(i: usize) -> String {
    format!("kernel/m/mod-{i}.ko")
}

proptest! {
    #[test]
    fn parser_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
        let _ = ModuleDeps::parse(&text);
        let _ = ModuleDeps::default().with_builtin(&text);
    }

    #[test]
    fn parser_and_resolver_never_panic_on_dep_like_text(text in dep_like_text()) {
        if let Ok(deps) = ModuleDeps::parse(&text) {
            let names: Vec<String> = deps.iter().map(|(n, _)| n.to_owned()).collect();
            match deps.resolve(&names) {
                Ok(order) => prop_assert_eq!(order.len(), deps.len()),
                Err(ModulesError::Cycle { cycle }) => prop_assert!(cycle.len() >= 2),
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }
    }

    #[test]
    fn resolution_is_closed_ordered_and_deterministic(
        (edges, line_order) in dag(),
        requested in proptest::collection::vec(0usize..30, 1..5),
    ) {
        let n = edges.len();
        let text: String = line_order
            .iter()
            .map(|&i| {
                let deps: Vec<String> = edges[i].iter().map(|&d| path(d)).collect();
                format!("{}: {}\n", path(i), deps.join(" "))
            })
            .collect();
        let deps = ModuleDeps::parse(&text).unwrap();
        let requested: Vec<String> =
            requested.into_iter().map(|i| format!("mod_{}", i % n)).collect();
        let order = deps.resolve(&requested).unwrap();
        prop_assert_eq!(&order, &deps.resolve(&requested).unwrap());

        // Closure: every requested module and every dependency of an included module.
        let index = |p: &str| order.iter().position(|q| *q == p);
        for name in &requested {
            let i: usize = name.trim_start_matches("mod_").parse().unwrap();
            prop_assert!(index(&path(i)).is_some());
        }
        let mut unique = order.clone();
        unique.sort_unstable();
        unique.dedup();
        prop_assert_eq!(unique.len(), order.len());
        for (pos, p) in order.iter().enumerate() {
            let i: usize = p.trim_start_matches("kernel/m/mod-").trim_end_matches(".ko").parse().unwrap();
            for &d in &edges[i] {
                let dpos = index(&path(d));
                prop_assert!(dpos.is_some_and(|dpos| dpos < pos), "{} before {}", path(d), p);
            }
        }
    }
}
