//! The initramfs of a slate UKI, taken apart (docs/formats.md §6.2): one newc archive — `init`
//! (the slate binary), the module closure under `lib/modules/<release>/`,
//! `etc/slate/modules.load`, `rootfs.sqsh` — in a UKI one zstd stream, followed, when the image
//! has system extensions, by a gzip member holding `extensions/` (the kernel refuses a member
//! inside a compressed one). The zstd stream is decompressed (with a limit); the extensions'
//! member is compared as one blob, and its `extensions/manifest` read for the extensions' names
//! and versions.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;

use serde::{Deserialize, Serialize};
use slate_bundle::Digest;
use slate_cpio::{parse_newc, CpioError, Entry, EntryKind};
use slate_profile::image_contract::ROOTFS_IMAGE_PATH;

/// The initramfs init: the kernel runs `/init`.
pub const INIT_PATH: &str = "init";
/// Where the kernel modules live, one directory per kernel release.
pub const MODULES_DIR: &str = "lib/modules";

/// A zstd frame's magic number: how the imager stores the initramfs in a UKI.
pub const ZSTD_MAGIC: &[u8] = b"\x28\xb5\x2f\xfd";
/// How many times its compressed size a zstd initramfs may decompress to (the imager's is about
/// two: a static binary and an already compressed squashfs), plus [`INITRAMFS_ALLOWANCE`].
pub const MAX_INITRAMFS_EXPANSION: u64 = 64;
/// Added to the decompression limit, so that small initramfs images are read.
pub const INITRAMFS_ALLOWANCE: u64 = 64 << 20;
/// The largest decompressed initramfs read, whatever its compressed size.
pub const MAX_INITRAMFS_BYTES: u64 = 4 << 30;

/// The magic numbers of the compressed initrd members the kernel accepts (gzip, zstd, xz, lz4,
/// bzip2, lzma, lzo).
const COMPRESSED_MAGICS: &[&[u8]] = &[
    b"\x1f\x8b",
    b"\x28\xb5\x2f\xfd",
    b"\xfd7zXZ\0",
    b"\x02\x21\x4c\x18",
    b"BZh",
    b"\x5d\x00\x00",
    b"\x89LZO",
];

/// A file of the initramfs: its path (absolute, as on the booted initramfs), size and digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    pub size: u64,
    pub digest: Digest,
}

/// A run of bytes compared as a whole: size and digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub size: u64,
    pub digest: Digest,
}

impl Blob {
    pub fn of(bytes: &[u8]) -> Self {
        Blob {
            size: bytes.len() as u64,
            digest: Digest::of(bytes),
        }
    }
}

/// What `diff` takes from an initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initramfs {
    pub init: FileInfo,
    /// Each regular file under `lib/modules/<release>/`, by its path below that directory
    /// (below `lib/modules/` when there are several releases), with its digest.
    pub modules: BTreeMap<String, Digest>,
    /// The directory names under `lib/modules/`, sorted: the kernel releases the modules are
    /// for.
    pub module_releases: Vec<String>,
    /// The root squashfs image, `rootfs.sqsh`.
    pub rootfs: Vec<u8>,
    /// The compressed members after the uncompressed archive (system extensions), if any.
    pub compressed: Option<Blob>,
    /// The system extensions by name, with their versions (from `extensions/manifest`).
    pub extension_versions: BTreeMap<String, String>,
}

/// Why an initramfs could not be taken apart.
#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    #[error("not a newc archive slate can read: {0}")]
    Cpio(CpioError),
    #[error("it holds no /{0}")]
    Missing(&'static str),
    #[error("/{0} is not a regular file")]
    NotAFile(String),
    #[error("/{0} is in it twice")]
    Duplicate(String),
    #[error("its zstd compression cannot be read: {0}")]
    Zstd(std::io::Error),
    #[error("decompressed, it is larger than {limit} bytes: refused as a decompression bomb")]
    Expansion { limit: u64 },
    #[error("its system extensions' member cannot be read: {0}")]
    Extensions(String),
}

