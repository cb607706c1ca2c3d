//! The initramfs `/init`: the profile's `boot.init` (slate-init, the init role alone) when it
//! names one, the slate binary otherwise; a named init that is missing stops the build before
//! anything is built.

mod common;

use std::fs;

use slate_imager::{build_initramfs, ImagerError, OutputKind};

use common::BASE_PROFILE as BASE;

fn fixture(extra_boot: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("rootfs/bin")).unwrap();
    fs::write(dir.path().join("rootfs/bin/init"), "#!/bin/sh\n").unwrap();
    fs::write(dir.path().join("slate"), "the whole slate").unwrap();
    fs::write(dir.path().join("slate-init"), "init alone").unwrap();
    fs::write(
        dir.path().join("profile.toml"),
        format!("{BASE}{extra_boot}"),
    )
    .unwrap();
    dir
}

fn init_of(archive: &[u8]) -> Vec<u8> {
    slate_cpio::parse_newc(archive)
        .unwrap()
        .into_iter()
        .find(|e| e.name_str() == Some("init"))
        .expect("an /init")
        .data
}

#[test]
fn init_is_the_profiles_init_binary_or_slate() {
    let named = fixture("init = \"slate-init\"\n");
    let inputs = common::resolve_rootfs(named.path()).unwrap();
    assert_eq!(inputs.init, Some(named.path().join("slate-init")));
    assert_eq!(
        init_of(&build_initramfs(&inputs, None).unwrap()),
        b"init alone"
    );

    let absent = fixture("");
    let inputs = common::resolve_rootfs(absent.path()).unwrap();
    assert_eq!(inputs.init, None);
    assert_eq!(
        init_of(&build_initramfs(&inputs, None).unwrap()),
        b"the whole slate"
    );
}

#[test]
fn a_missing_init_binary_is_refused_before_building() {
    let dir = fixture("init = \"no-such-init\"\n");
    let err = common::resolve(dir.path(), OutputKind::Initramfs, 1_700_000_000).unwrap_err();
    assert!(
        matches!(&err, ImagerError::MissingInput { what, .. } if *what == "the init binary"),
        "{err}"
    );
}

/// Issue 41: in the boot initramfs the root squashfs sits uncompressed in its own archive after
/// the zstd frame, so a change of the root changes the UKI only where the squashfs changed;
/// `--output initramfs` keeps it inside the one archive.
#[test]
fn the_boot_initramfs_keeps_the_root_out_of_the_zstd_stream() {
    let dir = fixture("init = \"slate-init\"\n");
    let inputs = common::resolve_rootfs(dir.path()).unwrap();
    let root = b"hsqs and the rest of a squashfs".repeat(100);
    let boot = slate_imager::build_boot_initramfs(&inputs, Some(&root)).unwrap();
    assert!(boot.starts_with(b"\x28\xb5\x2f\xfd"), "a zstd frame first");
    let at = boot
        .windows(root.len())
        .position(|w| w == root.as_slice())
        .expect("the squashfs bytes verbatim in the initrd");
    let header = boot[..at]
        .windows(6)
        .rposition(|w| w == b"070701")
        .expect("an uncompressed archive header before it");
    let archive = slate_cpio::parse_newc(&boot[header..]).unwrap();
    let names: Vec<_> = archive.iter().filter_map(|e| e.name_str()).collect();
    assert_eq!(names, ["rootfs.sqsh"]);
    assert_eq!(header % 4, 0, "the kernel finds archives at multiples of 4");

    let plain = build_initramfs(&inputs, Some(&root)).unwrap();
    let all = slate_cpio::parse_newc(&plain).unwrap();
    assert!(all.iter().any(|e| e.name_str() == Some("rootfs.sqsh")));
    assert!(all.iter().any(|e| e.name_str() == Some("init")));
}
