//! One bundle read into a [`Summary`], through `slate_bundle`'s verified readers: the bundle
//! manifest (read and checked by [`Bundle::open`]), the `installer` blob (hashed as a stream,
//! never held), the `uki` blob (size cap first, then read and checked against its digest), and
//! in the UKI the `.linux`, `.cmdline`, `.uname` and `.initrd` sections ([`inspect_uki`]).
//! A node's running version is read the same way from its booted UKI ([`running_summary`]).

use std::collections::BTreeMap;
use std::path::Path;

use slate_bundle::{Bundle, BundleError, Digest, INSTALLER_ROLE, UKI_ROLE};
use slate_uki::section_data;

use crate::diff::Summary;
use crate::initramfs::{split_initramfs, Blob, FileInfo};
use crate::kernel::{plausible_release, release_of_bzimage, section_text};
use crate::rootfs::{list_squashfs, Listing};
use crate::{DiffError, Part, Problem, Side};
use slate_rootfs::{storage_of, Storage};

/// The largest UKI `diff` reads into memory. A UKI carries the whole root filesystem and lives
/// on an ESP that must hold two of them; 2 GiB is far past any real one.
pub const MAX_UKI_BYTES: u64 = 2 << 30;

/// Open the bundle at `dir` as side `side` of a diff (the image tagged `tag`, or the only one).
pub fn open(side: Side, dir: &Path, tag: Option<&str>) -> Result<Bundle, DiffError> {
    Bundle::open(dir, tag).map_err(|source| DiffError::Bundle {
        side,
        dir: dir.to_owned(),
        source,
    })
}

/// What a UKI holds that `diff` compares: everything of a [`Summary`] but the bundle
/// manifest's fields and the `installer` blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UkiParts {
    pub kernel_release: Option<String>,
    pub kernel: Blob,
    pub cmdline: String,
    pub modules: BTreeMap<String, Digest>,
    pub init: FileInfo,
    pub extensions: Option<Blob>,
    pub extension_versions: BTreeMap<String, String>,
    pub rootfs: Listing,
}

/// The part of a UKI that could not be read, and why: [`inspect`] names the bundle it came
/// from, [`running_summary`] the running version.
#[derive(Debug, thiserror::Error)]
#[error("{part}: {source}")]
pub struct PartError {
    pub part: Part,
    #[source]
    pub source: Problem,
}

/// Take a UKI apart (§3, §6.2): `.linux`, `.cmdline`, `.uname`, the initramfs' `/init`, modules
/// and system extensions, and the root squashfs listed and hashed. Taken by value: the UKI is
/// dropped once the root image is copied out of it, before the listing (at most one of the two
/// is held while files are hashed).
pub fn inspect_uki(uki: Vec<u8>) -> Result<UkiParts, PartError> {
    let err = |part: Part| move |source: Problem| PartError { part, source };
    let size = uki.len() as u64;
    if size > MAX_UKI_BYTES {
        return Err(err(Part::Uki)(Problem::Oversize {
            size,
            limit: MAX_UKI_BYTES,
        }));
    }
    let section = |name: &'static str| -> Result<Option<&[u8]>, PartError> {
        section_data(&uki, name).map_err(|e| err(Part::Uki)(Problem::Pe(e)))
    };
    let required = |name: &'static str| -> Result<&[u8], PartError> {
        section(name)?.ok_or_else(|| err(Part::Uki)(Problem::MissingSection(name)))
    };
    let linux = required(".linux")?;
    let kernel = Blob::of(linux);
    let cmdline = section(".cmdline")?.map(section_text).unwrap_or_default();
    let uname = section(".uname")?
        .map(section_text)
        .and_then(|text| plausible_release(text.as_bytes()));
    let initramfs = split_initramfs(required(".initrd")?)
        .map_err(|e| err(Part::Initramfs)(Problem::Initramfs(e)))?;
    let kernel_release = uname
        .or_else(|| match initramfs.module_releases.as_slice() {
            [only] => plausible_release(only.as_bytes()),
            _ => None,
        })
        .or_else(|| release_of_bzimage(linux));
    // The UKI is no longer needed; the root filesystem was copied out of it.
    drop(uki);

    let rootfs =
        list_squashfs(&initramfs.rootfs).map_err(|e| err(Part::Rootfs)(Problem::Rootfs(e)))?;
    Ok(UkiParts {
        kernel_release,
        kernel,
        cmdline,
        modules: initramfs.modules,
        init: initramfs.init,
        extensions: initramfs.compressed,
        extension_versions: initramfs.extension_versions,
        rootfs,
    })
}

