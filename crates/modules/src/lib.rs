//! Kernel module dependency resolution for the initramfs: parse a kernel's `modules.dep`
//! (and optionally `modules.builtin`) text and compute which module files to carry and in
//! which order to load them.
//!
//! The crate is pure: it takes text, returns paths relative to `/lib/modules/<release>/`,
//! and never touches the filesystem. The imager reads the files; `init` loads the modules.
//!
//! Names follow modprobe: a module's name is its file stem (`.ko`, `.ko.xz`, `.ko.zst`,
//! `.ko.gz` stripped), and `-` and `_` are the same character (`virtio-blk` == `virtio_blk`).
//!
//! ```
//! let deps = slate_modules::ModuleDeps::parse(
//!     "kernel/fs/overlayfs/overlay.ko:\n\
//!      kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko\n\
//!      kernel/drivers/virtio/virtio_ring.ko:\n",
//! )
//! .unwrap();
//! assert_eq!(
//!     deps.resolve(["virtio-blk"]).unwrap(),
//!     ["kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/block/virtio_blk.ko"],
//! );
//! ```

use std::collections::{BTreeMap, BTreeSet};

/// File-name endings `depmod` writes for module files, longest first so that stripping
/// `.ko.xz` is not mistaken for a file called `x.ko` + `.xz`.
pub const MODULE_SUFFIXES: [&str; 4] = [".ko.zst", ".ko.xz", ".ko.gz", ".ko"];

/// Everything that can go wrong parsing or resolving. Line numbers are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModulesError {
    /// A `modules.dep` line does not have the `path: dep dep ...` shape.
    #[error("modules.dep line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    /// A `modules.builtin` line is not a module path.
    #[error("modules.builtin line {line}: {reason}")]
    MalformedBuiltin { line: usize, reason: String },
    /// Two entries resolve to the same module name, so a request for it is ambiguous.
    #[error(
        "modules.dep line {line}: module {name:?} has a second entry {path:?} (first: {first:?})"
    )]
    Duplicate {
        line: usize,
        name: String,
        path: String,
        first: String,
    },
    /// A dependency is named that has no line of its own (depmod always writes one).
    #[error("modules.dep line {line}: {module:?} depends on {dependency:?}, which has no entry")]
    MissingDependency {
        line: usize,
        module: String,
        dependency: String,
    },
    /// A requested module is neither a loadable module nor built into the kernel.
    #[error("unknown kernel module {name:?}: not in modules.dep and not built in")]
    UnknownModule { name: String },
    /// The dependency graph has a cycle, so no load order exists.
    #[error("kernel module dependency cycle: {}", .cycle.join(" -> "))]
    Cycle { cycle: Vec<String> },
}

/// Canonical form of a module name: modprobe treats `-` and `_` alike, so store `_` only.
pub fn normalize_name(name: &str) -> String {
    name.replace('-', "_")
}

/// The module name a path names (`kernel/fs/fuse/cuse.ko.xz` → `cuse`), or `None` when the
/// file name does not end in one of [`MODULE_SUFFIXES`] or the stem is empty.
pub fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = MODULE_SUFFIXES
        .iter()
        .find_map(|suffix| file.strip_suffix(suffix))?;
    (!stem.is_empty()).then(|| normalize_name(stem))
}

/// Checks one path token; the reason is phrased for an error message.
fn check_path(path: &str) -> Result<String, String> {
    if path.starts_with('/') || path.split('/').any(|c| c == "..") {
        // The imager joins these under the module directory; an escaping path would copy
        // arbitrary host files into the initramfs.
        return Err(format!(
            "path {path:?} must be relative and must not contain '..'"
        ));
    }
    if path.contains(':') {
        return Err(format!("unexpected ':' in {path:?}"));
    }
    module_name(path).ok_or_else(|| {
        format!(
            "{path:?} is not a module file (expected a name ending in {})",
            MODULE_SUFFIXES.join(", ")
        )
    })
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    path: String,
    /// Indices into `ModuleDeps::entries`, in the order modules.dep lists them.
    deps: Vec<usize>,
}

/// A parsed `modules.dep`, plus the set of built-in module names if one was given.
#[derive(Debug, Clone, Default)]
pub struct ModuleDeps {
    entries: Vec<Entry>,
    by_name: BTreeMap<String, usize>,
    builtin: BTreeSet<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    Unvisited,
    OnStack,
    Done,
}

