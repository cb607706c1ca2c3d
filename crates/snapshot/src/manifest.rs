//! The integrity manifest of a snapshot (docs/formats.md §12.3): one line per file under the
//! snapshot's `/usr` and `/boot` and per kernel copy on the ESP, authenticated as a whole with
//! HMAC-SHA256 under a machine-local key. Text, so `diff` on two manifests is readable; one
//! canonical spelling (records sorted, strictly), so the same tree always gives the same bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{SnapshotError, SnapshotName};

/// First line of every manifest.
pub const MAGIC: &str = "slate-snapshot-manifest 1";
/// Length of the manifest key.
pub const KEY_LEN: usize = 32;
/// Largest manifest read (a root's /usr has some 10^5 files at about 120 bytes each).
pub const MAX_MANIFEST_LEN: usize = 256 * 1024 * 1024;
const MAC_PREFIX: &str = "hmac-sha256 ";

/// Where a recorded path lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Area {
    /// Relative to the snapshot's root (`usr/…`, `boot/…`).
    Root,
    /// Relative to the ESP's root (`slate/<snapshot>/vmlinuz`).
    Esp,
}

/// What is recorded of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `f`: a regular file.
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        sha256: [u8; 32],
    },
    /// `l`: a symbolic link; the hash is over its target's bytes.
    Link {
        uid: u32,
        gid: u32,
        size: u64,
        sha256: [u8; 32],
    },
    /// `d`: a directory.
    Dir { mode: u32, uid: u32, gid: u32 },
    /// `o`: anything else (device, FIFO, socket); `mode` includes the file type bits.
    Other { mode: u32, uid: u32, gid: u32 },
    /// `e`: a file on the ESP (FAT has no owners or modes).
    Esp { size: u64, sha256: [u8; 32] },
}

impl Record {
    fn area(&self) -> Area {
        match self {
            Record::Esp { .. } => Area::Esp,
            _ => Area::Root,
        }
    }
}

/// A snapshot's manifest: records keyed by (area, path bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub snapshot: SnapshotName,
    pub records: BTreeMap<(Area, Vec<u8>), Record>,
}

/// One way the tree differs from its manifest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Difference {
    /// In the manifest, not on disk.
    Missing { path: String },
    /// On disk, not in the manifest.
    Added { path: String },
    /// Type, content, mode or owner changed.
    Changed { path: String },
}

impl Difference {
    pub fn path(&self) -> &str {
        match self {
            Difference::Missing { path }
            | Difference::Added { path }
            | Difference::Changed { path } => path,
        }
    }
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Missing { path } => write!(f, "missing: {path}"),
            Difference::Added { path } => write!(f, "added: {path}"),
            Difference::Changed { path } => write!(f, "changed: {path}"),
        }
    }
}

/// SHA-256 of `bytes` (for callers hashing small values such as link targets).
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    Sha256::digest(bytes).into()
}

/// Bytes outside `!`..`~` and `%` itself become `%XX`, so a path is one token on its line.
pub fn escape_path(path: &[u8]) -> String {
    let mut out = String::with_capacity(path.len());
    for &b in path {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn unescape_path(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                if !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'A'..=b'F')) {
                    return None;
                }
                let v = u8::from_str_radix(hex, 16).ok()?;
                // Canonical: only what escape_path escapes may be escaped.
                if (0x21..=0x7e).contains(&v) && v != b'%' {
                    return None;
                }
                out.push(v);
                i += 3;
            }
            c if (0x21..=0x7e).contains(&c) => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    Some(out)
}

