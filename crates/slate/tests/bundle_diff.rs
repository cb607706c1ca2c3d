//! `slate bundle diff A B` end to end: two bundles (real UKIs on Debian's systemd-stub, holding a
//! zstd initramfs laid out as the imager lays it out, with a real root squashfs) that differ by
//! exactly one added and one changed file in the root, shown as exactly that in text and JSON;
//! and bundles with a bad digest or a truncated squashfs refused with an error naming the
//! bundle and the part, exit status non-zero. `slate upgrade --check` the same way: a node (the
//! real API server over a fake backend) running bundle A's UKI, checked against bundle B.

use std::fs;
use std::io::Cursor;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use slate_bundle::{BundleSpec, Digest};
use slate_cpio::CpioWriter;
use slate_profile::image_contract::{MODULES_LOAD_PATH, ROOTFS_IMAGE_PATH};
use slate_rootfs::{build_squashfs, SquashfsOptions};

mod common;
use common::{ok, s, slate};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
const PACKAGE: &str = "Debian's systemd-boot-efi; scripts/install-deps installs it";
const RELEASE: &str = "6.1.0-test";
const OS_RELEASE_A: &[u8] = b"NAME=slate\nVERSION_ID=1\n";
const OS_RELEASE_B: &[u8] = b"NAME=slate\nVERSION_ID=1.1\n";
const NEW_TOOL: &[u8] = b"#!/bin/sh\necho new\n";

/// A root tree: A's, or B's with `/usr/bin/new-tool` added and `/etc/os-release` changed.
fn root_squashfs(dir: &Path, b: bool) -> Vec<u8> {
    let root = dir.join(if b { "root-b" } else { "root-a" });
    let file = |rel: &str, content: &[u8], mode: u32| {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    };
    file(
        "etc/os-release",
        if b { OS_RELEASE_B } else { OS_RELEASE_A },
        0o644,
    );
    file("usr/bin/tool", b"#!/bin/sh\necho tool\n", 0o755);
    // The bundle's installer blob (common::write_bundle), as the demo root carries it.
    file("usr/bin/slate", b"\x7fELF pretend slate", 0o755);
    if b {
        file("usr/bin/new-tool", NEW_TOOL, 0o755);
    }
    std::os::unix::fs::symlink("tool", root.join("usr/bin/alias")).unwrap();
    for d in ["", "etc", "usr", "usr/bin"] {
        fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    let opts = SquashfsOptions {
        compression: slate_rootfs::Compression::Zstd { level: 3 },
        ..SquashfsOptions::default()
    };
    let mut out = Cursor::new(Vec::new());
    build_squashfs(&root, &mut out, &opts).unwrap();
    out.into_inner()
}

/// The initramfs as `slate_imager::build_initramfs` lays it out and its UKI carries it
/// (docs/formats.md §6.2): compressed by the imager's own `compress_initramfs`.
fn initramfs(rootfs: &[u8]) -> Vec<u8> {
    let mut cpio = CpioWriter::new();
    for dir in ["dev", "etc", "etc/slate", "lib", "lib/modules"] {
        cpio.dir(dir, 0o755).unwrap();
    }
    // slate-init (the profile's boot.init), not the whole slate.
    cpio.file("init", 0o755, b"\x7fELF pretend slate-init".to_vec())
        .unwrap();
    for dir in ["", "/kernel", "/kernel/fs"] {
        cpio.dir(&format!("lib/modules/{RELEASE}{dir}"), 0o755)
            .unwrap();
    }
    cpio.file(
        &format!("lib/modules/{RELEASE}/kernel/fs/alpha.ko"),
        0o644,
        b"alpha module".to_vec(),
    )
    .unwrap();
    cpio.file(MODULES_LOAD_PATH, 0o644, b"kernel/fs/alpha.ko\n".to_vec())
        .unwrap();
    cpio.file(ROOTFS_IMAGE_PATH, 0o644, rootfs.to_vec())
        .unwrap();
    slate_imager::compress_initramfs(&cpio.finish()).unwrap()
}

/// A bundle at `dir/name` whose root filesystem is `rootfs`; everything else is the same in
/// every bundle of this test.
fn bundle(dir: &Path, name: &str, rootfs: &[u8]) -> PathBuf {
    let stub = fs::read(STUB).unwrap();
    let uki = slate_uki::UkiBuilder::new(&stub)
        .osrel("NAME=slate\nID=slate\nIMAGE_VERSION=1.0.0\n")
        .cmdline("console=ttyS0 panic=10")
        .uname(RELEASE)
        .initrd(initramfs(rootfs))
        .linux(b"pretend kernel".repeat(100))
        .build()
        .unwrap();
    common::write_bundle(
        &dir.join(name),
        BundleSpec {
            name: "slate",
            version: "1.0.0",
            arch: slate_bundle::NATIVE_ARCH,
            variant: "demo",
        },
        &uki,
        b"pretend systemd-boot",
    )
}

fn fixture() -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    if !slate_testkit::require_path(STUB, PACKAGE) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = bundle(dir.path(), "a", &root_squashfs(dir.path(), false));
    let b = bundle(dir.path(), "b", &root_squashfs(dir.path(), true));
    Some((dir, a, b))
}

