//! `slate bundle diff`'s text: a header line per changed attribute, `+`/`-`/`~` lines for the
//! modules and the root filesystem, and a last line counting the root filesystem's changes.

use std::fmt::Write as _;

use slate_bundle::Digest;

use crate::diff::{Aspect, BundleDiff, Change, NameDiff, RootfsChange, RootfsEntry};
use crate::initramfs::Blob;
use crate::rootfs::{Node, NodeKind};

/// Control characters in names (a newline could forge a line) are shown escaped.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `sha256:` and the first 12 hex digits.
fn short(digest: &Digest) -> String {
    format!("sha256:{}", &digest.hex()[..12])
}

fn bytes(old: u64, new: u64) -> String {
    if old == new {
        format!("{new} bytes")
    } else {
        format!("{old} -> {new} bytes")
    }
}

/// `1000 -> 1200 bytes, sha256:… -> sha256:…`.
fn blob(old: &Blob, new: &Blob) -> String {
    format!(
        "{}, {} -> {}",
        bytes(old.size, new.size),
        short(&old.digest),
        short(&new.digest)
    )
}

fn optional_blob(change: &Change<Option<Blob>>) -> String {
    match (&change.old, &change.new) {
        (Some(old), Some(new)) => blob(old, new),
        (None, Some(new)) => format!("added ({} bytes)", new.size),
        (Some(old), None) => format!("removed ({} bytes)", old.size),
        (None, None) => String::new(),
    }
}

fn names(out: &mut String, header: &str, diff: &NameDiff) {
    if diff.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{header}: {} added, {} removed, {} changed",
        diff.added.len(),
        diff.removed.len(),
        diff.changed.len()
    );
    for (sign, list) in [
        ('+', &diff.added),
        ('-', &diff.removed),
        ('~', &diff.changed),
    ] {
        for name in list {
            let _ = writeln!(out, "{sign} {}", clean(name));
        }
    }
}

/// `(1234 bytes)`, `-> target`, `(directory)`.
fn describe(node: &Node) -> String {
    match node.kind {
        NodeKind::File => format!("({} bytes)", node.size.unwrap_or(0)),
        NodeKind::Symlink => format!("-> {}", clean(node.target.as_deref().unwrap_or(""))),
        other => format!("({})", other.as_str()),
    }
}

fn entry(sign: char, e: &RootfsEntry) -> String {
    format!("{sign} {} {}", clean(&e.path), describe(&e.node))
}

fn change(c: &RootfsChange) -> String {
    let (old, new) = (&c.old, &c.new);
    let mut details = Vec::new();
    for aspect in &c.what {
        details.push(match aspect {
            Aspect::Kind => format!("{} -> {}", old.kind.as_str(), new.kind.as_str()),
            Aspect::Size => bytes(old.size.unwrap_or(0), new.size.unwrap_or(0)),
            // The size says enough when it moved.
            Aspect::Content if c.what.contains(&Aspect::Size) => continue,
            Aspect::Content => format!("content changed, {} bytes", new.size.unwrap_or(0)),
            Aspect::Target => format!(
                "target {} -> {}",
                clean(old.target.as_deref().unwrap_or("")),
                clean(new.target.as_deref().unwrap_or(""))
            ),
            Aspect::Device => format!(
                "device {:#x} -> {:#x}",
                old.device.unwrap_or(0),
                new.device.unwrap_or(0)
            ),
            Aspect::Mode => format!("mode {:04o} -> {:04o}", old.mode, new.mode),
            Aspect::Uid => format!("uid {} -> {}", old.uid, new.uid),
            Aspect::Gid => format!("gid {} -> {}", old.gid, new.gid),
        });
    }
    format!("~ {} ({})", clean(&c.path), details.join(", "))
}