fn path_ok(path: &[u8]) -> bool {
    !path.is_empty()
        && path[0] != b'/'
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

impl Manifest {
    pub fn new(snapshot: SnapshotName) -> Manifest {
        Manifest {
            snapshot,
            records: BTreeMap::new(),
        }
    }

    /// Adds a record; refuses an absolute or `..` path and a second record for a path.
    pub fn insert(&mut self, path: &[u8], record: Record) -> Result<(), SnapshotError> {
        if !path_ok(path) {
            return Err(SnapshotError::Invalid(format!(
                "manifest path {} is not a clean relative path",
                escape_path(path)
            )));
        }
        let key = (record.area(), path.to_vec());
        if self.records.insert(key, record).is_some() {
            return Err(SnapshotError::Invalid(format!(
                "manifest path {} recorded twice",
                escape_path(path)
            )));
        }
        Ok(())
    }

    /// The body: every line up to (not including) the `hmac-sha256` line.
    pub fn body(&self) -> String {
        let mut out = format!("{MAGIC}\nsnapshot {}\n", self.snapshot);
        for ((_, path), record) in &self.records {
            let p = escape_path(path);
            let _ = match record {
                Record::File {
                    mode,
                    uid,
                    gid,
                    size,
                    sha256,
                } => writeln!(
                    out,
                    "f {mode:o} {uid} {gid} {size} {} {p}",
                    hex::encode(sha256)
                ),
                Record::Link {
                    uid,
                    gid,
                    size,
                    sha256,
                } => {
                    writeln!(out, "l 777 {uid} {gid} {size} {} {p}", hex::encode(sha256))
                }
                Record::Dir { mode, uid, gid } => writeln!(out, "d {mode:o} {uid} {gid} 0 - {p}"),
                Record::Other { mode, uid, gid } => writeln!(out, "o {mode:o} {uid} {gid} 0 - {p}"),
                Record::Esp { size, sha256 } => {
                    writeln!(out, "e 0 0 0 {size} {} {p}", hex::encode(sha256))
                }
            };
        }
        out
    }

    /// The manifest with its HMAC-SHA256 line under `key`.
    pub fn render_signed(&self, key: &[u8; KEY_LEN]) -> Vec<u8> {
        let body = self.body();
        let tag = mac(key, body.as_bytes());
        format!("{body}{MAC_PREFIX}{}\n", hex::encode(tag)).into_bytes()
    }

    /// Checks the HMAC over the body **before** reading any record, then parses the body.
    pub fn verify(bytes: &[u8], key: &[u8; KEY_LEN]) -> Result<Manifest, SnapshotError> {
        let (body, tag) = split_mac(bytes)?;
        let mut m = <Hmac<Sha256>>::new_from_slice(key).expect("HMAC takes any key length");
        m.update(body);
        m.verify_slice(&tag).map_err(|_| SnapshotError::BadMac)?;
        Manifest::parse_body(body)
    }

    /// Parses a manifest without checking its HMAC (for `slate snapshot list` and the fuzz
    /// target). Returns the manifest and the tag it carries.
    pub fn parse_unauthenticated(bytes: &[u8]) -> Result<(Manifest, [u8; 32]), SnapshotError> {
        let (body, tag) = split_mac(bytes)?;
        Ok((Manifest::parse_body(body)?, tag))
    }

    fn parse_body(body: &[u8]) -> Result<Manifest, SnapshotError> {
        let text = std::str::from_utf8(body).map_err(|_| bad(0, "not ASCII"))?;
        let mut lines = text
            .split_terminator('\n')
            .enumerate()
            .map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, MAGIC)) => {}
            _ => return Err(bad(1, "not a slate snapshot manifest (version 1)")),
        }
        let snapshot = match lines.next() {
            Some((n, l)) => SnapshotName::parse(
                l.strip_prefix("snapshot ")
                    .ok_or_else(|| bad(n, "expected `snapshot NAME`"))?,
            )
            .map_err(|e| bad(n, &e.to_string()))?,
            None => return Err(bad(2, "expected `snapshot NAME`")),
        };
        let mut manifest = Manifest::new(snapshot);
        let mut last: Option<(Area, Vec<u8>)> = None;
        for (n, line) in lines {
            let (path, record) = parse_record(line).ok_or_else(|| bad(n, "malformed record"))?;
            let key = (record.area(), path.clone());
            if last.as_ref().is_some_and(|l| *l >= key) {
                return Err(bad(n, "records out of order or repeated"));
            }
            last = Some(key);
            manifest
                .insert(&path, record)
                .map_err(|e| bad(n, &e.to_string()))?;
        }
        Ok(manifest)
    }

    /// How `actual` (the tree as it is now) differs from this manifest, sorted by path.
    pub fn compare(&self, actual: &Manifest) -> Vec<Difference> {
        let name = |(area, path): &(Area, Vec<u8>)| match area {
            Area::Root => format!("/{}", escape_path(path)),
            Area::Esp => format!("ESP:/{}", escape_path(path)),
        };
        let mut out = Vec::new();
        for (key, record) in &self.records {
            match actual.records.get(key) {
                None => out.push(Difference::Missing { path: name(key) }),
                Some(r) if r != record => out.push(Difference::Changed { path: name(key) }),
                Some(_) => {}
            }
        }
        for key in actual.records.keys() {
            if !self.records.contains_key(key) {
                out.push(Difference::Added { path: name(key) });
            }
        }
        out.sort();
        out
    }
}

