use super::*;
use slate_bundle::{BlobInput, BundleSpec, InstallDefaults, DEFAULT_KEEP_VERSIONS};

pub(crate) const DISK_LEN: u64 = 128 << 20;

/// A bundle of `version` for `arch` in `dir` (stand-in UKI and systemd-boot bytes: nothing
/// here executes them).
pub(crate) fn bundle(dir: &Path, version: &str, arch: &str) -> PathBuf {
    let uki = format!("MZ pretend UKI of {version}").repeat(1000);
    let out = dir.join(format!("bundle-{version}-{arch}"));
    write_bundle(&out, version, arch, uki.as_bytes(), DEFAULT_KEEP_VERSIONS)
}

/// A native bundle of `version` with a stand-in UKI of `uki_len` bytes whose install
/// settings keep `keep_versions` versions.
pub(crate) fn sized_bundle(
    dir: &Path,
    version: &str,
    uki_len: usize,
    keep_versions: u32,
) -> PathBuf {
    let uki: Vec<u8> = format!("MZ pretend UKI of {version} ")
        .bytes()
        .cycle()
        .take(uki_len)
        .collect();
    let out = dir.join(format!("bundle-{version}-{uki_len}-keep{keep_versions}"));
    write_bundle(&out, version, NATIVE_ARCH, &uki, keep_versions)
}

pub(crate) fn write_bundle(
    out: &Path,
    version: &str,
    arch: &str,
    uki: &[u8],
    keep_versions: u32,
) -> PathBuf {
    let defaults = InstallDefaults {
        esp_mib: 40,
        state_mib: 16,
        tries: 3,
        menu_timeout: 1,
        keep_versions,
    };
    write_bundle_with(out, version, arch, uki, defaults)
}

fn write_bundle_with(
    out: &Path,
    version: &str,
    arch: &str,
    uki: &[u8],
    defaults: InstallDefaults,
) -> PathBuf {
    let blob = |role, file_name, media_type, bytes| BlobInput {
        role,
        file_name,
        media_type,
        bytes,
    };
    slate_bundle::write_installable_bundle(
        out,
        BundleSpec {
            name: "slate",
            version,
            arch,
            variant: "demo",
        },
        defaults,
        &[
            blob(
                slate_bundle::UKI_ROLE,
                "slate.efi",
                slate_bundle::UKI_MEDIA_TYPE,
                uki,
            ),
            blob(
                slate_bundle::SYSTEMD_BOOT_ROLE,
                "systemd-bootx64.efi",
                slate_bundle::EFI_MEDIA_TYPE,
                b"MZ pretend systemd-boot",
            ),
        ],
    )
    .unwrap();
    out.to_owned()
}

pub(crate) fn blank_disk(dir: &Path) -> PathBuf {
    let disk = dir.join("disk.raw");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(DISK_LEN)
        .unwrap();
    disk
}

pub(crate) fn request(bundle: PathBuf) -> InstallRequest {
    InstallRequest {
        bundle,
        trust: Trust::NotVerified,
        force: false,
        dry_run: false,
        config: None,
        secure_boot_db: None,
    }
}

/// Event names in order, image steps left out.
fn run(disk: &Path, request: &InstallRequest) -> (Vec<String>, InstallReport) {
    let mut seen = Vec::new();
    let report = install(disk, request, &mut |event| match event {
        InstallEvent::Opened(p) => seen.push(format!("opened {p:?}")),
        InstallEvent::Wiping { offset } => seen.push(format!("wiping {offset}")),
        InstallEvent::Planned(plan) => seen.push(format!("planned {}", plan.uki_name)),
        InstallEvent::Image(_) => {}
    })
    .unwrap();
    (seen, report)
}

