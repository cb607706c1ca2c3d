//! What the CLI tests share: running the built `slate` binary, and installer bundles.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use slate_bundle::{
    write_installable_bundle, BlobInput, BundleSpec, InstallDefaults, BINARY_MEDIA_TYPE,
    EFI_MEDIA_TYPE, UKI_MEDIA_TYPE,
};
use std::process::{Command, Output};

/// Run the built `slate` with `args`: no stdin, and none of the environment's defaults for a
/// node or registry credentials.
pub fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .env_remove("SLATE_REGISTRY_USERNAME")
        .env_remove("SLATE_NODE")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run slate")
}

/// Run it and return its stdout; fail the test with its stderr when it fails.
pub fn ok(args: &[&str]) -> String {
    let out = slate(args);
    assert!(
        out.status.success(),
        "slate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A path as an argument.
pub fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The install settings of the tests' bundles: 40 MiB ESP, 16 MiB STATE, 3 tries.
pub const TEST_INSTALL: InstallDefaults = InstallDefaults {
    esp_mib: 40,
    state_mib: 16,
    tries: 3,
    menu_timeout: 1,
    keep_versions: slate_bundle::DEFAULT_KEEP_VERSIONS,
};

/// An installer bundle at `out` of `spec` with the given UKI and systemd-boot bytes (a pretend
/// slate binary: nothing here runs it) and [`TEST_INSTALL`].
pub fn write_bundle(out: &Path, spec: BundleSpec<'_>, uki: &[u8], systemd_boot: &[u8]) -> PathBuf {
    write_bundle_with(out, spec, TEST_INSTALL, uki, systemd_boot)
}

/// [`write_bundle`] with other install settings.
pub fn write_bundle_with(
    out: &Path,
    spec: BundleSpec<'_>,
    install: InstallDefaults,
    uki: &[u8],
    systemd_boot: &[u8],
) -> PathBuf {
    write_installable_bundle(
        out,
        spec,
        install,
        &[
            BlobInput {
                role: "uki",
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: uki,
            },
            BlobInput {
                role: "installer",
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: b"\x7fELF pretend slate",
            },
            BlobInput {
                role: "systemd-boot",
                file_name: "systemd-bootx64.efi",
                media_type: EFI_MEDIA_TYPE,
                bytes: systemd_boot,
            },
        ],
    )
    .unwrap();
    out.to_owned()
}