fn mac(key: &[u8; KEY_LEN], body: &[u8]) -> [u8; 32] {
    let mut m = <Hmac<Sha256>>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(body);
    m.finalize().into_bytes().into()
}

fn bad(line: usize, reason: &str) -> SnapshotError {
    SnapshotError::BadManifest {
        line,
        reason: reason.to_owned(),
    }
}

/// (body, tag): the last line must be `hmac-sha256 <64 lower-case hex>\n`.
fn split_mac(bytes: &[u8]) -> Result<(&[u8], [u8; 32]), SnapshotError> {
    if bytes.len() > MAX_MANIFEST_LEN {
        return Err(bad(0, "larger than 256 MiB"));
    }
    let line_len = MAC_PREFIX.len() + 64 + 1;
    let lines = bytes.iter().filter(|&&b| b == b'\n').count();
    if bytes.len() < line_len || !bytes.ends_with(b"\n") {
        return Err(bad(lines, "no hmac-sha256 line at the end"));
    }
    let (body, last) = bytes.split_at(bytes.len() - line_len);
    if !(body.is_empty() || body.ends_with(b"\n")) || !last.starts_with(MAC_PREFIX.as_bytes()) {
        return Err(bad(lines, "no hmac-sha256 line at the end"));
    }
    let hex_part = &last[MAC_PREFIX.len()..line_len - 1];
    let mut tag = [0; 32];
    if !hex_part
        .iter()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        || hex::decode_to_slice(hex_part, &mut tag).is_err()
    {
        return Err(bad(
            lines,
            "the hmac-sha256 value is not 64 lower-case hex digits",
        ));
    }
    Ok((body, tag))
}