/// The initrd as the kernel unpacks it: as it is when it starts with anything but a zstd
/// frame, else its leading zstd frames decompressed — at most [`MAX_INITRAMFS_EXPANSION`]
/// times their size plus [`INITRAMFS_ALLOWANCE`], and at most [`MAX_INITRAMFS_BYTES`] — with
/// what follows them (the extensions' gzip member) after, as it is.
pub fn decompress_initrd(initrd: &[u8]) -> Result<Cow<'_, [u8]>, InitramfsError> {
    if !initrd.starts_with(ZSTD_MAGIC) {
        return Ok(Cow::Borrowed(initrd));
    }
    let mut frames = 0;
    while initrd[frames..].starts_with(ZSTD_MAGIC) {
        let size =
            zstd::zstd_safe::find_frame_compressed_size(&initrd[frames..]).map_err(|code| {
                InitramfsError::Zstd(std::io::Error::other(zstd::zstd_safe::get_error_name(code)))
            })?;
        frames += size;
    }
    let (compressed, rest) = initrd.split_at(frames);
    let limit = u64::try_from(compressed.len())
        .unwrap_or(u64::MAX)
        .saturating_mul(MAX_INITRAMFS_EXPANSION)
        .saturating_add(INITRAMFS_ALLOWANCE)
        .min(MAX_INITRAMFS_BYTES);
    let decoder = zstd::stream::read::Decoder::new(compressed).map_err(InitramfsError::Zstd)?;
    let mut out = Vec::new();
    decoder
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(InitramfsError::Zstd)?;
    if out.len() as u64 > limit {
        return Err(InitramfsError::Expansion { limit });
    }
    // The kernel skips zero bytes between compressed members (the imager pads each to four);
    // the member is put at a four-byte boundary, where the archive reader looks for it.
    let rest = &rest[rest.iter().take_while(|&&b| b == 0).count()..];
    if !rest.is_empty() {
        out.resize(out.len().next_multiple_of(4), 0);
        out.extend_from_slice(rest);
    }
    Ok(Cow::Owned(out))
}

/// The extensions' names and versions from the compressed members after the main archive: a
/// gzip member (as the imager writes it; none of another kind) holding `extensions/manifest`,
/// decompressed within the same bounds as the initramfs.
pub fn extension_versions(members: &[u8]) -> Result<BTreeMap<String, String>, InitramfsError> {
    let bad = |why: String| InitramfsError::Extensions(why);
    if !members.starts_with(b"\x1f\x8b") {
        return Err(bad("it is not a gzip member".into()));
    }
    let limit = u64::try_from(members.len())
        .unwrap_or(u64::MAX)
        .saturating_mul(MAX_INITRAMFS_EXPANSION)
        .saturating_add(INITRAMFS_ALLOWANCE)
        .min(MAX_INITRAMFS_BYTES);
    let mut archive = Vec::new();
    let mut member = flate2::bufread::GzDecoder::new(members);
    (&mut member)
        .take(limit.saturating_add(1))
        .read_to_end(&mut archive)
        .map_err(|e| bad(format!("gzip: {e}")))?;
    if archive.len() as u64 > limit {
        return Err(InitramfsError::Expansion { limit });
    }
    // One member, then at most the zeros that pad it to four bytes.
    if member.into_inner().iter().any(|&b| b != 0) {
        return Err(bad("something follows its gzip member".into()));
    }
    let entries = parse_newc(&archive).map_err(|e| bad(e.to_string()))?;
    let manifest = entries
        .iter()
        .find(|e| normalize(&e.name) == slate_profile::image_contract::EXTENSIONS_MANIFEST_PATH)
        .ok_or_else(|| bad("it holds no extensions/manifest".into()))?;
    let text = std::str::from_utf8(&manifest.data)
        .map_err(|_| bad("extensions/manifest is not UTF-8".into()))?;
    let listed = slate_profile::parse_extensions_manifest(text)
        .map_err(|e| bad(format!("extensions/manifest: {e}")))?;
    Ok(listed.into_iter().map(|e| (e.name, e.version)).collect())
}

/// The entries of the uncompressed archives at the start of `initrd`, and the compressed
/// members after them (empty if none). The strict reader refuses what is not newc; a refusal
/// at an archive boundary where a compressed member starts is where the uncompressed part ends.
pub fn leading_archives(initrd: &[u8]) -> Result<(Vec<Entry>, &[u8]), CpioError> {
    let error = match parse_newc(initrd) {
        Ok(entries) => return Ok((entries, &[])),
        Err(error) => error,
    };
    // Where a header was expected: no newc magic there, or too few bytes for a header.
    let offset = match &error {
        CpioError::BadMagic { offset, .. } => *offset,
        CpioError::Truncated {
            what: "header",
            offset,
            ..
        } => *offset,
        _ => return Err(error),
    };
    let rest = initrd.get(offset..).unwrap_or_default();
    if offset == 0 || !COMPRESSED_MAGICS.iter().any(|m| rest.starts_with(m)) {
        return Err(error);
    }
    // Mid-archive, this fails for want of a trailer.
    let entries = parse_newc(&initrd[..offset])?;
    Ok((entries, rest))
}

