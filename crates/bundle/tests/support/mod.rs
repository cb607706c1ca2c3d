//! The bundle the tests build: slate 2.0.0 for amd64/demo, a UKI and (optionally) an installer.

use std::path::Path;

use slate_bundle::{
    write_bundle, BlobInput, BundleSpec, BINARY_MEDIA_TYPE, INSTALLER_ROLE, UKI_MEDIA_TYPE,
    UKI_ROLE,
};

/// Writes the test bundle into `dir`.
pub fn write_test_bundle(dir: &Path, uki: &[u8], installer: Option<&[u8]>) {
    let mut blobs = vec![BlobInput {
        role: UKI_ROLE,
        file_name: "slate-2.0.0.efi",
        media_type: UKI_MEDIA_TYPE,
        bytes: uki,
    }];
    if let Some(installer) = installer {
        blobs.push(BlobInput {
            role: INSTALLER_ROLE,
            file_name: "slate",
            media_type: BINARY_MEDIA_TYPE,
            bytes: installer,
        });
    }
    write_bundle(
        dir,
        BundleSpec {
            name: "slate",
            version: "2.0.0",
            arch: "amd64",
            variant: "demo",
        },
        &blobs,
    )
    .unwrap();
}
