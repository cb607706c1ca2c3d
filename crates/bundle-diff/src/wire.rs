//! A [`Listing`] as JSON, both ways: how a node sends its running version's [`Summary`]
//! (`GET /v1/image`, docs/formats.md §7.5) and the CLI reads it back. The listing is a list of
//! entries in byte order of their paths, each `{path, kind, mode, uid, gid[, size, digest]
//! [, target][, device]}` — the shape of an added entry in the diff's own JSON — plus
//! `path_bytes` or `target_bytes` (the bytes as a list of numbers) for a name that is not
//! UTF-8, so that the listing read back compares equal to the one sent.
//!
//! [`Summary`]: crate::Summary

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use slate_bundle::Digest;

use crate::rootfs::{display_path, Listing, Node, NodeKind};

#[derive(Serialize, Deserialize)]
struct Entry {
    /// The path, lossy UTF-8 when `path_bytes` is given.
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_bytes: Option<Vec<u8>>,
    kind: NodeKind,
    /// Four octal digits, as in the diff's JSON.
    mode: String,
    uid: u32,
    gid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_bytes: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device: Option<u32>,
}

/// The bytes when they are not UTF-8 (their lossy text then says too little).
fn raw_unless_utf8(bytes: &[u8]) -> Option<Vec<u8>> {
    std::str::from_utf8(bytes).is_err().then(|| bytes.to_vec())
}

impl Entry {
    fn of(path: &[u8], node: &Node) -> Self {
        let is_symlink = node.kind == NodeKind::Symlink;
        Entry {
            path: display_path(path),
            path_bytes: raw_unless_utf8(path),
            kind: node.kind,
            mode: format!("{:04o}", node.mode),
            uid: node.uid,
            gid: node.gid,
            size: node.size,
            digest: node.digest.clone(),
            target: node.target.clone(),
            target_bytes: is_symlink
                .then(|| raw_unless_utf8(&node.target_bytes))
                .flatten(),
            device: node.device,
        }
    }

    fn into_node<E: serde::de::Error>(self) -> Result<(Vec<u8>, Node), E> {
        let octal = self.mode.len() == 4 && self.mode.bytes().all(|b| (b'0'..=b'7').contains(&b));
        let mode = octal
            .then(|| u16::from_str_radix(&self.mode, 8).ok())
            .flatten()
            .ok_or_else(|| {
                E::custom(format!(
                    "{}: mode {:?} is not four octal digits",
                    self.path, self.mode
                ))
            })?;
        let target_bytes = match (self.target_bytes, &self.target) {
            (Some(bytes), _) => bytes,
            (None, Some(target)) => target.as_bytes().to_vec(),
            (None, None) => Vec::new(),
        };
        let node = Node {
            kind: self.kind,
            mode,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            digest: self.digest,
            target: self.target,
            target_bytes,
            device: self.device,
        };
        let path = self
            .path_bytes
            .unwrap_or_else(|| self.path.clone().into_bytes());
        Ok((path, node))
    }
}