#[test]
fn one_added_and_one_changed_file_are_all_it_shows() {
    let Some((_dir, a, b)) = fixture() else {
        return;
    };
    let text = ok(&["bundle", "diff", s(&a), s(&b)]);
    assert_eq!(
        text,
        format!(
            "root filesystem:\n\
             + /usr/bin/new-tool ({} bytes)\n\
             ~ /etc/os-release ({} -> {} bytes)\n\
             1 added, 0 removed, 1 changed\n",
            NEW_TOOL.len(),
            OS_RELEASE_A.len(),
            OS_RELEASE_B.len()
        )
    );

    let json: serde_json::Value =
        serde_json::from_str(&ok(&["bundle", "diff", s(&a), s(&b), "--output", "json"])).unwrap();
    let rootfs = &json["rootfs"];
    assert_eq!(
        rootfs["added"],
        serde_json::json!([{
            "path": "/usr/bin/new-tool",
            "kind": "file",
            "mode": "0755",
            "uid": 0,
            "gid": 0,
            "size": NEW_TOOL.len(),
            "digest": Digest::of(NEW_TOOL).to_string(),
        }])
    );
    assert_eq!(rootfs["removed"], serde_json::json!([]));
    let changed = rootfs["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0]["path"], "/etc/os-release");
    assert_eq!(changed[0]["what"], serde_json::json!(["size", "content"]));
    assert_eq!(changed[0]["old"]["size"], OS_RELEASE_A.len());
    assert_eq!(changed[0]["new"]["size"], OS_RELEASE_B.len());
    // Everything else is the same, and says what it is.
    for key in [
        "name",
        "version",
        "arch",
        "variant",
        "kernel_release",
        "kernel",
        "cmdline",
        "init",
        "slate_binary",
        "extensions",
    ] {
        assert_eq!(json[key]["changed"], false, "{key}: {}", json[key]);
    }
    assert_eq!(json["version"]["new"], "1.0.0");
    assert_eq!(json["kernel_release"]["old"], RELEASE);
    assert_eq!(json["cmdline"]["old"], "console=ttyS0 panic=10");
    assert_eq!(json["init"]["old"]["path"], "/init");
    assert_eq!(
        json["modules"],
        serde_json::json!({"added": [], "removed": [], "changed": []})
    );

    // A bundle against itself: no differences, exit 0.
    assert_eq!(
        ok(&["bundle", "diff", s(&a), s(&a)]),
        "no differences\n0 added, 0 removed, 0 changed\n"
    );
}

fn fails(args: &[&str]) -> String {
    let out = slate(args);
    assert!(!out.status.success(), "slate {args:?} succeeded");
    assert!(out.stdout.is_empty(), "printed a diff anyway");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn a_bad_bundle_is_named_with_its_bad_part() {
    let Some((dir, a, b)) = fixture() else {
        return;
    };
    // A truncated squashfs (half of what its superblock's bytes_used counts, before the
    // padding), in a bundle whose digests are all right.
    fs::remove_dir_all(dir.path().join("root-a")).unwrap();
    let whole = root_squashfs(dir.path(), false);
    let used = u64::from_le_bytes(whole[40..48].try_into().unwrap()) as usize;
    let cut = bundle(dir.path(), "cut", &whole[..used / 2]);
    let err = fails(&["bundle", "diff", s(&a), s(&cut)]);
    assert!(
        err.contains(&format!(
            "bundle B ({}): the root filesystem (rootfs.sqsh in the initramfs): not a squashfs \
             image slate can read",
            cut.display()
        )),
        "{err}"
    );

    // One byte of B's UKI changed: its digest no longer matches.
    let uki = slate_bundle::Bundle::open(&b, None)
        .unwrap()
        .blob_ref("uki")
        .unwrap()
        .digest
        .clone();
    let path = b.join("blobs/sha256").join(&uki["sha256:".len()..]);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&path, bytes).unwrap();
    let err = fails(&["bundle", "diff", s(&a), s(&b), "--output", "json"]);
    assert!(
        err.contains(&format!(
            "bundle B ({}): the uki blob does not match its digest",
            b.display()
        )),
        "{err}"
    );

    // Not a bundle at all, on side A.
    let err = fails(&["bundle", "diff", s(dir.path()), s(&a)]);
    assert!(
        err.contains(&format!("bundle A ({})", dir.path().display())),
        "{err}"
    );
}

/// What a node running `bundle`'s UKI answers to `GET /v1/image`, as machined makes it.
fn running(bundle: &Path) -> slate_bundle_diff::Summary {
    let bundle = slate_bundle::Bundle::open(bundle, None).unwrap();
    let uki = bundle.read_blob(slate_bundle::UKI_ROLE).unwrap();
    let m = bundle.manifest();
    let identity = slate_bundle_diff::Identity {
        name: m.name.clone(),
        version: m.version.clone(),
        arch: m.arch.clone(),
        variant: m.variant.clone(),
    };
    slate_bundle_diff::running_summary(uki, identity).unwrap()
}

/// A node's summary of its booted UKI is the bundle's summary: the slate binary, read from the
/// root's `/usr/bin/slate` on a node (the initramfs' `/init` is slate-init here), is the
/// bundle's `installer` blob.
#[test]
fn a_running_uki_sums_up_as_its_bundle() {
    let Some((_dir, a, _b)) = fixture() else {
        return;
    };
    let bundle = slate_bundle::Bundle::open(&a, None).unwrap();
    let inspected = slate_bundle_diff::inspect(slate_bundle_diff::Side::A, &bundle).unwrap();
    assert_eq!(running(&a), inspected);
    // And it survives its trip as JSON.
    let json = serde_json::to_vec(&inspected).unwrap();
    assert_eq!(
        serde_json::from_slice::<slate_bundle_diff::Summary>(&json).unwrap(),
        inspected
    );
}

/// A node that answers `GET /v1/image` with a fixed summary, or with an error.
struct RunningNode(Result<serde_json::Value, slate_api::BackendError>);

impl slate_api::NodeBackend for RunningNode {
    fn version(&self) -> slate_api::VersionInfo {
        panic!("--check asked for the version")
    }
    fn status(&self) -> slate_api::Status {
        panic!("--check asked for the status")
    }
    fn reboot(&self, _: slate_api::RebootMode) -> Result<(), slate_api::BackendError> {
        panic!("--check asked for a reboot")
    }
    fn reset(&self) -> Result<(), slate_api::BackendError> {
        panic!("--check asked for a reset")
    }
    fn upgrade(&self, _: slate_api::UpgradeRequest) -> Result<(), slate_api::BackendError> {
        panic!("--check asked for an upgrade")
    }
    fn receive_bundle(
        &self,
        _: &mut dyn std::io::Read,
    ) -> Result<slate_api::UploadedBundle, slate_api::BackendError> {
        panic!("--check uploaded a bundle")
    }
    fn image_summary(&self) -> Result<serde_json::Value, slate_api::BackendError> {
        self.0.clone()
    }
    fn events(&self) -> slate_api::EventStream {
        std::sync::mpsc::channel().1
    }
    fn logs(&self, _: bool) -> Result<slate_api::LineStream, slate_api::BackendError> {
        Err(slate_api::BackendError::Unsupported("no logs".into()))
    }
    fn dmesg(&self, _: bool) -> Result<slate_api::LineStream, slate_api::BackendError> {
        Err(slate_api::BackendError::Unsupported("no dmesg".into()))
    }
}

/// The node API on 127.0.0.1 over `node`, and the certificates to reach it.
fn serve(node: RunningNode) -> (tempfile::TempDir, slate_api::ServerHandle) {
    let certs = tempfile::tempdir().unwrap();
    slate_api::gen_certs(certs.path(), &["node-1.example".to_owned()]).unwrap();
    let config =
        slate_api::ServerConfig::from_dir("127.0.0.1:0".parse().unwrap(), certs.path()).unwrap();
    let server = slate_api::spawn(config, std::sync::Arc::new(node)).unwrap();
    (certs, server)
}

#[test]
fn upgrade_check_diffs_the_running_version_with_the_bundle() {
    let Some((_dir, a, b)) = fixture() else {
        return;
    };
    let summary = serde_json::to_value(running(&a)).unwrap();
    let (certs, server) = serve(RunningNode(Ok(summary)));
    let addr = server.local_addr().to_string();
    let check = |image: &Path, extra: &[&str]| {
        let mut args = vec![
            "--node",
            &addr,
            "--certs",
            s(certs.path()),
            "--role",
            "reader",
            "upgrade",
            "--check",
            "--image",
            s(image),
        ];
        args.extend_from_slice(extra);
        ok(&args)
    };
    // Exactly what `slate bundle diff A B` prints, text and JSON, and what the node would
    // download (issue 41): this bundle has no chunk index, so all of it.
    let total: u64 = slate_bundle::Bundle::open(&b, None)
        .unwrap()
        .image_blobs()
        .iter()
        .map(|(_, size)| size)
        .sum();
    let download =
        format!("download: {total} bytes, the whole bundle (it carries no chunk index)\n");
    let text = check(&b, &[]);
    assert_eq!(text, ok(&["bundle", "diff", s(&a), s(&b)]) + &download);
    assert!(text.contains("1 added, 0 removed, 1 changed\n"), "{text}");
    let mut json: serde_json::Value =
        serde_json::from_str(&check(&b, &["--output", "json"])).unwrap();
    assert_eq!(json["download"]["fetch_bytes"], total);
    assert_eq!(json["download"]["fetch_chunks"], 0);
    json.as_object_mut().unwrap().remove("download");
    let diff: serde_json::Value =
        serde_json::from_str(&ok(&["bundle", "diff", s(&a), s(&b), "--output", "json"])).unwrap();
    assert_eq!(json, diff);
    let total_a: u64 = slate_bundle::Bundle::open(&a, None)
        .unwrap()
        .image_blobs()
        .iter()
        .map(|(_, size)| size)
        .sum();
    assert_eq!(
        check(&a, &[]),
        format!(
            "no differences\n0 added, 0 removed, 0 changed\ndownload: {total_a} bytes, the \
             whole bundle (it carries no chunk index)\n"
        )
    );
    server.shutdown().unwrap();
}

#[test]
fn upgrade_check_refusals_name_the_reason() {
    let Some((_dir, a, _b)) = fixture() else {
        return;
    };
    let grub = "slot A holds no UKI: a GRUB slot is a kernel, an initramfs and a command line; \
                compare bundles offline with `slate bundle diff OLD NEW`";
    let (certs, server) = serve(RunningNode(Err(slate_api::BackendError::Unsupported(
        grub.into(),
    ))));
    let addr = server.local_addr().to_string();
    let base = [
        "--node",
        &addr,
        "--certs",
        s(certs.path()),
        "upgrade",
        "--check",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        fails(&args)
    };
    let err = run(&["--image", s(&a)]);
    assert!(err.contains("reading the running image of"), "{err}");
    assert!(err.contains(grub), "{err}");
    let err = run(&["--image", "bundle:sha256:00"]);
    assert!(err.contains("--check reads the bundle here"), "{err}");
    for other in ["--wait", "--stage", "--dry-run"] {
        let err = run(&["--image", s(&a), other]);
        assert!(err.contains("cannot be used with"), "{other}: {err}");
    }
    server.shutdown().unwrap();
}