/// The text of `diff`, one line per `\n`.
pub fn render_text(diff: &BundleDiff) -> String {
    let mut out = String::new();
    for (header, c) in [
        ("name", &diff.name),
        ("version", &diff.version),
        ("arch", &diff.arch),
        ("variant", &diff.variant),
    ] {
        if c.changed {
            let _ = writeln!(out, "{header}: {} -> {}", clean(&c.old), clean(&c.new));
        }
    }
    if diff.kernel_release.changed {
        let show = |r: &Option<String>| clean(r.as_deref().unwrap_or("unknown"));
        let (old, new) = (&diff.kernel_release.old, &diff.kernel_release.new);
        let _ = writeln!(out, "kernel release: {} -> {}", show(old), show(new));
    }
    if diff.kernel.changed {
        let _ = writeln!(
            out,
            "kernel image: {}",
            blob(&diff.kernel.old, &diff.kernel.new)
        );
    }
    if diff.cmdline.changed {
        let _ = writeln!(
            out,
            "command line: {:?} -> {:?}",
            diff.cmdline.old, diff.cmdline.new
        );
    }
    names(&mut out, "initramfs modules", &diff.modules);
    if diff.init.changed {
        let (old, new) = (&diff.init.old, &diff.init.new);
        let old_blob = Blob {
            size: old.size,
            digest: old.digest.clone(),
        };
        let new_blob = Blob {
            size: new.size,
            digest: new.digest.clone(),
        };
        let path = if old.path == new.path {
            clean(&new.path)
        } else {
            format!("{} -> {}", clean(&old.path), clean(&new.path))
        };
        let _ = writeln!(out, "init {path}: {}", blob(&old_blob, &new_blob));
    }
    if diff.slate_binary.changed {
        let (old, new) = (&diff.slate_binary.old, &diff.slate_binary.new);
        let _ = writeln!(out, "slate binary: {}", blob(old, new));
    }
    if diff.extensions.changed {
        let _ = writeln!(
            out,
            "system extensions (compressed initramfs members): {}",
            optional_blob(&diff.extensions)
        );
    }
    let (old, new) = (&diff.extension_versions.old, &diff.extension_versions.new);
    for name in old
        .keys()
        .chain(new.keys().filter(|n| !old.contains_key(*n)))
    {
        let line = match (old.get(name), new.get(name)) {
            (Some(a), Some(b)) if a != b => format!("{a} -> {b}"),
            (Some(a), None) => format!("removed ({a})"),
            (None, Some(b)) => format!("added ({b})"),
            _ => continue,
        };
        let _ = writeln!(out, "extension {name}: {line}");
    }
    let rootfs = &diff.rootfs;
    if !rootfs.is_empty() {
        out.push_str("root filesystem:\n");
        for e in &rootfs.added {
            let _ = writeln!(out, "{}", entry('+', e));
        }
        for e in &rootfs.removed {
            let _ = writeln!(out, "{}", entry('-', e));
        }
        for c in &rootfs.changed {
            let _ = writeln!(out, "{}", change(c));
        }
    }
    if !diff.differs() {
        out.push_str("no differences\n");
    }
    let _ = writeln!(
        out,
        "{} added, {} removed, {} changed",
        rootfs.added.len(),
        rootfs.removed.len(),
        rootfs.changed.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::diff::{diff, Summary};
    use crate::initramfs::FileInfo;
    use crate::rootfs::Listing;

    fn node(kind: NodeKind, mode: u16, content: Option<&[u8]>, target: Option<&str>) -> Node {
        Node {
            kind,
            mode,
            uid: 0,
            gid: 0,
            size: content.map(|c| c.len() as u64),
            digest: content.map(Digest::of),
            target: target.map(str::to_owned),
            target_bytes: target.unwrap_or_default().as_bytes().to_vec(),
            device: None,
        }
    }

    fn summary(version: &str, rootfs: Listing) -> Summary {
        Summary {
            name: "slate".into(),
            version: version.into(),
            arch: "amd64".into(),
            variant: "demo".into(),
            kernel_release: Some("6.1.0-test".into()),
            kernel: Blob::of(b"kernel"),
            cmdline: "console=ttyS0".into(),
            modules: BTreeMap::from([("kernel/fs/alpha.ko".to_owned(), Digest::of(b"a"))]),
            init: FileInfo {
                path: "/init".into(),
                size: 4,
                digest: Digest::of(b"init"),
            },
            slate_binary: Blob::of(b"slate"),
            extensions: None,
            extension_versions: Default::default(),
            rootfs,
        }
    }

    fn listing(entries: &[(&str, Node)]) -> Listing {
        entries
            .iter()
            .map(|(path, node)| (path.as_bytes().to_vec(), node.clone()))
            .collect()
    }

    #[test]
    fn identical_bundles_say_so() {
        let a = summary(
            "1.0.0",
            listing(&[("/", node(NodeKind::Dir, 0o755, None, None))]),
        );
        assert_eq!(
            render_text(&diff(&a, &a)),
            "no differences\n0 added, 0 removed, 0 changed\n"
        );
    }

    #[test]
    fn every_changed_attribute_has_its_line() {
        let dir = node(NodeKind::Dir, 0o755, None, None);
        let a = summary(
            "1.0.0",
            listing(&[
                ("/", dir.clone()),
                ("/etc/old", node(NodeKind::File, 0o644, Some(b"old"), None)),
                (
                    "/etc/os-release",
                    node(NodeKind::File, 0o644, Some(&[b'a'; 210]), None),
                ),
                (
                    "/etc/motd",
                    node(NodeKind::File, 0o644, Some(b"aaaa"), None),
                ),
                (
                    "/lib/x.so",
                    node(NodeKind::Symlink, 0o777, None, Some("x.so.1")),
                ),
                (
                    "/usr/bin/su",
                    node(NodeKind::File, 0o755, Some(b"su"), None),
                ),
                ("/var/run", dir.clone()),
            ]),
        );
        let mut b = summary(
            "1.1.0",
            listing(&[
                ("/", dir),
                (
                    "/etc/os-release",
                    node(NodeKind::File, 0o644, Some(&[b'b'; 214]), None),
                ),
                (
                    "/etc/motd",
                    node(NodeKind::File, 0o644, Some(b"bbbb"), None),
                ),
                (
                    "/lib/x.so",
                    node(NodeKind::Symlink, 0o777, None, Some("x.so.2")),
                ),
                ("/opt/new\ndir", node(NodeKind::Dir, 0o755, None, None)),
                (
                    "/usr/bin/new-tool",
                    node(NodeKind::File, 0o755, Some(&[0; 1234]), None),
                ),
                (
                    "/usr/bin/su",
                    node(NodeKind::File, 0o4755, Some(b"su"), None),
                ),
                (
                    "/var/run",
                    node(NodeKind::Symlink, 0o777, None, Some("../run")),
                ),
            ]),
        );
        b.kernel_release = Some("6.1.0-next".into());
        b.cmdline = "console=ttyS0 quiet".into();
        b.modules = BTreeMap::from([
            ("kernel/fs/alpha.ko".to_owned(), Digest::of(b"a2")),
            ("kernel/fs/beta.ko".to_owned(), Digest::of(b"b")),
        ]);
        b.init.size = 5;
        b.init.digest = Digest::of(b"init2");
        b.extensions = Some(Blob::of(b"\x1f\x8b"));
        b.extension_versions = [("containerd".to_owned(), "1.6.20-1".to_owned())].into();
        let d = diff(&a, &b);
        assert!(d.differs());
        assert!(!d.kernel.changed && !d.slate_binary.changed);
        let short = |bytes: &[u8]| format!("sha256:{}", &Digest::of(bytes).hex()[..12]);
        let expected = format!(
            "version: 1.0.0 -> 1.1.0\n\
             kernel release: 6.1.0-test -> 6.1.0-next\n\
             command line: \"console=ttyS0\" -> \"console=ttyS0 quiet\"\n\
             initramfs modules: 1 added, 0 removed, 1 changed\n\
             + kernel/fs/beta.ko\n\
             ~ kernel/fs/alpha.ko\n\
             init /init: 4 -> 5 bytes, {} -> {}\n\
             system extensions (compressed initramfs members): added (2 bytes)\n\
             extension containerd: added (1.6.20-1)\n\
             root filesystem:\n\
             + /opt/new\\ndir (directory)\n\
             + /usr/bin/new-tool (1234 bytes)\n\
             - /etc/old (3 bytes)\n\
             ~ /etc/motd (content changed, 4 bytes)\n\
             ~ /etc/os-release (210 -> 214 bytes)\n\
             ~ /lib/x.so (target x.so.1 -> x.so.2)\n\
             ~ /usr/bin/su (mode 0755 -> 4755)\n\
             ~ /var/run (directory -> symlink, mode 0755 -> 0777)\n\
             2 added, 1 removed, 5 changed\n",
            short(b"init"),
            short(b"init2"),
        );
        assert_eq!(render_text(&d), expected);
    }
}