fn parse_record(line: &str) -> Option<(Vec<u8>, Record)> {
    let f: Vec<&str> = line.split(' ').collect();
    let [kind, mode, uid, gid, size, hash, path] = f[..] else {
        return None;
    };
    let dec = |s: &str| -> Option<u64> {
        (!s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0')))
        .then(|| s.parse().ok())
        .flatten()
    };
    let oct = |s: &str| -> Option<u32> {
        (!s.is_empty()
            && s.bytes().all(|b| (b'0'..=b'7').contains(&b))
            && (s == "0" || !s.starts_with('0')))
        .then(|| u32::from_str_radix(s, 8).ok())
        .flatten()
    };
    let sha = |s: &str| -> Option<[u8; 32]> {
        let mut out = [0; 32];
        (s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| hex::decode_to_slice(s, &mut out).ok())
            .flatten()
            .map(|()| out)
    };
    let (mode, uid, gid, size) = (
        oct(mode)?,
        u32::try_from(dec(uid)?).ok()?,
        u32::try_from(dec(gid)?).ok()?,
        dec(size)?,
    );
    let no_hash = hash == "-" && size == 0;
    let record = match kind {
        "f" => Record::File {
            mode,
            uid,
            gid,
            size,
            sha256: sha(hash)?,
        },
        "l" if mode == 0o777 => Record::Link {
            uid,
            gid,
            size,
            sha256: sha(hash)?,
        },
        "d" if no_hash => Record::Dir { mode, uid, gid },
        "o" if no_hash => Record::Other { mode, uid, gid },
        "e" if mode == 0 && uid == 0 && gid == 0 => Record::Esp {
            size,
            sha256: sha(hash)?,
        },
        _ => return None,
    };
    Some((unescape_path(path)?, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let mut m = Manifest::new(SnapshotName::parse("root-20260628-093000").unwrap());
        m.insert(
            b"usr",
            Record::Dir {
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        m.insert(
            b"usr/bin/a b%",
            Record::File {
                mode: 0o4755,
                uid: 0,
                gid: 0,
                size: 3,
                sha256: sha256(b"abc"),
            },
        )
        .unwrap();
        m.insert(
            b"usr/lib/x",
            Record::Link {
                uid: 0,
                gid: 0,
                size: 1,
                sha256: sha256(b"y"),
            },
        )
        .unwrap();
        m.insert(
            b"slate/root-20260628-093000/vmlinuz",
            Record::Esp {
                size: 1,
                sha256: sha256(b"k"),
            },
        )
        .unwrap();
        m
    }

    #[test]
    fn round_trip_and_mac() {
        let key = [7; KEY_LEN];
        let m = sample();
        let bytes = m.render_signed(&key);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("f 4755 0 0 3 ba7816bf"), "{text}");
        assert!(text.contains(" usr/bin/a%20b%25\n"), "{text}");
        assert_eq!(Manifest::verify(&bytes, &key).unwrap(), m);
        assert_eq!(
            Manifest::verify(&bytes, &[8; KEY_LEN]),
            Err(SnapshotError::BadMac)
        );
        let mut flipped = bytes.clone();
        let at = text.find("usr/lib/x").unwrap();
        flipped[at] = b'v';
        assert_eq!(Manifest::verify(&flipped, &key), Err(SnapshotError::BadMac));
        assert!(Manifest::parse_unauthenticated(&flipped).is_ok());
    }

    #[test]
    fn compare_names_each_difference() {
        let m = sample();
        let mut now = sample();
        now.records.remove(&(Area::Root, b"usr/lib/x".to_vec()));
        now.insert(
            b"usr/new",
            Record::Dir {
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        now.records.insert(
            (Area::Root, b"usr".to_vec()),
            Record::Dir {
                mode: 0o700,
                uid: 0,
                gid: 0,
            },
        );
        let d: Vec<String> = m.compare(&now).iter().map(ToString::to_string).collect();
        assert_eq!(
            d,
            ["missing: /usr/lib/x", "added: /usr/new", "changed: /usr"]
        );
    }

    #[test]
    fn parser_refusals() {
        let key = [1; KEY_LEN];
        let good = String::from_utf8(sample().render_signed(&key)).unwrap();
        let (body, _) = good.rsplit_once("hmac").unwrap();
        for bad_body in [
            body.replace(" usr\n", " /usr\n"),
            body.replace(" usr\n", " usr/../x\n"),
            body.replace("d 755", "d 0755"),
            body.replace("snapshot root", "snapshot boot"),
            body.replace(MAGIC, "slate-snapshot-manifest 2"),
            format!("{body}d 755 0 0 0 - usr\n"),
            body.replace("%20", "%41"),
        ] {
            let bytes = format!(
                "{bad_body}hmac-sha256 {}\n",
                hex::encode(mac(&key, bad_body.as_bytes()))
            );
            assert!(
                matches!(
                    Manifest::verify(bytes.as_bytes(), &key),
                    Err(SnapshotError::BadManifest { .. })
                ),
                "{bad_body}"
            );
        }
        assert!(Manifest::verify(b"", &key).is_err());
    }
}
