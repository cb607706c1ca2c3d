//! System extensions (docs/formats.md §7.6): `make_extension` writes a squashfs image and its
//! signed manifest; a build takes an extension only when the manifest's signature verifies
//! against the profile's `[trust] keys` and the image has the stated size and digest, refusing
//! otherwise (naming `rootfs.extensions` and the path) before anything is built. A service's
//! program may live in an extension; the initramfs carries the images and a manifest naming
//! each one's name, version, size and digest.

mod common;

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use slate_imager::{build_initramfs, build_rootfs, make_extension, ExtensionRequest};
use slate_trust::PrivateKey;

use common::BASE_PROFILE as BASE;

/// A base root, keys k1 and k2, and the extension `tools` 1.0 (holding `/usr/bin/tool`)
/// signed with `signer` in `ext/`.
fn fixture(signer: u8) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::write(root.join("bin/init"), "#!/bin/sh\n").unwrap();
    fs::write(dir.path().join("slate"), "\x7fELF pretend slate").unwrap();
    fs::create_dir_all(dir.path().join("keys")).unwrap();
    for seed in [1u8, 2] {
        let key = PrivateKey::from_scalar(&[seed; 32]).unwrap();
        fs::write(
            dir.path().join(format!("keys/k{seed}.pub")),
            key.public_key().to_pem(),
        )
        .unwrap();
        fs::write(dir.path().join(format!("keys/k{seed}.key")), key.to_pem()).unwrap();
    }
    let tree = dir.path().join("tree");
    fs::create_dir_all(tree.join("usr/bin")).unwrap();
    fs::write(tree.join("usr/bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    fs::set_permissions(tree.join("usr/bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.path().join(format!("keys/k{signer}.key"));
    let out = make_extension(&ExtensionRequest {
        name: "tools",
        version: "1.0",
        tree: &tree,
        key: &key,
        output: &dir.path().join("ext"),
        source_date_epoch: 1_700_000_000,
        zstd_level: 3,
    })
    .unwrap();
    assert_eq!(out.manifest_path, dir.path().join("ext/tools-1.0.ext"));
    assert_eq!(out.image_path, dir.path().join("ext/tools-1.0.sqsh"));
    dir
}

fn profile(dir: &Path, extensions: &str, extra: &str) {
    let text = BASE.replace(
        "zstd_level = 3\n",
        &format!("zstd_level = 3\nextensions = [{extensions}]\n"),
    );
    fs::write(
        dir.join("profile.toml"),
        format!("{text}{extra}[trust]\nkeys = [\"keys/k1.pub\"]\n"),
    )
    .unwrap();
}

fn refusal(dir: &Path) -> String {
    common::resolve_rootfs(dir).unwrap_err().to_string()
}

const SERVICE: &str = "[[services]]\nname = \"tool\"\ncommand = [\"/usr/bin/tool\"]\n";

#[test]
fn a_signed_extension_is_taken_and_its_programs_count() {
    let dir = fixture(1);
    profile(dir.path(), r#""ext/tools-1.0.ext""#, SERVICE);
    let inputs = common::resolve_rootfs(dir.path()).unwrap();
    assert_eq!(inputs.extensions.len(), 1);
    let ext = &inputs.extensions[0];
    assert_eq!(
        (ext.manifest.name.as_str(), ext.manifest.version.as_str()),
        ("tools", "1.0")
    );
    // The service's program is in the extension only: the root build accepts it.
    build_rootfs(&inputs, &mut |_| {}).unwrap();

    // The initramfs: the main archive, then a gzip member with the image and its manifest line.
    let with = build_initramfs(&inputs, None).unwrap();
    let mut bare = inputs.clone();
    bare.extensions.clear();
    let without = build_initramfs(&bare, None).unwrap();
    assert!(with.starts_with(&without));
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(&with[without.len()..])
        .read_to_end(&mut unpacked)
        .unwrap();
    let text = String::from_utf8_lossy(&unpacked);
    let line = format!(
        "tools.sqsh tools 1.0 {} {}\n",
        ext.manifest.size, ext.manifest.digest
    );
    assert!(text.contains(&line), "{text}");
    assert!(text.contains("extensions/tools.sqsh"));

    // Without the extension the same service is refused: its program is nowhere.
    profile(dir.path(), "", SERVICE);
    let inputs = common::resolve_rootfs(dir.path()).unwrap();
    let err = build_rootfs(&inputs, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("/usr/bin/tool"), "{err}");
}

#[test]
fn bad_extensions_are_refused_naming_the_field_and_path() {
    // Signed by k2, which the profile does not trust.
    let dir = fixture(2);
    profile(dir.path(), r#""ext/tools-1.0.ext""#, "");
    let err = refusal(dir.path());
    assert!(
        err.starts_with("rootfs.extensions: ") && err.contains("tools-1.0.ext"),
        "{err}"
    );
    assert!(err.contains("is not trusted"), "{err}");

    let dir = fixture(1);
    let image = dir.path().join("ext/tools-1.0.sqsh");
    let good = fs::read(&image).unwrap();
    // Listed twice.
    profile(
        dir.path(),
        r#""ext/tools-1.0.ext", "ext/tools-1.0.ext""#,
        "",
    );
    let err = refusal(dir.path());
    assert!(err.contains("the extension name tools repeats"), "{err}");
    // The image altered, then cut short.
    profile(dir.path(), r#""ext/tools-1.0.ext""#, "");
    let mut altered = good.clone();
    altered[100] ^= 1;
    fs::write(&image, &altered).unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains("tools-1.0.sqsh") && err.contains("has digest sha256:"),
        "{err}"
    );
    fs::write(&image, &good[..good.len() - 1]).unwrap();
    let err = refusal(dir.path());
    assert!(err.contains("bytes, its manifest says"), "{err}");
    fs::write(&image, &good).unwrap();
    common::resolve_rootfs(dir.path()).unwrap();
    // The manifest altered (another version): its signature no longer verifies.
    let manifest = dir.path().join("ext/tools-1.0.ext");
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(&manifest, text.replace("version 1.0", "version 1.1")).unwrap();
    let err = refusal(dir.path());
    assert!(err.contains("does not verify"), "{err}");
    // The profile names the squashfs image itself, or a missing file.
    profile(dir.path(), r#""ext/tools-1.0.sqsh""#, "");
    let err = refusal(dir.path());
    assert!(err.contains("not an extension manifest"), "{err}");
    profile(dir.path(), r#""ext/none.ext""#, "");
    let err = refusal(dir.path());
    assert!(
        err.starts_with("rootfs.extensions: ") && err.contains("none.ext"),
        "{err}"
    );
}

#[test]
fn a_bad_request_writes_nothing() {
    let dir = fixture(1);
    let tree = dir.path().join("tree");
    let key = dir.path().join("keys/k1.key");
    let out = dir.path().join("out");
    let public = dir.path().join("keys/k1.pub");
    for (name, version, key, expected) in [
        ("Bad", "1", &key, "--name"),
        ("ok", "1/2", &key, "--version"),
        ("ok", "1", &public, "--key"),
    ] {
        let req = ExtensionRequest {
            name,
            version,
            tree: &tree,
            key,
            output: &out,
            source_date_epoch: 0,
            zstd_level: 3,
        };
        let err = make_extension(&req).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{err}");
    }
    assert!(!out.exists());
}

/// `[var] mode = "tpm2"` needs cryptsetup and tpm2-tools in the root or an extension: without
/// them the build is refused naming each missing program; with them (links to one `tpm2`, as
/// Debian installs them) it is taken.
#[test]
fn a_tpm2_var_needs_its_tools_in_the_image() {
    let dir = fixture(1);
    let var = "[var]\nmode = \"tpm2\"\n";
    profile(dir.path(), "", var);
    let inputs = common::resolve_rootfs(dir.path()).unwrap();
    let err = build_rootfs(&inputs, &mut |_| {}).unwrap_err().to_string();
    for program in std::iter::once(slate_profile::image_contract::CRYPTSETUP)
        .chain(slate_profile::image_contract::TPM2_TOOLS.iter().copied())
    {
        assert!(err.contains(program), "{program}: {err}");
    }
    let root = dir.path().join("rootfs");
    for sub in ["usr/sbin", "usr/bin"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    for program in ["usr/sbin/cryptsetup", "usr/bin/tpm2"] {
        fs::write(root.join(program), "\x7fELF").unwrap();
        fs::set_permissions(root.join(program), fs::Permissions::from_mode(0o755)).unwrap();
    }
    for tool in slate_profile::image_contract::TPM2_TOOLS {
        std::os::unix::fs::symlink("tpm2", root.join(tool.trim_start_matches('/'))).unwrap();
    }
    build_rootfs(&common::resolve_rootfs(dir.path()).unwrap(), &mut |_| {}).unwrap();
}
