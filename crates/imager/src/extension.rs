//! System extensions (docs/formats.md §7.6): `slate imager extension` makes one — a squashfs
//! image of a tree plus its signed manifest — and `imager build` takes the ones a profile names
//! only once each manifest's signature verifies against the profile's `[trust] keys` and its
//! image has the stated size and digest, before anything is written.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Cursor, Read as _};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use slate_profile::ExtensionEntry;
use slate_rootfs::SquashfsOptions;
use slate_trust::{
    ExtensionManifest, PrivateKey, PublicKey, SignedExtension, EXTENSION_MANIFEST_SUFFIX,
    MAX_EXTENSION_MANIFEST_BYTES,
};

use crate::ImagerError;

const FIELD: &str = "rootfs.extensions";

/// One extension a build layers, checked.
#[derive(Debug, Clone)]
pub struct ExtensionInput {
    /// The signed manifest the profile names.
    pub manifest_path: PathBuf,
    pub manifest: ExtensionManifest,
    /// Its squashfs image, beside the manifest.
    pub image: PathBuf,
}

impl ExtensionInput {
    /// The line of the initramfs' `extensions/manifest` (§6.4).
    pub fn entry(&self) -> ExtensionEntry {
        ExtensionEntry {
            file: format!("{}.sqsh", self.manifest.name),
            name: self.manifest.name.clone(),
            version: self.manifest.version.clone(),
            size: self.manifest.size,
            digest: self.manifest.digest.clone(),
        }
    }
}

fn bad(path: &Path, reason: impl std::fmt::Display) -> ImagerError {
    ImagerError::BadInput {
        what: FIELD,
        reason: format!("{}: {reason}", path.display()),
    }
}

/// SHA-256 and length of a file, streamed.
fn hash_file(path: &Path) -> Result<(String, u64), ImagerError> {
    let mut file =
        slate_files::open_regular(path, "the extension image").map_err(|e| bad(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| bad(path, e))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((format!("sha256:{}", hex::encode(hasher.finalize())), size))
}

/// Read, verify and check every extension `paths` names (the profile's `rootfs.extensions`,
/// resolved): each refusal names the field and the manifest's path.
pub fn resolve_extensions(
    paths: &[PathBuf],
    trusted: &[PublicKey],
) -> Result<Vec<ExtensionInput>, ImagerError> {
    let mut out: Vec<ExtensionInput> = Vec::new();
    for path in paths {
        let bytes = slate_files::read_file_bounded(
            path,
            MAX_EXTENSION_MANIFEST_BYTES as u64,
            "the extension manifest",
        )
        .map_err(|e| match e {
            slate_files::FileError::TooLarge { .. } => bad(
                path,
                format!(
                    "more than {MAX_EXTENSION_MANIFEST_BYTES} bytes: not an extension manifest \
                     (the profile names the manifest `slate imager extension` wrote, not the \
                     squashfs image)"
                ),
            ),
            e => bad(path, e),
        })?;
        if bytes.starts_with(b"hsqs") {
            return Err(bad(
                path,
                "a squashfs image, not an extension manifest (the profile names the manifest \
                 `slate imager extension` wrote beside it)",
            ));
        }
        let signed = SignedExtension::parse(&bytes).map_err(|e| bad(path, e))?;
        let manifest = signed.verify(trusted).map_err(|e| bad(path, e))?.clone();
        if let Some(prev) = out.iter().find(|e| e.manifest.name == manifest.name) {
            return Err(bad(
                path,
                format!(
                    "the extension name {} repeats that of {}",
                    manifest.name,
                    prev.manifest_path.display()
                ),
            ));
        }
        let image = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&manifest.image);
        let (digest, size) = hash_file(&image)?;
        let check = |bytes_ok: bool| -> Result<(), ImagerError> {
            if bytes_ok {
                return Ok(());
            }
            let err = if size != manifest.size {
                slate_trust::ExtensionError::SizeMismatch {
                    name: manifest.name.clone(),
                    expected: manifest.size,
                    actual: size,
                }
            } else {
                slate_trust::ExtensionError::DigestMismatch {
                    name: manifest.name.clone(),
                    expected: manifest.digest.clone(),
                    actual: digest.clone(),
                }
            };
            Err(bad(&image, err))
        };
        check(size == manifest.size && digest == manifest.digest)?;
        out.push(ExtensionInput {
            manifest_path: path.clone(),
            manifest,
            image,
        });
    }
    Ok(out)
}

/// Read an extension's image for the initramfs, checked again (it may have changed since the
/// inputs were resolved).
pub(crate) fn read_extension(ext: &ExtensionInput) -> Result<Vec<u8>, ImagerError> {
    let bytes =
        slate_files::read_file_bounded(&ext.image, crate::MAX_INPUT_BYTES, "the extension image")
            .map_err(|e| bad(&ext.image, e))?;
    ext.manifest
        .check_image(&bytes)
        .map_err(|e| bad(&ext.image, e))?;
    Ok(bytes)
}

