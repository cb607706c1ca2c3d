use super::*;
use crate::install::tests::{blank_disk, bundle, request as install_request, sized_bundle};

pub(crate) fn request(bundle: PathBuf) -> UpgradeRequest {
    UpgradeRequest {
        bundle,
        trust: Trust::NotVerified,
        running_entry: None,
        variant: None,
        allow_downgrade: false,
        tries: 3,
        dry_run: false,
        secure_boot_db: None,
        uki_handover: None,
    }
}

fn hash(path: &Path) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

/// issue 18: a GRUB disk whose grubenv is garbage is refused first, naming grubenv and the
/// damage — before the bundle is judged against a version read through it (a newer and an
/// older bundle get the same answer) — and nothing is written.
#[test]
fn a_corrupted_grubenv_is_reported_before_anything_else() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    {
        let mut file = FileDisk::open(&disk).unwrap();
        let plan = crate::GrubImagePlan {
            image_id: "grub-upgrade".into(),
            layout: slate_layout::LayoutParams {
                esp_size: 40 * slate_layout::MIB,
                state_size: 16 * slate_layout::MIB,
                ..slate_layout::LayoutParams::default()
            },
            source_date_epoch: 0,
            grub_efi: b"MZ pretend GRUB".to_vec(),
            kernel: b"kernel".repeat(100),
            initramfs: b"initramfs".repeat(100),
            cmdline: "console=ttyS0".into(),
            version: "1.0.0".into(),
            menu_timeout: 1,
        };
        crate::write_grub_image(&mut file, &plan, &mut |_| {}).unwrap();
        let esp = slate_layout::open_partition(&mut file, slate_layout::EFI_LABEL).unwrap();
        let fs = slate_esp::fat::mount(esp, 0).unwrap();
        fs.root_dir()
            .open_file(slate_esp::GRUBENV_PATH)
            .unwrap()
            .write_all(&[b'x'; 1024])
            .unwrap();
        slate_esp::fat::unmount(fs).unwrap();
    }
    let before = hash(&disk);
    for version in ["2.0.0", "0.9.0"] {
        let err = upgrade(
            &disk,
            &request(bundle(dir.path(), version, NATIVE_ARCH)),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(err, UpgradeModeError::BootEntries { .. }),
            "{version}: {err:?}"
        );
        let mut chain = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            chain.push_str(&format!(": {s}"));
            source = s.source();
        }
        assert!(
            chain.contains("grub/grubenv") && chain.contains("signature"),
            "{version}: {chain}"
        );
    }
    assert_eq!(hash(&disk), before, "something was written");
}

#[test]
fn an_installed_disk_is_upgraded_and_a_downgrade_refused() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v1 = bundle(dir.path(), "1.0.0", NATIVE_ARCH);
    crate::install(&disk, &install_request(v1), &mut |_| {}).unwrap();
    let v2 = bundle(dir.path(), "2.0.0", NATIVE_ARCH);

    let before = hash(&disk);
    let dry = UpgradeRequest {
        dry_run: true,
        ..request(v2.clone())
    };
    let mut opened = 0;
    let report = upgrade(&disk, &dry, &mut |UpgradeEvent::Opened(p)| {
        assert_eq!(p, &Provenance::NotVerified);
        opened += 1;
    })
    .unwrap();
    assert_eq!(opened, 1);
    assert_eq!(
        (
            report.running_entry.as_str(),
            report.running_version.as_str()
        ),
        ("slate-1.0.0+3.efi", "1.0.0")
    );
    assert_eq!(report.kind, UpdateKind::Upgrade);
    assert_eq!(report.keep_versions, 2, "the bundle's default");
    assert!(report.prune.is_empty(), "{:?}", report.prune);
    assert_eq!(report.outcome, None);
    assert_eq!(hash(&disk), before, "the dry run wrote");

    let report = upgrade(&disk, &request(v2), &mut |_| {}).unwrap();
    let outcome = report.outcome.unwrap();
    assert_eq!(outcome.file_name, "slate-2.0.0+3.efi");
    assert_eq!(outcome.fallback, "slate-1.0.0+3.efi");

    let older = bundle(dir.path(), "0.9.0", NATIVE_ARCH);
    let before = hash(&disk);
    let err = upgrade(&disk, &request(older), &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            UpgradeModeError::Refused { ref source, .. }
                if matches!(**source, PolicyError::Downgrade { .. })
        ),
        "{err}"
    );
    assert_eq!(hash(&disk), before, "a refusal wrote");
}

