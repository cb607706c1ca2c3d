//! No crate's modules import each other in a circle. A layer that imports the one above it
//! (machined's `sequences` naming a mount point its tasks import back, issue 37) ties every
//! module of the circle to every other: none can be read, tested or moved alone.
//!
//! The check walks each crate's module tree from `lib.rs` or `main.rs` along `mod name;`
//! (test modules left out), reads the paths each file names through `crate::` or `super::`,
//! and takes the longest prefix of each that is a module as what the file imports. A
//! module's own children, named by bare paths, are its business and do not count; nor does
//! the crate root, which re-exports. Files are the unit: an inline module is its file's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::source::{
    blank_comments_and_literals, declared_modules, module_files, paths, tokens, without_test_items,
};
use crate::workspace;

/// One module file of a crate, by its path from the crate root (empty: the root).
#[derive(Debug)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// Every module of the crate whose root file is `root`, root first.
fn module_tree(root: &Path) -> Vec<Module> {
    let mut modules = vec![Module {
        path: Vec::new(),
        file: root.to_owned(),
    }];
    let mut next = 0;
    while next < modules.len() {
        let (parent, file) = (modules[next].path.clone(), modules[next].file.clone());
        let source = std::fs::read_to_string(&file).unwrap();
        let (kept, _) = without_test_items(&tokens(&blank_comments_and_literals(&source)));
        for name in declared_modules(&kept) {
            let candidates = module_files(&file, &name);
            let found = candidates.iter().find(|c| c.is_file()).unwrap_or_else(|| {
                panic!(
                    "{}: `mod {name};` is in none of {candidates:?} (a #[path] outside tests?)",
                    file.display()
                )
            });
            let mut path = parent.clone();
            path.push(name);
            modules.push(Module {
                path,
                file: found.clone(),
            });
        }
        next += 1;
    }
    modules
}

/// For each module (by index), the modules of its crate it imports.
fn imports(modules: &[Module]) -> Vec<BTreeSet<usize>> {
    let index: BTreeMap<&[String], usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.path.as_slice(), i))
        .collect();
    modules
        .iter()
        .enumerate()
        .map(|(me, module)| {
            let source = std::fs::read_to_string(&module.file).unwrap();
            let (kept, _) = without_test_items(&tokens(&blank_comments_and_literals(&source)));
            paths(&kept)
                .into_iter()
                .filter_map(|(_, path)| absolute(&module.path, &path))
                .filter_map(|path| {
                    (1..=path.len())
                        .rev()
                        .find_map(|n| index.get(&path[..n]).copied())
                })
                .filter(|&target| target != me)
                .collect()
        })
        .collect()
}

/// `path` as named from module `at`, from the crate root; `None` unless it starts with
/// `crate` or `super`.
fn absolute(at: &[String], path: &[String]) -> Option<Vec<String>> {
    match path.first().map(String::as_str) {
        Some("crate") => Some(path[1..].to_vec()),
        Some("super") => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            let base = at.get(..at.len().checked_sub(supers)?)?;
            Some([base, &path[supers..]].concat())
        }
        _ => None,
    }
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(graph: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct Walk<'g> {
        graph: &'g [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in self.graph[v].iter() {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort_unstable();
                    self.found.push(component);
                }
            }
        }
    }
    let n = graph.len();
    let mut walk = Walk {
        graph,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// The cycles of the crate rooted at `root`, each as its modules' paths.
fn crate_cycles(root: &Path) -> (usize, Vec<Vec<String>>) {
    let modules = module_tree(root);
    let found = cycles(&imports(&modules))
        .into_iter()
        .map(|component| {
            let mut names: Vec<String> = component
                .into_iter()
                .map(|i| modules[i].path.join("::"))
                .collect();
            names.sort();
            names
        })
        .collect();
    (modules.len(), found)
}

/// Every crate root of the workspace: each crate's library and binary, and xtask's.
fn crate_roots() -> Vec<PathBuf> {
    let root = workspace();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .collect();
    crates.push(root.join("xtask/src"));
    crates.sort();
    crates
        .iter()
        .flat_map(|src| [src.join("lib.rs"), src.join("main.rs")])
        .filter(|f| f.is_file())
        .collect()
}

#[test]
fn no_crate_imports_its_own_modules_in_a_circle() {
    let roots = crate_roots();
    assert!(roots.len() > 30, "too few crates found: {roots:?}");
    let mut report = Vec::new();
    let mut modules = 0;
    for root in &roots {
        let (count, found) = crate_cycles(root);
        modules += count;
        let rel = root.strip_prefix(workspace()).unwrap_or(root).display();
        for cycle in found {
            report.push(format!("{rel}: {}", cycle.join(" ")));
        }
    }
    assert!(
        report.is_empty(),
        "modules that import each other in a circle (move what both need below both):\n{}",
        report.join("\n")
    );
    println!(
        "tidy: {} crate roots, {modules} module files, no module cycle",
        roots.len()
    );
}

/// The check itself, on a crate written here: it finds the circle, whichever way each side
/// names the other, and ignores test code, comments and the root.
#[test]
fn a_circle_of_imports_is_found() {
    let dir = std::env::temp_dir().join(format!("slate-tidy-cycles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files: &[(&str, &str)] = &[
        (
            "lib.rs",
            "mod base;\nmod upper;\npub mod lower;\npub use upper::Thing;\n",
        ),
        (
            "base.rs",
            "pub const MOUNT: &str = \"/x\";\n// crate::upper in a comment\n",
        ),
        (
            "upper/mod.rs",
            "mod child;\nuse crate::{base::MOUNT, lower::f};\npub struct Thing;\n\
             pub fn g() { child::h(); }\n",
        ),
        ("upper/child.rs", "pub fn h() { super::g(); }\n"),
        (
            "lower.rs",
            "pub fn f() -> usize { crate::upper::Thing; 1 }\n\
             #[cfg(test)]\nmod tests { use crate::base::MOUNT; }\n",
        ),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let (count, found) = crate_cycles(&dir.join("lib.rs"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(count, 5);
    // upper ↔ lower: a use tree one way, an inline path the other. upper/child → upper is one
    // way only (the parent names its child by a bare path).
    assert_eq!(found, [vec!["lower".to_owned(), "upper".to_owned()]]);
    assert_eq!(
        absolute(
            &["a".into(), "b".into()],
            &["super".into(), "super".into(), "c".into()]
        ),
        Some(vec!["c".to_owned()])
    );
    assert_eq!(absolute(&[], &["super".into()]), None);
}