impl ModuleDeps {
    /// Parses `modules.dep` text. Blank lines and `#` comments are skipped; every other line
    /// must be `path:` followed by zero or more whitespace-separated dependency paths, and
    /// every dependency must have its own line.
    pub fn parse(text: &str) -> Result<Self, ModulesError> {
        let mut deps = Self::default();
        let mut by_path: BTreeMap<&str, usize> = BTreeMap::new();
        // (line number, dependency tokens) per entry; resolved once all keys are known
        // because depmod does not order lines by dependency.
        let mut pending: Vec<(usize, Vec<&str>)> = Vec::new();

        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let malformed = |reason: String| ModulesError::Malformed { line, reason };
            let (key, rest) = content
                .split_once(':')
                .ok_or_else(|| malformed("missing ':' after the module path".into()))?;
            let key = key.trim_end();
            if key.is_empty() {
                return Err(malformed("empty module path before ':'".into()));
            }
            if key.contains(char::is_whitespace) {
                return Err(malformed(format!(
                    "module path {key:?} contains whitespace"
                )));
            }
            let name = check_path(key).map_err(malformed)?;
            let dep_tokens: Vec<&str> = rest.split_whitespace().collect();
            for dep in &dep_tokens {
                check_path(dep).map_err(malformed)?;
            }
            if let Some(&first) = deps.by_name.get(&name) {
                return Err(ModulesError::Duplicate {
                    line,
                    name,
                    path: key.to_owned(),
                    first: deps.entries[first].path.clone(),
                });
            }
            let index = deps.entries.len();
            deps.by_name.insert(name.clone(), index);
            by_path.insert(key, index);
            deps.entries.push(Entry {
                name,
                path: key.to_owned(),
                deps: Vec::new(),
            });
            pending.push((line, dep_tokens));
        }

