//! An installable bundle of a UKI and an installer, with or without a chunk index: what the
//! chunk index and compressed chunk tests both write.
#![allow(dead_code)]

use std::path::Path;

use slate_bundle::{
    write_installable_bundle, write_installable_bundle_with, BlobInput, BundleSpec,
    InstallDefaults, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};
use slate_delta::ChunkParams;

pub const SPEC: BundleSpec<'static> = BundleSpec {
    name: "slate",
    version: "2.0.0",
    arch: "amd64",
    variant: "demo",
};

pub const INSTALL: InstallDefaults = InstallDefaults {
    esp_mib: 64,
    state_mib: 32,
    tries: 3,
    menu_timeout: 1,
    keep_versions: 2,
};

/// Writes the bundle into `dir`, chunk-indexed with `chunking` when given.
pub fn write(dir: &Path, uki: &[u8], installer: &[u8], chunking: Option<ChunkParams>) {
    let blobs = [
        BlobInput {
            role: slate_bundle::UKI_ROLE,
            file_name: "slate.efi",
            media_type: UKI_MEDIA_TYPE,
            bytes: uki,
        },
        BlobInput {
            role: slate_bundle::INSTALLER_ROLE,
            file_name: "slate",
            media_type: BINARY_MEDIA_TYPE,
            bytes: installer,
        },
    ];
    match chunking {
        Some(params) => write_installable_bundle_with(dir, SPEC, INSTALL, &blobs, params),
        None => write_installable_bundle(dir, SPEC, INSTALL, &blobs),
    }
    .unwrap();
}