/// How the root squashfs inside `uki` stores its files' data (`.initrd` → `rootfs.sqsh` →
/// its superblock): a node reads it from its running UKI to rebuild the root's copy of a new
/// slate binary (formats.md §7.7, "Derived seeds"), on the bet that the next version's root is
/// stored the same way — a lost bet costs only the fetch it would have saved.
pub fn root_storage(uki: &[u8]) -> Result<Storage, PartError> {
    let err = |part: Part| move |source: Problem| PartError { part, source };
    let initrd = section_data(uki, ".initrd")
        .map_err(|e| err(Part::Uki)(Problem::Pe(e)))?
        .ok_or_else(|| err(Part::Uki)(Problem::MissingSection(".initrd")))?;
    let initramfs =
        split_initramfs(initrd).map_err(|e| err(Part::Initramfs)(Problem::Initramfs(e)))?;
    storage_of(&initramfs.rootfs).map_err(|e| err(Part::Rootfs)(Problem::Storage(e)))
}

/// Read what `diff` compares out of `bundle`, side `side` of the diff.
pub fn inspect(side: Side, bundle: &Bundle) -> Result<Summary, DiffError> {
    let dir = bundle.dir();
    let bundle_err = |source: BundleError| DiffError::Bundle {
        side,
        dir: dir.to_owned(),
        source,
    };

    let installer = bundle.verify_blob(INSTALLER_ROLE).map_err(bundle_err)?;
    let slate_binary = Blob {
        size: installer.size,
        digest: Digest::parse(&installer.digest)
            .map_err(|_| bundle_err(BundleError::UnsupportedDigest(installer.digest.clone())))?,
    };

    let uki_size = bundle.blob_ref(UKI_ROLE).map_err(bundle_err)?.size;
    if uki_size > MAX_UKI_BYTES {
        return Err(DiffError::Content {
            side,
            dir: dir.to_owned(),
            part: Part::Uki,
            source: Problem::Oversize {
                size: uki_size,
                limit: MAX_UKI_BYTES,
            },
        });
    }
    let uki = bundle.read_blob(UKI_ROLE).map_err(bundle_err)?;
    let parts = inspect_uki(uki).map_err(|e| DiffError::Content {
        side,
        dir: dir.to_owned(),
        part: e.part,
        source: e.source,
    })?;
    let manifest = bundle.manifest();
    Ok(summary(
        Identity {
            name: manifest.name.clone(),
            version: manifest.version.clone(),
            arch: manifest.arch.clone(),
            variant: manifest.variant.clone(),
        },
        parts,
        slate_binary,
    ))
}

/// What a bundle manifest says of a version, and a node of the version it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub version: String,
    pub arch: String,
    pub variant: String,
}

/// The [`Summary`] of the version a node runs, from its booted UKI (`slate upgrade --check`,
/// `GET /v1/image`; docs/formats.md §7.5). The node gives what a bundle manifest would say
/// (`identity`). The slate binary is the root's `/usr/bin/slate` (what machined runs, and the
/// file the imager also writes as the bundle's `installer` blob, so the two compare); an image
/// without it has the whole slate as the initramfs' `/init` instead (a profile without
/// `boot.init`). A bad part is a [`DiffError::Running`].
pub fn running_summary(uki: Vec<u8>, identity: Identity) -> Result<Summary, DiffError> {
    let parts = inspect_uki(uki).map_err(|e| DiffError::Running {
        part: e.part,
        source: e.source,
    })?;
    let in_root = parts
        .rootfs
        .get(&b"/usr/bin/slate"[..])
        .and_then(|node| Some((node.size?, node.digest.clone()?)));
    let (size, digest) = in_root.unwrap_or_else(|| (parts.init.size, parts.init.digest.clone()));
    Ok(summary(identity, parts, Blob { size, digest }))
}

fn summary(identity: Identity, parts: UkiParts, slate_binary: Blob) -> Summary {
    Summary {
        name: identity.name,
        version: identity.version,
        arch: identity.arch,
        variant: identity.variant,
        kernel_release: parts.kernel_release,
        kernel: parts.kernel,
        cmdline: parts.cmdline,
        modules: parts.modules,
        init: parts.init,
        slate_binary,
        extensions: parts.extensions,
        extension_versions: parts.extension_versions,
        rootfs: parts.rootfs,
    }
}