        for (index, (line, tokens)) in pending.into_iter().enumerate() {
            let mut resolved = Vec::with_capacity(tokens.len());
            for token in tokens {
                let dep =
                    by_path
                        .get(token)
                        .copied()
                        .ok_or_else(|| ModulesError::MissingDependency {
                            line,
                            module: deps.entries[index].path.clone(),
                            dependency: token.to_owned(),
                        })?;
                resolved.push(dep);
            }
            deps.entries[index].deps = resolved;
        }
        Ok(deps)
    }

    /// Adds the kernel's `modules.builtin` (one module path per line): built-in modules need
    /// no file and no loading, so [`Self::resolve`] accepts and skips them.
    pub fn with_builtin(mut self, text: &str) -> Result<Self, ModulesError> {
        for (index, raw) in text.lines().enumerate() {
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let name = check_path(content).map_err(|reason| ModulesError::MalformedBuiltin {
                line: index + 1,
                reason,
            })?;
            self.builtin.insert(name);
        }
        Ok(self)
    }

    /// Number of loadable modules (entries in modules.dep).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when modules.dep had no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The relative path of a loadable module, by name (`-`/`_` insensitive).
    pub fn path_of(&self, name: &str) -> Option<&str> {
        let index = *self.by_name.get(&normalize_name(name))?;
        Some(&self.entries[index].path)
    }

    /// True when the module is compiled into the kernel (per [`Self::with_builtin`]).
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&normalize_name(name))
    }

    /// All loadable modules as `(name, path)`, in modules.dep order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.name.as_str(), e.path.as_str()))
    }

    /// The dependency closure of `names` as relative paths, in a load order where every
    /// module comes after all of its dependencies. Built-in modules are skipped; an unknown
    /// name is an error naming it.
    ///
    /// The order is deterministic: requested names are taken in the given order, and each
    /// module's dependencies are visited last-listed first, which is how modprobe walks a
    /// modules.dep line (depmod lists them so the last one is loaded first).
    pub fn resolve<I, S>(&self, names: I) -> Result<Vec<&str>, ModulesError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut marks = vec![Mark::Unvisited; self.entries.len()];
        let mut order = Vec::new();
        for name in names {
            let name = name.as_ref();
            let key = normalize_name(name);
            match self.by_name.get(&key) {
                Some(&index) => self.visit(index, &mut marks, &mut order)?,
                None if self.builtin.contains(&key) => {}
                None => {
                    return Err(ModulesError::UnknownModule {
                        name: name.to_owned(),
                    })
                }
            }
        }
        Ok(order
            .into_iter()
            .map(|i| self.entries[i].path.as_str())
            .collect())
    }

    /// The modules `path` needs loaded before it, as its `modules.dep` line lists them (depmod
    /// writes every module it needs, not only the direct ones); `None` for a path with no line.
    /// The imager writes them into `modules.load` so that init can load independent modules
    /// side by side.
    pub fn dependencies(&self, path: &str) -> Option<Vec<&str>> {
        let index = *self.by_name.get(&module_name(path)?)?;
        let entry = &self.entries[index];
        (entry.path == path).then(|| {
            entry
                .deps
                .iter()
                .map(|&d| self.entries[d].path.as_str())
                .collect()
        })
    }

    /// Post-order depth-first walk from `root`. Iterative, so a hostile or absurdly deep
    /// modules.dep cannot overflow the stack.
    fn visit(
        &self,
        root: usize,
        marks: &mut [Mark],
        order: &mut Vec<usize>,
    ) -> Result<(), ModulesError> {
        if marks[root] == Mark::Done {
            return Ok(());
        }
        marks[root] = Mark::OnStack;
        // (entry, how many of its dependencies have been visited)
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(top) = stack.last_mut() {
            let (node, visited) = *top;
            let deps = &self.entries[node].deps;
            if visited == deps.len() {
                marks[node] = Mark::Done;
                order.push(node);
                stack.pop();
                continue;
            }
            top.1 += 1;
            let dep = deps[deps.len() - 1 - visited];
            match marks[dep] {
                Mark::Done => {}
                Mark::Unvisited => {
                    marks[dep] = Mark::OnStack;
                    stack.push((dep, 0));
                }
                Mark::OnStack => {
                    let start = stack.iter().position(|&(n, _)| n == dep).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[start..]
                        .iter()
                        .map(|&(n, _)| self.entries[n].name.clone())
                        .collect();
                    cycle.push(self.entries[dep].name.clone());
                    return Err(ModulesError::Cycle { cycle });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
kernel/fs/squashfs/squashfs.ko:
kernel/drivers/block/loop.ko:
kernel/fs/overlayfs/overlay.ko:
kernel/lib/crc16.ko:
kernel/fs/mbcache.ko:
kernel/fs/jbd2/jbd2.ko:
kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/watchdog/i6300esb.ko.xz:
kernel/fs/nls/nls-cp437.ko.zst:
";

    fn sample() -> ModuleDeps {
        ModuleDeps::parse(SAMPLE).unwrap()
    }

    fn position(order: &[&str], path: &str) -> usize {
        order.iter().position(|p| *p == path).unwrap()
    }

    #[test]
    fn module_names_strip_suffixes_and_normalize() {
        assert_eq!(
            module_name("a/b/virtio-blk.ko").as_deref(),
            Some("virtio_blk")
        );
        assert_eq!(module_name("x.ko.xz").as_deref(), Some("x"));
        assert_eq!(module_name("x.ko.zst").as_deref(), Some("x"));
        assert_eq!(module_name("x.o"), None);
        assert_eq!(module_name("dir/.ko"), None);
    }

    #[test]
    fn dependencies_are_the_modules_dep_line() {
        let deps = sample();
        assert_eq!(
            deps.dependencies("kernel/drivers/block/virtio_blk.ko"),
            Some(
                [
                    "kernel/drivers/virtio/virtio.ko",
                    "kernel/drivers/virtio/virtio_ring.ko"
                ]
                .into()
            )
        );
        assert_eq!(
            deps.dependencies("kernel/drivers/virtio/virtio_ring.ko"),
            Some(vec![])
        );
        assert_eq!(deps.dependencies("kernel/drivers/block/nope.ko"), None);
        assert_eq!(deps.dependencies("elsewhere/virtio_blk.ko"), None);
    }

    #[test]
    fn resolves_closure_dependencies_first() {
        let deps = sample();
        let order = deps.resolve(["virtio_blk", "ext4"]).unwrap();
        assert_eq!(order.len(), 7);
        let ring = position(&order, "kernel/drivers/virtio/virtio_ring.ko");
        let virtio = position(&order, "kernel/drivers/virtio/virtio.ko");
        let blk = position(&order, "kernel/drivers/block/virtio_blk.ko");
        assert!(ring < virtio && virtio < blk);
        let ext4 = position(&order, "kernel/fs/ext4/ext4.ko");
        for dep in [
            "kernel/lib/crc16.ko",
            "kernel/fs/mbcache.ko",
            "kernel/fs/jbd2/jbd2.ko",
        ] {
            assert!(position(&order, dep) < ext4);
        }
    }

    #[test]
    fn order_is_deterministic_and_follows_modprobe() {
        let deps = sample();
        assert_eq!(
            deps.resolve(["ext4"]).unwrap(),
            [
                "kernel/fs/jbd2/jbd2.ko",
                "kernel/fs/mbcache.ko",
                "kernel/lib/crc16.ko",
                "kernel/fs/ext4/ext4.ko"
            ]
        );
    }

    #[test]
    fn dash_and_underscore_are_alike_and_duplicates_collapse() {
        let deps = sample();
        let order = deps
            .resolve(["virtio-blk", "virtio_blk", "nls_cp437", "nls-cp437"])
            .unwrap();
        assert_eq!(order.len(), 4);
        assert_eq!(order[3], "kernel/fs/nls/nls-cp437.ko.zst");
        assert_eq!(
            deps.path_of("i6300esb"),
            Some("kernel/drivers/watchdog/i6300esb.ko.xz")
        );
    }

    #[test]
    fn unknown_module_is_named() {
        let err = sample().resolve(["squashfs", "nosuch-mod"]).unwrap_err();
        assert_eq!(
            err,
            ModulesError::UnknownModule {
                name: "nosuch-mod".into()
            }
        );
        assert!(err.to_string().contains("nosuch-mod"));
    }

    #[test]
    fn builtin_modules_are_skipped() {
        let deps = sample()
            .with_builtin("kernel/fs/efivarfs/efivarfs.ko\nkernel/fs/vfat/vfat.ko\n")
            .unwrap();
        assert!(deps.is_builtin("efivarfs"));
        assert_eq!(
            deps.resolve(["efivarfs", "loop"]).unwrap(),
            ["kernel/drivers/block/loop.ko"]
        );
        assert!(ModuleDeps::default().with_builtin("nope\n").is_err());
    }

    #[test]
    fn malformed_lines_are_reported_with_line_numbers() {
        let cases = [
            ("a.ko\n", 1, "missing ':'"),
            ("a.ko:\n: b.ko\n", 2, "empty module path"),
            ("a b.ko: c.ko\n", 1, "whitespace"),
            ("a.ko: b.txt\n", 1, "not a module file"),
            ("/abs/a.ko:\n", 1, "relative"),
            ("../a.ko:\n", 1, "relative"),
            ("a.ko: b.ko:c.ko\n", 1, "':'"),
        ];
        for (text, line, needle) in cases {
            match ModuleDeps::parse(text) {
                Err(ModulesError::Malformed { line: l, reason }) => {
                    assert_eq!(l, line, "{text:?}");
                    assert!(reason.contains(needle), "{text:?}: {reason}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn missing_dependency_and_duplicates_are_errors() {
        assert!(matches!(
            ModuleDeps::parse("a.ko: b.ko\n"),
            Err(ModulesError::MissingDependency { line: 1, .. })
        ));
        assert!(matches!(
            ModuleDeps::parse("x/a-b.ko:\ny/a_b.ko.xz:\n"),
            Err(ModulesError::Duplicate { line: 2, .. })
        ));
    }

    #[test]
    fn cycles_are_errors() {
        let deps = ModuleDeps::parse("a.ko: b.ko\nb.ko: c.ko\nc.ko: a.ko\nd.ko: d.ko\n").unwrap();
        let err = deps.resolve(["a"]).unwrap_err();
        assert_eq!(
            err,
            ModulesError::Cycle {
                cycle: vec!["a".into(), "b".into(), "c".into(), "a".into()]
            }
        );
        assert!(deps.resolve(["d"]).is_err());
    }

    #[test]
    fn comments_blank_lines_and_crlf_are_accepted() {
        let deps = ModuleDeps::parse("# generated\r\n\r\na.ko:\r\nb.ko: a.ko\r\n").unwrap();
        assert_eq!(deps.len(), 2);
        assert_eq!(deps.resolve(["b"]).unwrap(), ["a.ko", "b.ko"]);
        assert_eq!(deps.iter().next(), Some(("a", "a.ko")));
    }

    #[test]
    fn deep_chains_do_not_overflow_the_stack() {
        let n = 100_000;
        let mut text = String::from("m0.ko:\n");
        for i in 1..n {
            text.push_str(&format!("m{i}.ko: m{}.ko\n", i - 1));
        }
        let deps = ModuleDeps::parse(&text).unwrap();
        let order = deps.resolve([format!("m{}", n - 1)]).unwrap();
        assert_eq!(order.len(), n);
        assert_eq!(order[0], "m0.ko");
    }
}