/// `./init`, `/init` and `init` are the same file to the kernel.
fn normalize(name: &[u8]) -> String {
    let mut name = String::from_utf8_lossy(name).into_owned();
    loop {
        if let Some(rest) = name.strip_prefix("./") {
            name = rest.to_owned();
        } else if let Some(rest) = name.strip_prefix('/') {
            name = rest.to_owned();
        } else {
            return name;
        }
    }
}

/// Take `initrd` (the UKI's `.initrd` section, zstd-compressed or not) apart.
pub fn split_initramfs(initrd: &[u8]) -> Result<Initramfs, InitramfsError> {
    let initrd = decompress_initrd(initrd)?;
    let (entries, rest) = leading_archives(&initrd).map_err(InitramfsError::Cpio)?;
    let mut init = None;
    let mut rootfs = None;
    let mut module_files = Vec::new();
    let mut module_releases = BTreeSet::new();
    for entry in entries {
        let name = normalize(&entry.name);
        let is_file = entry.kind() == Some(EntryKind::File);
        if name == INIT_PATH || name == ROOTFS_IMAGE_PATH {
            if !is_file {
                return Err(InitramfsError::NotAFile(name));
            }
            let slot = if name == INIT_PATH {
                &mut init
            } else {
                &mut rootfs
            };
            if slot.replace(entry.data).is_some() {
                return Err(InitramfsError::Duplicate(name));
            }
        } else if let Some(below) = name
            .strip_prefix(MODULES_DIR)
            .and_then(|r| r.strip_prefix('/'))
        {
            match below.split_once('/') {
                None if entry.kind() == Some(EntryKind::Directory) => {
                    module_releases.insert(below.to_owned());
                }
                Some((_, path)) if is_file && !path.is_empty() => {
                    module_files.push((below.to_owned(), Digest::of(&entry.data)));
                }
                _ => {}
            }
        }
    }
    let init = init.ok_or(InitramfsError::Missing(INIT_PATH))?;
    let rootfs = rootfs.ok_or(InitramfsError::Missing(ROOTFS_IMAGE_PATH))?;
    // One release (slate's images): modules by their path below it, so that a kernel update
    // compares module by module.
    let strip = module_releases.len() == 1;
    let mut modules = BTreeMap::new();
    for (below, digest) in module_files {
        let key = match below.split_once('/') {
            Some((_, path)) if strip => path.to_owned(),
            _ => below,
        };
        if modules.insert(key.clone(), digest).is_some() {
            return Err(InitramfsError::Duplicate(format!("{MODULES_DIR}/{key}")));
        }
    }
    Ok(Initramfs {
        init: FileInfo {
            path: format!("/{INIT_PATH}"),
            size: init.len() as u64,
            digest: Digest::of(&init),
        },
        modules,
        module_releases: module_releases.into_iter().collect(),
        rootfs,
        compressed: (!rest.is_empty()).then(|| Blob::of(rest)),
        extension_versions: if rest.is_empty() {
            BTreeMap::new()
        } else {
            extension_versions(rest)?
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_cpio::{concat_initrds, CpioWriter};

    fn archive(init: &[u8], release: &str, modules: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = CpioWriter::new();
        w.dir("lib", 0o755).unwrap();
        w.dir("lib/modules", 0o755).unwrap();
        w.dir(&format!("lib/modules/{release}"), 0o755).unwrap();
        w.dir(&format!("lib/modules/{release}/kernel"), 0o755)
            .unwrap();
        for (path, data) in modules {
            w.file(
                &format!("lib/modules/{release}/{path}"),
                0o644,
                data.to_vec(),
            )
            .unwrap();
        }
        w.file("init", 0o755, init.to_vec()).unwrap();
        w.file("rootfs.sqsh", 0o644, b"squashfs".to_vec()).unwrap();
        w.finish()
    }

    #[test]
    fn modules_init_and_rootfs_are_found() {
        let bytes = archive(b"\x7fELF", "6.1.0-test", &[("kernel/a.ko", b"a")]);
        let x = split_initramfs(&bytes).unwrap();
        assert_eq!(x.init.path, "/init");
        assert_eq!(x.init.size, 4);
        assert_eq!(x.init.digest, Digest::of(b"\x7fELF"));
        assert_eq!(x.module_releases, ["6.1.0-test"]);
        assert_eq!(
            x.modules.keys().collect::<Vec<_>>(),
            ["kernel/a.ko"],
            "keyed below the release"
        );
        assert_eq!(x.rootfs, b"squashfs");
        assert_eq!(x.compressed, None);
    }

    #[test]
    fn a_compressed_member_after_the_archive_is_one_blob() {
        let main = archive(b"init", "6.1", &[]);
        let member = extensions_member("");
        let gz = member.as_slice();
        let joined = concat_initrds(&[&main, gz]);
        let x = split_initramfs(&joined).unwrap();
        assert_eq!(x.init.size, 4);
        let rest = &joined[main.len()..];
        assert_eq!(x.compressed, Some(Blob::of(rest)));
        // Garbage that is no compressed member stays an error.
        let joined = concat_initrds(&[&main, b"garbage!"]);
        assert!(matches!(
            split_initramfs(&joined),
            Err(InitramfsError::Cpio(CpioError::Truncated { .. }))
        ));
        let joined = concat_initrds(&[&main, &[b'x'; 200]]);
        assert!(matches!(
            split_initramfs(&joined),
            Err(InitramfsError::Cpio(CpioError::BadMagic { .. }))
        ));
        // And so does a gzip magic where an entry of the archive should be.
        let mut cut = main[..main.len() - 124].to_vec();
        cut.extend_from_slice(gz);
        assert!(split_initramfs(&cut).is_err());
    }

    #[test]
    fn a_zstd_initramfs_is_read_as_its_archive() {
        let main = archive(b"init", "6.1", &[("kernel/a.ko", b"a")]);
        let joined = concat_initrds(&[&main, &extensions_member("")]);
        let plain = split_initramfs(&joined).unwrap();
        // As the imager compresses it: one frame at level 3.
        let compressed = zstd::bulk::compress(&joined, 3).unwrap();
        assert!(compressed.starts_with(ZSTD_MAGIC));
        assert_eq!(split_initramfs(&compressed).unwrap(), plain);
        // Two frames are one stream.
        let half = joined.len() / 2;
        let mut two = zstd::bulk::compress(&joined[..half], 3).unwrap();
        two.extend(zstd::bulk::compress(&joined[half..], 3).unwrap());
        assert_eq!(split_initramfs(&two).unwrap(), plain);

        // Cut short, or followed by garbage: an error.
        let cut = &compressed[..compressed.len() - 3];
        assert!(matches!(split_initramfs(cut), Err(InitramfsError::Zstd(_))));
        let mut trailing = compressed.clone();
        trailing.extend_from_slice(b"garbage");
        // (here the garbage follows the extensions' member the stream ends with)
        assert!(matches!(
            split_initramfs(&trailing),
            Err(InitramfsError::Extensions(_))
        ));
    }

    /// The gzip member of `extensions/manifest` with `text` (as the imager appends it).
    fn extensions_member(text: &str) -> Vec<u8> {
        use std::io::Write as _;
        let mut w = CpioWriter::new();
        w.dir("extensions", 0o755).unwrap();
        w.file("extensions/manifest", 0o644, text.as_bytes().to_vec())
            .unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&w.finish()).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn extensions_after_a_zstd_archive_are_named_with_their_versions() {
        let main = archive(b"init", "6.1", &[]);
        let digest = format!("sha256:{}", "ab".repeat(32));
        let member = extensions_member(&format!(
            "{}\ncontainerd.sqsh containerd 1.6.20-1 4096 {digest}\n",
            slate_profile::EXTENSIONS_MANIFEST_HEADER
        ));
        // As the imager joins them: the frame padded with zeros to four bytes, then the member.
        let frame = zstd::bulk::compress(&main, 3).unwrap();
        let initrd = concat_initrds(&[&frame, &member]);
        let x = split_initramfs(&initrd).unwrap();
        // The member as it lies in the initrd, with the zeros that pad it.
        let start = frame.len().next_multiple_of(4);
        assert_eq!(&initrd[start..start + member.len()], member.as_slice());
        assert_eq!(x.compressed, Some(Blob::of(&initrd[start..])));
        assert_eq!(
            x.extension_versions,
            BTreeMap::from([("containerd".to_owned(), "1.6.20-1".to_owned())])
        );
        // A member without a manifest, or with a bad one, is named.
        let empty = extensions_member("");
        let mut bad = zstd::bulk::compress(&main, 3).unwrap();
        bad.extend_from_slice(&extensions_member("containerd.sqsh containerd\n"));
        let err = split_initramfs(&bad).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "its system extensions' member cannot be read: extensions/manifest: line 1"
            ),
            "{err}"
        );
        assert!(extension_versions(&empty).unwrap().is_empty());
        let err = extension_versions(b"\x28\xb5\x2f\xfd")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a gzip member"), "{err}");
    }

    /// The imager's layout since issue 41: the root squashfs in its own uncompressed archive
    /// between the zstd frame and the extensions' member.
    #[test]
    fn a_root_archive_between_the_frame_and_the_extensions_is_read() {
        let mut w = CpioWriter::new();
        w.file("init", 0o755, b"init".to_vec()).unwrap();
        let main = w.finish();
        let mut w = CpioWriter::new();
        w.file("rootfs.sqsh", 0o644, b"squashfs".to_vec()).unwrap();
        let root = w.finish();
        let member = extensions_member(&format!("{}\n", slate_profile::EXTENSIONS_MANIFEST_HEADER));
        let frame = zstd::bulk::compress(&main, 3).unwrap();
        let x = split_initramfs(&concat_initrds(&[&frame, &root, &member])).unwrap();
        assert_eq!((x.init.size, x.rootfs.as_slice()), (4, &b"squashfs"[..]));
        assert_eq!(x.compressed, Some(Blob::of(&concat_initrds(&[&member]))));
        let x = split_initramfs(&concat_initrds(&[&frame, &root])).unwrap();
        assert_eq!(
            (x.rootfs.as_slice(), x.compressed),
            (&b"squashfs"[..], None)
        );
    }

    #[test]
    fn a_zstd_bomb_is_refused() {
        // 80 MiB of zeros in a few KiB: past 64 MiB + 64 times the frame.
        let bomb = zstd::bulk::compress(&vec![0u8; 80 << 20], 3).unwrap();
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let limit = bomb.len() as u64 * MAX_INITRAMFS_EXPANSION + INITRAMFS_ALLOWANCE;
        assert_eq!(
            decompress_initrd(&bomb).unwrap_err().to_string(),
            format!(
                "decompressed, it is larger than {limit} bytes: refused as a decompression bomb"
            )
        );
    }

    #[test]
    fn missing_or_doubled_parts_are_named() {
        let mut w = CpioWriter::new();
        w.file("rootfs.sqsh", 0o644, b"x".to_vec()).unwrap();
        assert_eq!(
            split_initramfs(&w.finish()).unwrap_err().to_string(),
            "it holds no /init"
        );
        let mut w = CpioWriter::new();
        w.file("init", 0o755, b"x".to_vec()).unwrap();
        assert_eq!(
            split_initramfs(&w.finish()).unwrap_err().to_string(),
            "it holds no /rootfs.sqsh"
        );
        let one = archive(b"a", "6.1", &[]);
        let two = concat_initrds(&[&one, &one]);
        assert_eq!(
            split_initramfs(&two).unwrap_err().to_string(),
            "/init is in it twice"
        );
        let mut w = CpioWriter::new();
        w.dir("init", 0o755).unwrap();
        assert_eq!(
            split_initramfs(&w.finish()).unwrap_err().to_string(),
            "/init is not a regular file"
        );
    }

    #[test]
    fn several_releases_key_modules_by_release() {
        let a = archive(b"i", "6.1", &[("kernel/a.ko", b"a")]);
        let mut w = CpioWriter::new();
        w.dir("lib", 0o755).unwrap();
        w.dir("lib/modules", 0o755).unwrap();
        w.dir("lib/modules/6.2", 0o755).unwrap();
        w.dir("lib/modules/6.2/kernel", 0o755).unwrap();
        w.file("lib/modules/6.2/kernel/a.ko", 0o644, b"b".to_vec())
            .unwrap();
        let joined = concat_initrds(&[&a, &w.finish()]);
        let x = split_initramfs(&joined).unwrap();
        assert_eq!(x.module_releases, ["6.1", "6.2"]);
        assert_eq!(
            x.modules.keys().collect::<Vec<_>>(),
            ["6.1/kernel/a.ko", "6.2/kernel/a.ko"]
        );
    }
}
