//! The root filesystem as `diff` sees it: every node of `rootfs.sqsh`, read with `backhand`,
//! with what is compared — type, permission bits, owner, and by type the size and content
//! digest (regular files), the target (symlinks) or the device number. Modification times are
//! left out: images are built with one fixed mtime (`SOURCE_DATE_EPOCH`), so comparing them
//! would flag every file whenever the build date moves.
//!
//! Nothing in the image is trusted: a node's declared size is only used to refuse an image that
//! would expand beyond [`MAX_EXPANSION`] times its own size (checked before any file is read),
//! and each file is hashed as a stream whose length must come out equal to what its inode says.

use std::collections::BTreeMap;
use std::io::{Cursor, Read as _};
use std::os::unix::ffi::OsStrExt as _;

use backhand::{BackhandError, FilesystemReader, InnerNode, SquashfsFileReader};
use serde::{Deserialize, Serialize, Serializer};
use slate_bundle::{Digest, Hasher};

/// How many times its own size an image may expand to, counting every regular file's declared
/// size, before it is refused as a decompression bomb. slate's zstd images of a root filesystem
/// expand about three times; sparse or highly compressible files more, but not 256 times.
pub const MAX_EXPANSION: u64 = 256;
/// Added to the expansion limit, so that tiny images of a few compressible files are read.
pub const EXPANSION_ALLOWANCE: u64 = 64 << 20;

/// The type of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeKind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Dir => "directory",
            NodeKind::Symlink => "symlink",
            NodeKind::CharDevice => "character device",
            NodeKind::BlockDevice => "block device",
            NodeKind::Fifo => "fifo",
            NodeKind::Socket => "socket",
        }
    }
}

/// One node of the root filesystem, with everything `diff` compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    pub kind: NodeKind,
    /// Permission bits (`0o7777`), serialized as four octal digits (`"0755"`).
    #[serde(serialize_with = "octal")]
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    /// Regular files: the length in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Regular files: `sha256:<hex>` of the content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// Symlinks: the target (lossy UTF-8; compared as bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip)]
    pub target_bytes: Vec<u8>,
    /// Device nodes: the device number as squashfs stores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
}

fn octal<S: Serializer>(mode: &u16, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{mode:04o}"))
}

/// Every node of an image by its absolute path (as bytes: names need not be UTF-8), the root
/// `/` included.
pub type Listing = BTreeMap<Vec<u8>, Node>;

/// Why an image could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("not a squashfs image slate can read: {0}")]
    Squashfs(BackhandError),
    #[error(
        "its files declare {declared} bytes, more than {limit} ({MAX_EXPANSION} times the image \
         and {EXPANSION_ALLOWANCE} bytes): refused as a decompression bomb"
    )]
    Expansion { declared: u64, limit: u64 },
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: its inode says {declared} bytes, its data holds {actual}")]
    Length {
        path: String,
        declared: u64,
        actual: u64,
    },
    #[error("{path}: not a plain absolute path")]
    BadPath { path: String },
    #[error("{path}: listed twice")]
    Duplicate { path: String },
}

/// A path for messages and output: lossy UTF-8.
pub fn display_path(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// The listing of the squashfs image `image`, every regular file read and hashed.
pub fn list_squashfs(image: &[u8]) -> Result<Listing, RootfsError> {
    let fs = FilesystemReader::from_reader(Cursor::new(image)).map_err(RootfsError::Squashfs)?;
    let limit = u64::try_from(image.len())
        .unwrap_or(u64::MAX)
        .saturating_mul(MAX_EXPANSION)
        .saturating_add(EXPANSION_ALLOWANCE);
    let declared = fs
        .files()
        .filter_map(|node| match &node.inner {
            InnerNode::File(file) => Some(file_len(file)),
            _ => None,
        })
        .fold(0u64, u64::saturating_add);
    if declared > limit {
        return Err(RootfsError::Expansion { declared, limit });
    }
    let mut listing = Listing::new();
    for node in fs.files() {
        let path = node.fullpath.as_os_str().as_bytes().to_vec();
        check_path(&path)?;
        let header = &node.header;
        let mut entry = Node {
            kind: NodeKind::Dir,
            mode: header.permissions & 0o7777,
            uid: header.uid,
            gid: header.gid,
            size: None,
            digest: None,
            target: None,
            target_bytes: Vec::new(),
            device: None,
        };
        match &node.inner {
            InnerNode::File(file) => {
                let (size, digest) = hash_file(&fs, file, &path)?;
                entry.kind = NodeKind::File;
                entry.size = Some(size);
                entry.digest = Some(digest);
            }
            InnerNode::Symlink(link) => {
                let bytes = link.link.as_os_str().as_bytes().to_vec();
                entry.kind = NodeKind::Symlink;
                entry.target = Some(display_path(&bytes));
                entry.target_bytes = bytes;
            }
            InnerNode::Dir(_) => {}
            InnerNode::CharacterDevice(dev) => {
                entry.kind = NodeKind::CharDevice;
                entry.device = Some(dev.device_number);
            }
            InnerNode::BlockDevice(dev) => {
                entry.kind = NodeKind::BlockDevice;
                entry.device = Some(dev.device_number);
            }
            InnerNode::NamedPipe => entry.kind = NodeKind::Fifo,
            InnerNode::Socket => entry.kind = NodeKind::Socket,
        }
        if listing.insert(path.clone(), entry).is_some() {
            return Err(RootfsError::Duplicate {
                path: display_path(&path),
            });
        }
    }
    Ok(listing)
}

fn file_len(file: &SquashfsFileReader) -> u64 {
    u64::try_from(file.file_len()).unwrap_or(u64::MAX)
}

/// `/` and plain names below it: an empty name, `.` or `..` would alias another path (a name
/// holding `/` aliases one too, and is caught as a path listed twice).
fn check_path(bytes: &[u8]) -> Result<(), RootfsError> {
    let plain = |name: &[u8]| !name.is_empty() && name != b"." && name != b"..";
    let ok = bytes == b"/"
        || bytes
            .strip_prefix(b"/")
            .is_some_and(|rest| rest.split(|&b| b == b'/').all(plain));
    if ok {
        Ok(())
    } else {
        Err(RootfsError::BadPath {
            path: display_path(bytes),
        })
    }
}

/// The length and digest of a regular file's content, read as a stream; the length must be
/// what the inode declares.
fn hash_file(
    fs: &FilesystemReader<'_>,
    file: &SquashfsFileReader,
    path: &[u8],
) -> Result<(u64, Digest), RootfsError> {
    let read_err = |source| RootfsError::Read {
        path: display_path(path),
        source,
    };
    let declared = file_len(file);
    let reader = fs
        .file(file)
        .reader_checked()
        .map_err(|e| read_err(std::io::Error::other(e)))?;
    // One byte more than declared is enough to see a file that runs long.
    let mut hasher = Hasher::new();
    std::io::copy(&mut reader.take(declared.saturating_add(1)), &mut hasher).map_err(read_err)?;
    let actual = hasher.bytes();
    if actual != declared {
        return Err(RootfsError::Length {
            path: display_path(path),
            declared,
            actual,
        });
    }
    Ok((actual, hasher.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_absolute_paths_are_taken() {
        for good in [&b"/"[..], b"/etc", b"/etc/os-release", b"/a/.b/..c"] {
            assert!(check_path(good).is_ok(), "{good:?}");
        }
        for bad in [
            &b""[..],
            b"etc",
            b"//",
            b"/etc/",
            b"/a//b",
            b"/a/./b",
            b"/a/..",
            b"/.",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }
}