/// issue 18: tries out of range are refused before anything is read or written, whoever
/// passes them (the CLI checks too; machined runs this installer).
#[test]
fn tries_out_of_range_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v1 = bundle(dir.path(), "1.0.0", NATIVE_ARCH);
    crate::install(&disk, &install_request(v1), &mut |_| {}).unwrap();
    let v2 = bundle(dir.path(), "2.0.0", NATIVE_ARCH);
    let before = hash(&disk);
    for tries in [0, 16, 3_000_000_000, u32::MAX] {
        let err = upgrade(
            &disk,
            &UpgradeRequest {
                tries,
                ..request(v2.clone())
            },
            &mut |_| panic!("the bundle was opened with {tries} tries"),
        )
        .unwrap_err();
        assert!(
            matches!(err, UpgradeModeError::Tries(e) if e.tries == tries),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("{tries} boot-counting tries")),
            "{err}"
        );
    }
    assert_eq!(hash(&disk), before);
    let report = upgrade(
        &disk,
        &UpgradeRequest {
            tries: 15,
            ..request(v2)
        },
        &mut |_| {},
    );
    assert_eq!(
        report.unwrap().outcome.unwrap().file_name,
        "slate-2.0.0+15.efi"
    );
}

#[test]
fn a_disk_without_slate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v2 = bundle(dir.path(), "2.0.0", NATIVE_ARCH);
    let err = upgrade(&disk, &request(v2), &mut |_| {}).unwrap_err();
    assert!(
        err.to_string().starts_with("reading the boot entries on"),
        "{err}"
    );
}

/// systemd-boot's first boot attempt of the default entry, then its commit (what the node
/// does once the new version is up).
fn boot_and_commit(disk: &Path) {
    let mut boot = SystemdBoot::new(FileDisk::open(disk).unwrap(), MemEfiVars::new());
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    boot.commit(&booted).unwrap();
}

/// `EFI/Linux`, sorted.
fn listing(disk: &Path) -> Vec<String> {
    let boot = SystemdBoot::new(FileDisk::open_read_only(disk).unwrap(), MemEfiVars::new());
    let mut files: Vec<String> = boot
        .status()
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.file_name)
        .collect();
    files.sort();
    files
}

#[test]
fn keep_versions_from_the_bundle_limits_the_esp_to_three_versions() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let len = 1 << 20;
    let v1 = sized_bundle(dir.path(), "1.0.0", len, 3);
    crate::install(&disk, &install_request(v1), &mut |_| {}).unwrap();
    boot_and_commit(&disk);
    for version in ["2.0.0", "3.0.0"] {
        let report = upgrade(
            &disk,
            &request(sized_bundle(dir.path(), version, len, 3)),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(report.keep_versions, 3);
        assert!(report.prune.is_empty(), "{version}: {:?}", report.prune);
        boot_and_commit(&disk);
    }
    assert_eq!(
        listing(&disk),
        ["slate-1.0.0.efi", "slate-2.0.0.efi", "slate-3.0.0.efi"]
    );

    let v4 = sized_bundle(dir.path(), "4.0.0", len, 3);
    let before = hash(&disk);
    let dry = UpgradeRequest {
        dry_run: true,
        ..request(v4.clone())
    };
    let plan = upgrade(&disk, &dry, &mut |_| {}).unwrap();
    assert_eq!(plan.prune, ["slate-1.0.0.efi"], "the dry run's plan");
    assert_eq!(plan.outcome, None);
    assert_eq!(hash(&disk), before, "the dry run wrote");

    let report = upgrade(&disk, &request(v4), &mut |_| {}).unwrap();
    assert_eq!(report.prune, ["slate-1.0.0.efi"]);
    assert_eq!(report.outcome.unwrap().removed, ["slate-1.0.0.efi"]);
    assert_eq!(
        listing(&disk),
        ["slate-2.0.0.efi", "slate-3.0.0.efi", "slate-4.0.0+3.efi"]
    );
}