#[test]
fn a_dry_run_plans_and_writes_nothing_then_the_install_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, v1) = (
        blank_disk(dir.path()),
        bundle(dir.path(), "1.0.0", NATIVE_ARCH),
    );
    let dry = InstallRequest {
        dry_run: true,
        ..request(v1.clone())
    };
    let (seen, report) = run(&disk, &dry);
    assert_eq!(
        seen,
        ["opened NotVerified", "planned slate-1.0.0+3.efi"],
        "{seen:?}"
    );
    assert!(!report.written);
    assert_eq!(report.plan.disk_len, DISK_LEN);
    let labels: Vec<_> = report
        .plan
        .layout
        .partitions
        .iter()
        .map(|p| &p.label)
        .collect();
    assert_eq!(labels, ["EFI", "META", "STATE", "EPHEMERAL"]);
    let file = FileDisk::open_read_only(&disk).unwrap();
    assert_eq!(first_data(&file).unwrap(), None, "the dry run wrote");

    let (_, report) = run(&disk, &request(v1.clone()));
    assert!(report.written);
    assert!(first_data(&FileDisk::open_read_only(&disk).unwrap())
        .unwrap()
        .is_some());

    let err = install(&disk, &request(v1.clone()), &mut |_| {}).unwrap_err();
    assert!(matches!(err, InstallModeError::NotBlank { .. }), "{err}");
    assert!(err.to_string().contains("is not blank"), "{err}");
    let forced = InstallRequest {
        force: true,
        ..request(v1)
    };
    let (seen, _) = run(&disk, &forced);
    assert!(seen.iter().any(|e| e.starts_with("wiping ")), "{seen:?}");
}

/// issue 18: numbers a bundle carries are bounded like the profile's, and refused before
/// the disk is opened (a missing disk shows it never was).
#[test]
fn out_of_range_install_settings_are_refused_before_the_disk_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-disk");
    let good = InstallDefaults {
        esp_mib: 40,
        state_mib: 16,
        tries: 3,
        menu_timeout: 1,
        keep_versions: DEFAULT_KEEP_VERSIONS,
    };
    /// One setting changed to a value out of range.
    type Change = fn(&mut InstallDefaults);
    let cases: [(Change, &str); 5] = [
        (|d| d.tries = 3_000_000_000, "tries = 3000000000"),
        (|d| d.tries = 0, "tries = 0"),
        (|d| d.menu_timeout = u32::MAX, "menu_timeout = 4294967295"),
        // 2^44 + 256 MiB: shifted into bytes it wrapped around to 256 MiB.
        (|d| d.esp_mib = (1 << 44) + 256, "esp_mib = 17592186044672"),
        (
            |d| d.state_mib = u64::MAX,
            "state_mib = 18446744073709551615",
        ),
    ];
    for (i, (change, expected)) in cases.into_iter().enumerate() {
        let mut defaults = good;
        change(&mut defaults);
        let out = dir.path().join(format!("bundle-{i}"));
        let bundle = write_bundle_with(&out, "1.0.0", NATIVE_ARCH, b"MZ pretend UKI", defaults);
        let err = install(&missing, &request(bundle), &mut |_| {}).unwrap_err();
        assert!(matches!(err, InstallModeError::BadSetting { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("the bundle's install settings: {expected}:")),
            "{text}"
        );
    }
    assert_eq!(checked_settings(&good).unwrap(), (40 * MIB, 16 * MIB));
}

