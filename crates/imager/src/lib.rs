//! The imager: a profile in, an artifact out.
//!
//! [`Inputs::resolve`] checks everything a build needs — kernel, modules and their closure, base
//! rootfs, stub, systemd-boot, slate binary, the output location — before anything is built, so a
//! bad profile fails with a clear error and leaves nothing behind. Builders are functions of the
//! inputs and `SOURCE_DATE_EPOCH`: the same inputs give bit-identical artifacts. Outputs are
//! written beside their destination under a temporary name and renamed into place.

mod artifacts;
mod btrfs_image;
mod build;
mod cache;
mod extension;
mod frame_cache;
mod inputs;
mod output;
mod root_tree;
mod secure_boot;
mod systemd_root;

pub use artifacts::{
    assemble_root, build_boot_initramfs, build_cmdline, build_initramfs, build_rootfs, build_uki,
    compress_initramfs, uki_name,
};
pub use btrfs_image::{
    first_snapshot, fstab_text, pool_uuid, BtrfsImageError, POOL_FS_LABEL, POOL_MIN_MIB,
};
pub use build::{build, plan};
pub use cache::{CacheStats, Stage, StageCache};
pub use extension::{
    extension_paths, make_extension, plan_extension, resolve_extensions, ExtensionInput,
    ExtensionOutput, ExtensionRequest,
};
pub use inputs::{Inputs, OutputKind};
pub use output::{write_output, PendingOutput};
pub use secure_boot::{gen_secureboot_keys, KeygenError, SecureBootInputs, SECURE_BOOT_KEY_FILES};
pub use slate_bundle::BundleManifest;

/// The most bytes read of one binary input — a kernel, an EFI program, the slate binary, an
/// extension image: far above any real one. Inputs are read through `slate_files`, so a FIFO
/// or `/dev/zero` named as one is refused at once by what it is (issue 44).
pub const MAX_INPUT_BYTES: u64 = 1 << 30;
/// The most bytes of a text input: the profile, the kernel's module index, a key.
pub const MAX_TEXT_INPUT_BYTES: u64 = 16 << 20;

/// A file the profile names: a regular file of at most `max` bytes. A missing one is
/// [`ImagerError::MissingInput`]; anything else that is not such a file is refused by name.
pub(crate) fn read_input_bounded(
    what: &'static str,
    path: &std::path::Path,
    max: u64,
) -> Result<Vec<u8>, ImagerError> {
    slate_files::read_file_bounded(path, max, what).map_err(|e| input_error(what, path, e))
}

/// [`read_input_bounded`] with [`MAX_INPUT_BYTES`].
pub(crate) fn read_input(
    what: &'static str,
    path: &std::path::Path,
) -> Result<Vec<u8>, ImagerError> {
    read_input_bounded(what, path, MAX_INPUT_BYTES)
}

/// A text input ([`MAX_TEXT_INPUT_BYTES`], UTF-8).
pub(crate) fn read_text_input(
    what: &'static str,
    path: &std::path::Path,
) -> Result<String, ImagerError> {
    slate_files::read_string_bounded(path, MAX_TEXT_INPUT_BYTES, what)
        .map_err(|e| input_error(what, path, e))
}

fn input_error(
    what: &'static str,
    path: &std::path::Path,
    e: slate_files::FileError,
) -> ImagerError {
    if e.is_not_found() {
        ImagerError::MissingInput {
            what,
            path: path.to_owned(),
            source: e.into_io(),
        }
    } else {
        ImagerError::Input(e)
    }
}

/// Errors of the imager, each naming the input or output concerned.
#[derive(Debug, thiserror::Error)]
pub enum ImagerError {
    /// An input that is not a regular file within its bound (its message names it).
    #[error(transparent)]
    Input(slate_files::FileError),
    #[error("reading the profile {path}")]
    ReadProfile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("profile {path}")]
    Profile {
        path: std::path::PathBuf,
        #[source]
        source: slate_profile::ProfileError,
    },
    #[error("{what} {path} does not exist or cannot be read")]
    MissingInput {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {reason}")]
    BadInput { what: &'static str, reason: String },
    #[error("kernel modules")]
    Modules(#[from] slate_modules::ModulesError),
    #[error("building the squashfs root filesystem")]
    Rootfs(#[from] slate_rootfs::RootfsError),
    #[error("building the initramfs")]
    Cpio(#[from] slate_cpio::CpioError),
    #[error("compressing the initramfs")]
    CompressInitramfs(#[source] std::io::Error),
    #[error("assembling the UKI")]
    Uki(#[from] slate_uki::UkiError),
    #[error("writing the disk image")]
    Install(#[from] slate_installer::InstallError),
    #[error(transparent)]
    Esp(#[from] slate_esp::EspError),
    #[error("laying out the installer bundle")]
    Bundle(#[from] slate_bundle::BundleError),
    #[error("building the btrfs-image")]
    BtrfsImage(#[from] BtrfsImageError),
    #[error("output {path} cannot be written")]
    Output {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the imager is doing, for a progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Step(&'static str),
    Files { done: u64, total: u64 },
}