/// What `slate imager extension` makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionOutput {
    pub manifest_path: PathBuf,
    pub image_path: PathBuf,
    pub manifest: ExtensionManifest,
}

/// The request of `slate imager extension`.
#[derive(Debug, Clone)]
pub struct ExtensionRequest<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub tree: &'a Path,
    pub key: &'a Path,
    pub output: &'a Path,
    pub source_date_epoch: u64,
    pub zstd_level: u32,
}

/// The two files' paths for `name` and `version` in `output`.
pub fn extension_paths(output: &Path, name: &str, version: &str) -> (PathBuf, PathBuf) {
    let stem = format!("{name}-{version}");
    (
        output.join(format!("{stem}{EXTENSION_MANIFEST_SUFFIX}")),
        output.join(format!("{stem}.sqsh")),
    )
}

fn check_request(req: &ExtensionRequest<'_>) -> Result<PrivateKey, ImagerError> {
    let bad = |what, reason: String| ImagerError::BadInput { what, reason };
    if !slate_trust::valid_extension_name(req.name) {
        return Err(bad(
            "--name",
            format!(
                "{:?} is not 1 to 64 of a-z 0-9 _ - starting with a letter or digit",
                req.name
            ),
        ));
    }
    if !slate_trust::valid_extension_version(req.version) {
        return Err(bad(
            "--version",
            format!(
                "{:?} is not 1 to 64 of A-Z a-z 0-9 . ~ ^ _ + -",
                req.version
            ),
        ));
    }
    if !req.tree.is_dir() {
        return Err(bad(
            "--tree",
            format!("{} is not a directory", req.tree.display()),
        ));
    }
    slate_trust::read_private_key(req.key)
        .map_err(|e| bad("--key", format!("{}: {e}", req.key.display())))
}

/// What [`make_extension`] would do, checked (the key read) but nothing written.
pub fn plan_extension(req: &ExtensionRequest<'_>) -> Result<Vec<String>, ImagerError> {
    let key = check_request(req)?;
    let (manifest, image) = extension_paths(req.output, req.name, req.version);
    Ok(vec![
        format!(
            "squashfs (zstd {}) of {} -> {}",
            req.zstd_level,
            req.tree.display(),
            image.display()
        ),
        format!(
            "manifest {} {} signed with key {} -> {}",
            req.name,
            req.version,
            key.public_key().id().short(),
            manifest.display()
        ),
    ])
}

/// Make an extension: the squashfs image of `tree` and its manifest, signed with `key`, in
/// `output` (created if missing). The image is written first, the manifest last.
pub fn make_extension(req: &ExtensionRequest<'_>) -> Result<ExtensionOutput, ImagerError> {
    let key = check_request(req)?;
    let opts = SquashfsOptions {
        source_date_epoch: u32::try_from(req.source_date_epoch).unwrap_or(u32::MAX),
        compression: slate_rootfs::Compression::Zstd {
            level: req.zstd_level,
        },
        ..SquashfsOptions::default()
    };
    let mut out = Cursor::new(Vec::new());
    slate_rootfs::build_squashfs(req.tree, &mut out, &opts)?;
    let image = out.into_inner();
    let (manifest_path, image_path) = extension_paths(req.output, req.name, req.version);
    let manifest = ExtensionManifest {
        name: req.name.to_owned(),
        version: req.version.to_owned(),
        image: image_path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned(),
        size: image.len() as u64,
        digest: slate_trust::sha256_digest(&image),
    };
    let signed = manifest.sign(&key).map_err(|e| ImagerError::BadInput {
        what: "--name/--version",
        reason: e.to_string(),
    })?;
    fs::create_dir_all(req.output).map_err(|source| ImagerError::Output {
        path: req.output.to_owned(),
        source,
    })?;
    crate::write_output(&image_path, &image)?;
    crate::write_output(&manifest_path, &signed)?;
    Ok(ExtensionOutput {
        manifest_path,
        image_path,
        manifest,
    })
}

/// What a path is in one layer, for the program check over the root and its extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    File { executable: bool },
    Symlink(PathBuf),
    Other,
}

/// Every path of an extension's image (absolute), for finding the services' programs in it.
pub(crate) fn extension_nodes(
    ext: &ExtensionInput,
) -> Result<BTreeMap<PathBuf, Node>, ImagerError> {
    use backhand::{FilesystemReader, InnerNode};
    let bytes = read_extension(ext)?;
    let fs = FilesystemReader::from_reader(Cursor::new(&bytes[..]))
        .map_err(|e| bad(&ext.image, format!("not a readable squashfs image: {e}")))?;
    let mut nodes = BTreeMap::new();
    for node in fs.files() {
        let kind = match &node.inner {
            InnerNode::File(_) => Node::File {
                executable: node.header.permissions & 0o111 != 0,
            },
            InnerNode::Symlink(link) => Node::Symlink(link.link.clone()),
            _ => Node::Other,
        };
        nodes.insert(node.fullpath.clone(), kind);
    }
    Ok(nodes)
}