/// issue 18: a bundle of a GRUB profile (it carries `grub` where others carry systemd-boot)
/// installs the GRUB layout onto a blank disk — GRUB, grub.cfg, grubenv and the second
/// record naming slot A, the UKI's kernel, initramfs and command line in slot A, slot B
/// empty — as the image mode does; never systemd-boot.
#[test]
fn a_grub_bundle_installs_the_grub_layout() {
    const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
    if !slate_testkit::require_path(STUB, "apt-get install systemd-boot-efi") {
        return;
    }
    use slate_bootloader::grub::config as grub_config;
    let dir = tempfile::tempdir().unwrap();
    let stub = std::fs::read(STUB).unwrap();
    let (kernel, initramfs) = (b"kernel ".repeat(3000), b"initramfs ".repeat(2000));
    let uki = slate_uki::UkiBuilder::new(&stub)
        .osrel("ID=slate\nVERSION_ID=1.0.0\n")
        .cmdline("console=ttyS0 slate.init=/usr/bin/machined")
        .linux(kernel.clone())
        .initrd(initramfs.clone())
        .build()
        .unwrap();
    let grub_efi = b"MZ pretend GRUB".repeat(100);
    let blob = |role, file_name, media_type, bytes| BlobInput {
        role,
        file_name,
        media_type,
        bytes,
    };
    let bundle = dir.path().join("grub-bundle");
    slate_bundle::write_installable_bundle(
        &bundle,
        BundleSpec {
            name: "slate",
            version: "1.0.0",
            arch: NATIVE_ARCH,
            variant: "demo",
        },
        InstallDefaults {
            esp_mib: 40,
            state_mib: 16,
            tries: 3,
            menu_timeout: 2,
            keep_versions: DEFAULT_KEEP_VERSIONS,
        },
        &[
            blob(
                slate_bundle::UKI_ROLE,
                "slate.efi",
                slate_bundle::UKI_MEDIA_TYPE,
                &uki,
            ),
            blob(
                slate_bundle::GRUB_ROLE,
                "grubx64.efi",
                slate_bundle::EFI_MEDIA_TYPE,
                &grub_efi,
            ),
        ],
    )
    .unwrap();
    let disk = blank_disk(dir.path());
    let (seen, report) = run(&disk, &request(bundle));
    assert_eq!(seen, ["opened NotVerified", "planned A"], "{seen:?}");
    assert_eq!(report.plan.loader, LoaderKind::Grub);
    assert_eq!(report.plan.uki_len, (kernel.len() + initramfs.len()) as u64);

    let file = FileDisk::open_read_only(&disk).unwrap();
    assert_eq!(slate_bootloader::detect(&file).unwrap(), LoaderKind::Grub);
    let grub = slate_bootloader::Grub::new(file);
    let status = grub.grub_status().unwrap();
    assert!(status.slots[0].complete() && !status.slots[1].complete());
    assert_eq!(status.slots[0].version(), Some("1.0.0"));
    assert_eq!(status.env.get("saved_entry"), Some("A"));
    assert_eq!(status.record_entry(), Some("A"));
    assert_eq!(status.booted_slot(), Some("A"));
    assert!(status.warnings.is_empty(), "{:?}", status.warnings);
    let (slot, version) = grub.read_slot("A").unwrap();
    assert_eq!(
        (
            slot.kernel,
            slot.initramfs,
            slot.cmdline.as_str(),
            version.as_str()
        ),
        (
            kernel,
            initramfs,
            "console=ttyS0 slate.init=/usr/bin/machined",
            "1.0.0"
        )
    );
    assert_eq!(
        grub.read_file(slate_esp::GRUB_CFG_PATH).unwrap(),
        grub_config::grub_cfg(2).into_bytes()
    );
    assert_eq!(
        grub.read_file(slate_esp::FALLBACK_LOADER_PATH).unwrap(),
        grub_efi
    );
    assert!(grub.read_file(slate_esp::LOADER_CONF_PATH).is_err());
}

#[test]
fn a_foreign_bundle_is_refused_before_the_disk_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = if NATIVE_ARCH == "arm64" {
        "amd64"
    } else {
        "arm64"
    };
    let bundle = bundle(dir.path(), "1.0.0", foreign);
    let missing = dir.path().join("no-such-disk");
    let err = install(&missing, &request(bundle), &mut |_| {}).unwrap_err();
    assert!(matches!(err, InstallModeError::WrongArch { .. }), "{err}");
    assert!(err.to_string().contains(foreign), "{err}");
}

#[test]
fn a_signed_bundle_is_reported_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, v1) = (
        blank_disk(dir.path()),
        bundle(dir.path(), "1.0.0", NATIVE_ARCH),
    );
    let pair = slate_trust::generate_keypair();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("slate.pub"), &pair.public_pem).unwrap();
    let key = slate_trust::PrivateKey::from_pem(&pair.private_pem).unwrap();
    let request = InstallRequest {
        trust: Trust::KeysIn(keys),
        dry_run: true,
        ..request(v1.clone())
    };
    let err = install(&disk, &request, &mut |_| {}).unwrap_err();
    assert!(err.to_string().starts_with("verifying the bundle"), "{err}");

    slate_trust::sign(&slate_bundle::Bundle::open(&v1, None).unwrap(), &key).unwrap();
    let mut provenance = None;
    install(&disk, &request, &mut |event| {
        if let InstallEvent::Opened(p) = event {
            provenance = Some(p.clone());
        }
    })
    .unwrap();
    match provenance {
        Some(Provenance::Signed {
            key_id, version, ..
        }) => {
            assert_eq!(key_id, pair.id);
            assert_eq!(version, "1.0.0");
        }
        other => panic!("{other:?}"),
    }
}
