//! The comparison itself: two [`Summary`]s in, a [`BundleDiff`] out. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use slate_bundle::Digest;

use crate::initramfs::{Blob, FileInfo};
use crate::rootfs::{display_path, Listing, Node, NodeKind};

/// What `diff` knows of one bundle, read once (by the `inspect` module), or of the version a
/// node runs ([`crate::running_summary`]). Its JSON is what a node answers to `GET /v1/image`:
/// the fields by name, the root filesystem as a list of entries (see `wire.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    pub version: String,
    pub arch: String,
    pub variant: String,
    /// From the UKI's `.uname`, else the one directory under `lib/modules/`, else the kernel
    /// image's version string.
    pub kernel_release: Option<String>,
    /// The UKI's `.linux`.
    pub kernel: Blob,
    /// The UKI's `.cmdline` (empty when it has none).
    pub cmdline: String,
    /// The initramfs' modules by path (see [`crate::Initramfs::modules`]).
    pub modules: BTreeMap<String, Digest>,
    /// The initramfs' `/init`.
    pub init: FileInfo,
    /// The bundle's `installer` blob: the version's own slate binary. On a node, the root's
    /// `/usr/bin/slate` (or, without one, the initramfs' `/init`), the same file.
    pub slate_binary: Blob,
    /// The compressed initramfs members after the main archive: the system extensions.
    pub extensions: Option<Blob>,
    /// The system extensions by name, with their versions (absent from an older node's answer).
    #[serde(default)]
    pub extension_versions: BTreeMap<String, String>,
    /// The root filesystem, `rootfs.sqsh` in the initramfs.
    #[serde(with = "crate::wire")]
    pub rootfs: Listing,
}

/// One attribute in A and in B.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change<T> {
    pub old: T,
    pub new: T,
    pub changed: bool,
}

impl<T: PartialEq + Clone> Change<T> {
    pub fn of(old: &T, new: &T) -> Self {
        Change {
            old: old.clone(),
            new: new.clone(),
            changed: old != new,
        }
    }
}

/// Names added, removed, and present in both with other content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NameDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl NameDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// A node only one side has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RootfsEntry {
    pub path: String,
    #[serde(flatten)]
    pub node: Node,
}

/// What differs about a node both sides have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aspect {
    /// The type (file, directory, symlink, ...); the type's own aspects are then not listed.
    Kind,
    Size,
    /// The content digest (also listed when the size differs).
    Content,
    Target,
    Device,
    Mode,
    Uid,
    Gid,
}

/// A node both sides have, with what differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RootfsChange {
    pub path: String,
    pub what: Vec<Aspect>,
    pub old: Node,
    pub new: Node,
}

/// The root filesystems compared node by node, each list in byte order of the paths.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RootfsDiff {
    pub added: Vec<RootfsEntry>,
    pub removed: Vec<RootfsEntry>,
    pub changed: Vec<RootfsChange>,
}

impl RootfsDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Bundle A against bundle B.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BundleDiff {
    pub name: Change<String>,
    pub version: Change<String>,
    pub arch: Change<String>,
    pub variant: Change<String>,
    pub kernel_release: Change<Option<String>>,
    pub kernel: Change<Blob>,
    pub cmdline: Change<String>,
    pub modules: NameDiff,
    pub init: Change<FileInfo>,
    pub slate_binary: Change<Blob>,
    pub extensions: Change<Option<Blob>>,
    pub extension_versions: Change<BTreeMap<String, String>>,
    pub rootfs: RootfsDiff,
}

impl BundleDiff {
    /// Whether anything compared differs.
    pub fn differs(&self) -> bool {
        self.name.changed
            || self.version.changed
            || self.arch.changed
            || self.variant.changed
            || self.kernel_release.changed
            || self.kernel.changed
            || self.cmdline.changed
            || !self.modules.is_empty()
            || self.init.changed
            || self.slate_binary.changed
            || self.extensions.changed
            || self.extension_versions.changed
            || !self.rootfs.is_empty()
    }
}

/// Compare bundle A (`a`) with bundle B (`b`).
pub fn diff(a: &Summary, b: &Summary) -> BundleDiff {
    BundleDiff {
        name: Change::of(&a.name, &b.name),
        version: Change::of(&a.version, &b.version),
        arch: Change::of(&a.arch, &b.arch),
        variant: Change::of(&a.variant, &b.variant),
        kernel_release: Change::of(&a.kernel_release, &b.kernel_release),
        kernel: Change::of(&a.kernel, &b.kernel),
        cmdline: Change::of(&a.cmdline, &b.cmdline),
        modules: diff_names(&a.modules, &b.modules),
        init: Change::of(&a.init, &b.init),
        slate_binary: Change::of(&a.slate_binary, &b.slate_binary),
        extensions: Change::of(&a.extensions, &b.extensions),
        extension_versions: Change::of(&a.extension_versions, &b.extension_versions),
        rootfs: diff_rootfs(&a.rootfs, &b.rootfs),
    }
}

/// Two maps of name → content compared by name, then by content.
pub fn diff_names<V: PartialEq>(a: &BTreeMap<String, V>, b: &BTreeMap<String, V>) -> NameDiff {
    let mut out = NameDiff::default();
    for (name, old) in a {
        match b.get(name) {
            None => out.removed.push(name.clone()),
            Some(new) if new != old => out.changed.push(name.clone()),
            Some(_) => {}
        }
    }
    out.added = b
        .keys()
        .filter(|name| !a.contains_key(*name))
        .cloned()
        .collect();
    out
}

/// Two listings compared path by path.
pub fn diff_rootfs(a: &Listing, b: &Listing) -> RootfsDiff {
    let entry = |path: &[u8], node: &Node| RootfsEntry {
        path: display_path(path),
        node: node.clone(),
    };
    let mut out = RootfsDiff::default();
    for (path, old) in a {
        match b.get(path) {
            None => out.removed.push(entry(path, old)),
            Some(new) => {
                let what = aspects(old, new);
                if !what.is_empty() {
                    out.changed.push(RootfsChange {
                        path: display_path(path),
                        what,
                        old: old.clone(),
                        new: new.clone(),
                    });
                }
            }
        }
    }
    out.added = b
        .iter()
        .filter(|(path, _)| !a.contains_key(*path))
        .map(|(path, node)| entry(path, node))
        .collect();
    out
}

/// What differs between two nodes at the same path.
pub fn aspects(old: &Node, new: &Node) -> Vec<Aspect> {
    let mut what = Vec::new();
    if old.kind != new.kind {
        what.push(Aspect::Kind);
    } else {
        match old.kind {
            NodeKind::File => {
                if old.size != new.size {
                    what.push(Aspect::Size);
                }
                if old.digest != new.digest {
                    what.push(Aspect::Content);
                }
            }
            NodeKind::Symlink if old.target_bytes != new.target_bytes => what.push(Aspect::Target),
            NodeKind::CharDevice | NodeKind::BlockDevice if old.device != new.device => {
                what.push(Aspect::Device)
            }
            _ => {}
        }
    }
    if old.mode != new.mode {
        what.push(Aspect::Mode);
    }
    if old.uid != new.uid {
        what.push(Aspect::Uid);
    }
    if old.gid != new.gid {
        what.push(Aspect::Gid);
    }
    what
}
