//! `slate boot explain --disk D` end to end: disks installed and upgraded by the CLI (real UKIs:
//! Debian's systemd-stub with `.osrel`), explained as JSON and text, and checked against the
//! real tools on the same ESP — `bootctl list` (systemd-boot 252: menu order and the default)
//! and `grub-editenv list` (the GRUB block) — then after the loader's own next step (boot
//! attempts, GRUB's one-shot consumed). And a disk that is not slate's is refused clearly.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use slate_bootloader::{BootExplanation, EntryState};
use slate_bootloader::{Grub, LoaderKind, MemEfiVars, NextBootReason, SlotPayload, SystemdBoot};
use slate_bundle::BundleSpec;
use slate_disk::FileDisk;
use slate_installer::{write_grub_image, GrubImagePlan};
use slate_layout::{LayoutParams, MIB};

mod common;
use common::{ok, s, slate};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
const SYSTEMD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
const DISK_MIB: u64 = 128;
const PACKAGE: &str = "Debian's systemd-boot-efi; scripts/install-deps installs it";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A real UKI of `version`, assembled by slate's own builder: bootctl reads its `.osrel`, GRUB's
/// upgrade splits out `.linux`, `.initrd` and `.cmdline`.
fn uki(version: &str) -> Vec<u8> {
    let stub = fs::read(STUB).unwrap();
    slate_uki::UkiBuilder::new(&stub)
        .osrel(&format!(
            "NAME=slate\nID=slate\nPRETTY_NAME=slate {version}\nIMAGE_ID=slate\n\
             IMAGE_VERSION={version}\n"
        ))
        .cmdline("console=ttyS0")
        .linux(
            format!("pretend kernel {version}")
                .repeat(2000)
                .into_bytes(),
        )
        .initrd(
            format!("pretend initramfs {version}")
                .repeat(3000)
                .into_bytes(),
        )
        .build()
        .unwrap()
}

/// An installer bundle of `version` (unsigned: installed with `--no-verify`).
fn bundle(dir: &Path, version: &str) -> PathBuf {
    let out = dir.join(format!("bundle-{version}"));
    let uki = uki(version);
    let loader = fs::read(SYSTEMD_BOOT).unwrap();
    common::write_bundle(
        &out,
        BundleSpec {
            name: "slate",
            version,
            arch: slate_bundle::NATIVE_ARCH,
            variant: "demo",
        },
        &uki,
        &loader,
    )
}

fn blank_disk(dir: &Path) -> PathBuf {
    let disk = dir.join("disk.raw");
    fs::File::create(&disk)
        .unwrap()
        .set_len(DISK_MIB << 20)
        .unwrap();
    disk
}

fn upgrade(disk: &Path, bundle: &Path) -> String {
    ok(&[
        "installer",
        "upgrade",
        "--disk",
        s(disk),
        "--bundle",
        s(bundle),
        "--no-verify",
    ])
}

