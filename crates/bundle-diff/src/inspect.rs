//! One bundle read into a [`Summary`], through `slate_bundle`'s verified readers: the bundle
//! manifest (read and checked by [`Bundle::open`]), the `installer` blob (hashed as a stream,
//! never held), the `uki` blob (size cap first, then read and checked against its digest), and
//! in the UKI the `.linux`, `.cmdline`, `.uname` and `.initrd` sections.

use std::path::Path;

use slate_bundle::{Bundle, BundleError, Digest, INSTALLER_ROLE, UKI_ROLE};
use slate_uki::section_data;

use crate::diff::Summary;
use crate::initramfs::{split_initramfs, Blob};
use crate::kernel::{plausible_release, release_of_bzimage, section_text};
use crate::rootfs::list_squashfs;
use crate::{DiffError, Part, Problem, Side};

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

/// Read what `diff` compares out of `bundle`, side `side` of the diff.
pub fn inspect(side: Side, bundle: &Bundle) -> Result<Summary, DiffError> {
    let dir = bundle.dir();
    let bundle_err = |source: BundleError| DiffError::Bundle {
        side,
        dir: dir.to_owned(),
        source,
    };
    let content_err = |part: Part| {
        move |source: Problem| DiffError::Content {
            side,
            dir: dir.to_owned(),
            part,
            source,
        }
    };

    let installer = bundle.verify_blob(INSTALLER_ROLE).map_err(bundle_err)?;
    let slate_binary = Blob {
        size: installer.size,
        digest: Digest::parse(&installer.digest)
            .map_err(|_| bundle_err(BundleError::UnsupportedDigest(installer.digest.clone())))?,
    };

    let uki_size = bundle.blob_ref(UKI_ROLE).map_err(bundle_err)?.size;
    if uki_size > MAX_UKI_BYTES {
        return Err(content_err(Part::Uki)(Problem::Oversize {
            size: uki_size,
            limit: MAX_UKI_BYTES,
        }));
    }
    let uki = bundle.read_blob(UKI_ROLE).map_err(bundle_err)?;
    let section = |name: &'static str| -> Result<Option<&[u8]>, DiffError> {
        section_data(&uki, name).map_err(|e| content_err(Part::Uki)(Problem::Pe(e)))
    };
    let required = |name: &'static str| -> Result<&[u8], DiffError> {
        section(name)?.ok_or_else(|| content_err(Part::Uki)(Problem::MissingSection(name)))
    };
    let linux = required(".linux")?;
    let kernel = Blob::of(linux);
    let cmdline = section(".cmdline")?.map(section_text).unwrap_or_default();
    let uname = section(".uname")?
        .map(section_text)
        .and_then(|text| plausible_release(text.as_bytes()));
    let initramfs = split_initramfs(required(".initrd")?)
        .map_err(|e| content_err(Part::Initramfs)(Problem::Initramfs(e)))?;
    let kernel_release = uname
        .or_else(|| match initramfs.module_releases.as_slice() {
            [only] => plausible_release(only.as_bytes()),
            _ => None,
        })
        .or_else(|| release_of_bzimage(linux));
    // The UKI is no longer needed; the root filesystem was copied out of it.
    drop(uki);

    let rootfs = list_squashfs(&initramfs.rootfs)
        .map_err(|e| content_err(Part::Rootfs)(Problem::Rootfs(e)))?;
    let manifest = bundle.manifest();
    Ok(Summary {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        arch: manifest.arch.clone(),
        variant: manifest.variant.clone(),
        kernel_release,
        kernel,
        cmdline,
        modules: initramfs.modules,
        init: initramfs.init,
        slate_binary,
        extensions: initramfs.compressed,
        rootfs,
    })
}