#[test]
fn a_uki_that_cannot_fit_is_refused_with_the_numbers_before_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let big = 12 << 20;
    let v1 = sized_bundle(dir.path(), "1.0.0", big, 2);
    crate::install(&disk, &install_request(v1), &mut |_| {}).unwrap();
    upgrade(
        &disk,
        &request(sized_bundle(dir.path(), "2.0.0", big, 2)),
        &mut |_| {},
    )
    .unwrap();
    boot_and_commit(&disk);
    // v1 (installed, never booted) may go (keep_versions 2), but its 12 MiB do not make
    // room for 30 on the 40 MiB ESP.
    let v3 = sized_bundle(dir.path(), "3.0.0", 30 << 20, 2);
    let free = SystemdBoot::new(FileDisk::open_read_only(&disk).unwrap(), MemEfiVars::new())
        .status()
        .unwrap()
        .free_bytes;
    let free = format!("{:.1} MiB", free as f64 / f64::from(1 << 20));
    let before = hash(&disk);
    let dry = UpgradeRequest {
        dry_run: true,
        ..request(v3.clone())
    };
    let dry_err = upgrade(&disk, &dry, &mut |_| {}).unwrap_err();
    let err = upgrade(&disk, &request(v3), &mut |_| {}).unwrap_err();
    assert_eq!(hash(&disk), before, "a refusal wrote");
    let chain = |e: &UpgradeModeError| {
        let source = std::error::Error::source(e).map(ToString::to_string);
        format!("{e}: {}", source.unwrap_or_default())
    };
    assert_eq!(chain(&dry_err), chain(&err), "the dry run refuses alike");
    let message = chain(&err);
    assert!(message.starts_with("upgrading "), "{message}");
    for part in [
        "the new UKI slate-3.0.0+3.efi (30.0 MiB) does not fit the EFI partition (40.0 MiB)",
        &format!("{free} free, 12.0 MiB reclaimable by pruning slate-1.0.0+3.efi;"),
        "the running entry slate-2.0.0.efi is kept",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert_eq!(
        listing(&disk),
        ["slate-1.0.0+3.efi", "slate-2.0.0.efi"],
        "nothing pruned"
    );
}

/// Issue 44: a GRUB disk that boots nothing is told so in the words of either loader, not
/// "systemd-boot would boot nothing".
#[test]
fn a_grub_disk_that_boots_nothing_is_not_told_about_systemd_boot() {
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    {
        let mut file = FileDisk::open(&disk).unwrap();
        let plan = crate::GrubImagePlan {
            image_id: "grub-nothing".into(),
            layout: slate_layout::LayoutParams {
                esp_size: 40 * slate_layout::MIB,
                state_size: 16 * slate_layout::MIB,
                ..slate_layout::LayoutParams::default()
            },
            source_date_epoch: 0,
            grub_efi: b"MZ pretend GRUB".to_vec(),
            kernel: b"kernel".repeat(100),
            initramfs: b"initramfs".repeat(100),
            cmdline: "console=ttyS0".into(),
            version: "1.0.0".into(),
            menu_timeout: 1,
        };
        crate::write_grub_image(&mut file, &plan, &mut |_| {}).unwrap();
        // Every kernel and initramfs gone, the loader, its menu and environment kept: nothing
        // left to select.
        let esp = slate_layout::open_partition(&mut file, slate_layout::EFI_LABEL).unwrap();
        let fs = slate_esp::fat::mount(esp, 0).unwrap();
        let root = fs.root_dir();
        let (mut dirs, mut files) = (vec![String::new()], Vec::new());
        while let Some(path) = dirs.pop() {
            let here = if path.is_empty() {
                fs.root_dir()
            } else {
                root.open_dir(&path).unwrap()
            };
            for entry in here.iter().map(Result::unwrap) {
                let name = entry.file_name();
                if name == "." || name == ".." {
                    continue;
                }
                let full = format!("{path}{name}");
                if entry.is_dir() {
                    dirs.push(format!("{full}/"));
                } else if !full.starts_with("grub/") && !full.starts_with("EFI/") {
                    files.push(full);
                }
            }
        }
        assert!(!files.is_empty());
        for file in files {
            root.remove(&file).unwrap();
        }
        drop(root);
        slate_esp::fat::unmount(fs).unwrap();
    }
    let before = hash(&disk);
    let err = upgrade(
        &disk,
        &request(bundle(dir.path(), "2.0.0", NATIVE_ARCH)),
        &mut |_| {},
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, UpgradeModeError::NothingBoots { .. }),
        "{err:?}"
    );
    assert!(text.contains("would boot nothing"), "{text}");
    assert!(!text.contains("systemd-boot"), "{text}");
    assert_eq!(hash(&disk), before, "something was written");
}