fn explain(disk: &Path) -> BootExplanation {
    let json = ok(&["boot", "explain", "--disk", s(disk), "--output", "json"]);
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn names(x: &BootExplanation) -> Vec<&str> {
    x.entries.iter().map(|e| e.name.as_str()).collect()
}

fn esp_start(disk: &Path) -> u64 {
    slate_layout::find_partition(FileDisk::open_read_only(disk).unwrap(), "EFI")
        .unwrap()
        .start
}

/// The disk's ESP shown to a tool as a mounted tree, read-only: the kernel's vfat on a
/// partitioned loop device, or — where the kernel has no vfat (containers without the module) —
/// the tree mtools (an independent FAT reader) copies out, bind-mounted onto itself because
/// bootctl wants the root of a mount. Unmounted when dropped.
struct EspMount {
    mnt: PathBuf,
    how: &'static str,
    loop_dev: Option<String>,
}

impl EspMount {
    fn new(disk: &Path, work: &Path) -> EspMount {
        let mnt = work.join("esp");
        // Fresh each time: the copy fallback leaves its files behind in the directory.
        fs::create_dir(&mnt).unwrap();
        let mut esp = EspMount {
            mnt,
            how: "",
            loop_dev: None,
        };
        let losetup = run("losetup", &["-P", "-r", "-f", "--show", s(disk)]);
        if losetup.status.success() {
            let dev = String::from_utf8_lossy(&losetup.stdout).trim().to_owned();
            let part = format!("{dev}p1");
            for _ in 0..20 {
                if Path::new(&part).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            esp.loop_dev = Some(dev);
            let out = run("mount", &["-t", "vfat", "-o", "ro", &part, s(&esp.mnt)]);
            if out.status.success() {
                esp.how = "losetup -P -r + mount -t vfat -o ro";
                return esp;
            }
            eprintln!("mount {part}: {}", text(&out));
        }
        let target = format!("{}@@{}", disk.display(), esp_start(disk));
        let out = run(
            "mcopy",
            &[
                "-s",
                "-n",
                "-i",
                &target,
                "::/EFI",
                "::/loader",
                s(&esp.mnt),
            ],
        );
        assert!(out.status.success(), "mcopy: {}", text(&out));
        let out = run("mount", &["--bind", "-o", "ro", s(&esp.mnt), s(&esp.mnt)]);
        assert!(out.status.success(), "mount --bind: {}", text(&out));
        esp.how = "mcopy -s of the ESP (no vfat in this kernel) + read-only bind mount";
        esp
    }
}

impl Drop for EspMount {
    fn drop(&mut self) {
        run("umount", &[s(&self.mnt)]);
        if let Some(dev) = &self.loop_dev {
            run("losetup", &["-d", dev]);
        }
        // Unmounted above, so this removes only the directory (and a copy's files).
        fs::remove_dir_all(&self.mnt).unwrap_or_else(|e| eprintln!("{}: {e}", self.mnt.display()));
    }
}

/// `bootctl list` of the disk's ESP without EFI variables: the entries' file names in the
/// order listed, and the one marked `(default)`.
fn bootctl_list(disk: &Path, work: &Path) -> (Vec<String>, Option<String>) {
    let esp = EspMount::new(disk, work);
    let out = Command::new("bootctl")
        .args([
            "--esp-path",
            s(&esp.mnt),
            "--no-variables",
            "--no-pager",
            "list",
        ])
        // A loop device or a copy, not a disk udev knows as an ESP.
        .env("SYSTEMD_RELAX_ESP_CHECKS", "1")
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("ESP shown by: {}\nbootctl list:\n{}", esp.how, text(&out));
    assert!(out.status.success(), "{}", text(&out));
    let (mut files, mut default) = (Vec::new(), None);
    for block in listing.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |key: &str| {
            block
                .lines()
                .find_map(|l| l.trim_start().strip_prefix(&format!("{key}: ")))
                .unwrap_or_else(|| panic!("no {key} in {block}"))
        };
        let file = field("source").rsplit('/').next().unwrap().to_owned();
        if field("title").contains("(default)") {
            assert!(default.is_none(), "two defaults: {listing}");
            default = Some(file.clone());
        }
        files.push(file);
    }
    (files, default)
}

/// slate and bootctl agree on the entries, their order and the default.
fn agrees_with_bootctl(disk: &Path, work: &Path, x: &BootExplanation) {
    if !slate_testkit::require_root()
        || !slate_testkit::require_tool("bootctl")
        || !slate_testkit::require_tool("mcopy")
    {
        return;
    }
    let (files, default) = bootctl_list(disk, work);
    assert_eq!(files, names(x), "menu order");
    assert_eq!(default, x.next_boot, "the default is the next boot");
}

#[test]
fn systemd_boot_mid_upgrade_then_after_three_failed_attempts() {
    if !slate_testkit::require_path(STUB, PACKAGE)
        || !slate_testkit::require_path(SYSTEMD_BOOT, PACKAGE)
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v1 = bundle(dir.path(), "1.0.0");
    ok(&[
        "installer",
        "install",
        "--disk",
        s(&disk),
        "--bundle",
        s(&v1),
        "--no-verify",
    ]);
    let out = upgrade(&disk, &bundle(dir.path(), "2.0.0"));
    assert!(
        out.contains("installed slate-2.0.0+3.efi (fallback slate-1.0.0+3.efi)"),
        "{out}"
    );

    let x = explain(&disk);
    assert_eq!(x.loader, LoaderKind::SystemdBoot);
    assert_eq!(names(&x), ["slate-2.0.0+3.efi", "slate-1.0.0+3.efi"]);
    assert_eq!(x.next_boot.as_deref(), Some("slate-2.0.0+3.efi"));
    assert_eq!(
        x.reason,
        NextBootReason::LoaderConfDefault {
            pattern: "slate-*".into()
        }
    );
    assert_eq!(x.renamed_to.as_deref(), Some("slate-2.0.0+2-1.efi"));
    assert_eq!(x.upgrade_tag.as_deref(), Some("slate-1.0.0+3.efi"));
    let flags: Vec<_> = x
        .entries
        .iter()
        .map(|e| (e.version.as_deref(), e.tries_left, e.next_boot, e.fallback))
        .collect();
    assert_eq!(
        flags,
        [
            (Some("2.0.0"), Some(3), true, false),
            (Some("1.0.0"), Some(3), false, true)
        ]
    );
    agrees_with_bootctl(&disk, dir.path(), &x);

    let shown = ok(&["boot", "explain", "--disk", s(&disk)]);
    eprintln!("{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "systemd-boot menu:");
    assert!(lines[1].starts_with("> slate-2.0.0+3.efi  2.0.0, indeterminate, tries 3 left"));
    assert!(lines[2].starts_with("  slate-1.0.0+3.efi  1.0.0"));
    assert!(lines[2].ends_with("fallback (META Upgrade)"), "{shown}");
    assert!(
        lines[3]
            .starts_with("next boot: slate-2.0.0+3.efi because loader.conf's `default slate-*`"),
        "{shown}"
    );

    // v2 never comes up: systemd-boot spends its three tries, and the bad entry sorts last.
    let mut loader = SystemdBoot::new(FileDisk::open(&disk).unwrap(), MemEfiVars::new());
    for _ in 0..3 {
        loader.simulate_boot_attempt().unwrap();
    }
    drop(loader);
    let x = explain(&disk);
    assert_eq!(names(&x), ["slate-1.0.0+3.efi", "slate-2.0.0+0-3.efi"]);
    assert_eq!(x.next_boot.as_deref(), Some("slate-1.0.0+3.efi"));
    assert_eq!(
        (
            x.entries[1].state,
            x.entries[1].tries_left,
            x.entries[1].tries_done
        ),
        (EntryState::Bad, Some(0), Some(3))
    );
    assert!(x.entries[0].fallback);
    agrees_with_bootctl(&disk, dir.path(), &x);
}

#[test]
fn grub_one_shot_then_saved_entry() {
    if !slate_testkit::require_path(STUB, PACKAGE) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = blank_disk(dir.path());
    let v1 = SlotPayload::from_uki(&uki("1.0.0")).unwrap();
    let plan = GrubImagePlan {
        image_id: "boot-explain".into(),
        layout: LayoutParams {
            esp_size: 40 * MIB,
            state_size: 16 * MIB,
            ..LayoutParams::default()
        },
        source_date_epoch: 0,
        grub_efi: b"MZ pretend GRUB".to_vec(),
        kernel: v1.kernel,
        initramfs: v1.initramfs,
        cmdline: v1.cmdline,
        version: "1.0.0".into(),
        menu_timeout: 1,
    };
    write_grub_image(&mut FileDisk::open(&disk).unwrap(), &plan, &mut |_| {}).unwrap();
    let x = explain(&disk);
    assert_eq!(x.loader, LoaderKind::Grub);
    assert_eq!(x.next_boot.as_deref(), Some("A"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubSavedEntry { value: "A".into() }
    );

    let out = upgrade(&disk, &bundle(dir.path(), "2.0.0"));
    assert!(out.contains("installed B (fallback A)"), "{out}");
    let x = explain(&disk);
    assert_eq!(names(&x), ["A", "B"]);
    assert_eq!(x.next_boot.as_deref(), Some("B"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubNextEntry { value: "B".into() }
    );
    let slots: Vec<_> = x
        .entries
        .iter()
        .map(|e| {
            let g = e.grub.as_ref().unwrap();
            (
                e.version.as_deref(),
                e.state,
                e.fallback,
                g.saved_entry,
                g.next_entry,
            )
        })
        .collect();
    assert_eq!(
        slots,
        [
            (Some("1.0.0"), EntryState::Good, true, true, false),
            (Some("2.0.0"), EntryState::Indeterminate, false, false, true),
        ]
    );
    // GRUB's own reader of the block sees what slate explained from.
    if slate_testkit::require_tool("grub-editenv") && slate_testkit::require_tool("mcopy") {
        let env = dir.path().join("grubenv");
        let target = format!("{}@@{}", disk.display(), esp_start(&disk));
        let out = run("mcopy", &["-n", "-i", &target, "::/grub/grubenv", s(&env)]);
        assert!(out.status.success(), "{}", text(&out));
        let out = run("grub-editenv", &[s(&env), "list"]);
        assert!(out.status.success(), "{}", text(&out));
        let listed: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(Some(&listed), x.grubenv.as_ref());
    }
    let shown = ok(&["boot", "explain", "--disk", s(&disk)]);
    eprintln!("{shown}");
    assert!(
        shown.starts_with("grub menu:\n  A  1.0.0, good, saved_entry, fallback"),
        "{shown}"
    );
    assert!(
        shown.contains("\n> B  2.0.0, indeterminate, next_entry\n"),
        "{shown}"
    );
    assert!(
        shown.contains("next boot: B because grubenv next_entry=B"),
        "{shown}"
    );

    // GRUB starts B and empties the one-shot; uncommitted, the boot after goes back to A.
    let mut loader = Grub::new(FileDisk::open(&disk).unwrap());
    assert_eq!(loader.simulate_boot().unwrap(), Some("B"));
    drop(loader);
    let x = explain(&disk);
    assert_eq!(x.next_boot.as_deref(), Some("A"));
    assert_eq!(
        x.reason,
        NextBootReason::GrubSavedEntry { value: "A".into() }
    );
}

#[test]
fn a_disk_that_is_not_slates_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign.raw");
    fs::write(&foreign, vec![0x5a; 8 << 20]).unwrap();
    for output in ["text", "json"] {
        let out = slate(&["boot", "explain", "--disk", s(&foreign), "--output", output]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted: {}", text(&out));
        assert!(out.stdout.is_empty(), "{}", text(&out));
        assert!(
            stderr.contains("reading the boot entries on")
                && stderr.contains("is it a slate disk?"),
            "{stderr}"
        );
    }
    let missing = dir.path().join("missing.raw");
    let out = slate(&["boot", "explain", "--disk", s(&missing)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("opening"),
        "{}",
        text(&out)
    );
}