pub(crate) fn serialize<S: Serializer>(listing: &Listing, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(listing.iter().map(|(path, node)| Entry::of(path, node)))
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Listing, D::Error> {
    let mut listing = Listing::new();
    for entry in Vec::<Entry>::deserialize(d)? {
        let (path, node) = entry.into_node()?;
        if let Some(_twice) = listing.insert(path.clone(), node) {
            return Err(D::Error::custom(format!(
                "{} is listed twice",
                display_path(&path)
            )));
        }
    }
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::diff::Summary;
    use crate::initramfs::{Blob, FileInfo};

    fn node(kind: NodeKind, mode: u16) -> Node {
        Node {
            kind,
            mode,
            uid: 0,
            gid: 0,
            size: None,
            digest: None,
            target: None,
            target_bytes: Vec::new(),
            device: None,
        }
    }

    fn summary() -> Summary {
        let mut file = node(NodeKind::File, 0o4755);
        file.size = Some(3);
        file.digest = Some(Digest::of(b"abc"));
        let mut link = node(NodeKind::Symlink, 0o777);
        link.target_bytes = b"caf\xe9".to_vec();
        link.target = Some(display_path(&link.target_bytes));
        let mut dev = node(NodeKind::CharDevice, 0o600);
        dev.device = Some(0x501);
        let rootfs = Listing::from([
            (b"/".to_vec(), node(NodeKind::Dir, 0o755)),
            (b"/dev".to_vec(), node(NodeKind::Dir, 0o755)),
            (b"/dev/console".to_vec(), dev),
            (b"/usr/bin/su".to_vec(), file),
            (b"/lib/caf\xe9".to_vec(), link),
            (b"/lib/plain".to_vec(), {
                let mut link = node(NodeKind::Symlink, 0o777);
                link.target = Some("caf\u{e9}".into());
                link.target_bytes = "caf\u{e9}".as_bytes().to_vec();
                link
            }),
        ]);
        Summary {
            name: "slate".into(),
            version: "1.0.0".into(),
            arch: "amd64".into(),
            variant: "demo".into(),
            kernel_release: None,
            kernel: Blob::of(b"kernel"),
            cmdline: "console=ttyS0".into(),
            modules: BTreeMap::from([("kernel/fs/a.ko".to_owned(), Digest::of(b"a"))]),
            init: FileInfo {
                path: "/init".into(),
                size: 4,
                digest: Digest::of(b"init"),
            },
            slate_binary: Blob::of(b"init"),
            extensions: Some(Blob::of(b"\x1f\x8b")),
            extension_versions: [("containerd".to_owned(), "1.6.20-1".to_owned())].into(),
            rootfs,
        }
    }

    /// A summary read back from its JSON is the summary sent, names that are not UTF-8 included;
    /// the entries are the diff's own entry shape.
    #[test]
    fn a_summary_survives_its_json() {
        let sent = summary();
        let json = serde_json::to_value(&sent).unwrap();
        assert_eq!(
            serde_json::from_value::<Summary>(json.clone()).unwrap(),
            sent
        );
        let rootfs = json["rootfs"].as_array().unwrap();
        assert_eq!(
            rootfs[3],
            serde_json::json!({
                "path": "/lib/caf\u{fffd}",
                "path_bytes": [47, 108, 105, 98, 47, 99, 97, 102, 0xe9],
                "kind": "symlink",
                "mode": "0777",
                "uid": 0,
                "gid": 0,
                "target": "caf\u{fffd}",
                "target_bytes": [99, 97, 102, 0xe9],
            })
        );
        assert_eq!(
            rootfs[5],
            serde_json::json!({
                "path": "/usr/bin/su",
                "kind": "file",
                "mode": "4755",
                "uid": 0,
                "gid": 0,
                "size": 3,
                "digest": Digest::of(b"abc").to_string(),
            })
        );
        assert_eq!(json["slate_binary"]["size"], 4);
        assert_eq!(
            json["modules"]["kernel/fs/a.ko"],
            Digest::of(b"a").to_string()
        );
    }

    #[test]
    fn a_listing_with_a_bad_mode_or_a_path_twice_is_refused() {
        let json = serde_json::to_value(summary()).unwrap();
        let mut bad_mode = json.clone();
        bad_mode["rootfs"][0]["mode"] = "755".into();
        let err = serde_json::from_value::<Summary>(bad_mode).unwrap_err();
        assert!(err.to_string().contains("not four octal digits"), "{err}");
        let mut plus = json.clone();
        plus["rootfs"][0]["mode"] = "+755".into();
        assert!(serde_json::from_value::<Summary>(plus).is_err());
        let mut twice = json;
        let first = twice["rootfs"][1].clone();
        twice["rootfs"].as_array_mut().unwrap().push(first);
        let err = serde_json::from_value::<Summary>(twice).unwrap_err();
        assert!(err.to_string().contains("/dev is listed twice"), "{err}");
    }
}
