//! `--output btrfs-image` on a real Btrfs (mkfs.btrfs, loop devices; root): the disk's GPT,
//! the pool's subvolumes and first snapshot, its fstab, /boot and manifest, the initramfs
//! without a root image, the ESP's blessed entry and kernel copies, `installer configure`
//! writing `@state/config/machine.toml`, and the profiles refused before anything is built.
//! Under CI=true a missing root or tool fails the test (slate_testkit).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_bootloader::sdboot::snapshots as sdboot;
use slate_disk::FileDisk;
use slate_imager::{Inputs, OutputKind};
use slate_layout::{ESP_TYPE, LINUX_ROOT_X86_64_TYPE, POOL_LABEL};
use slate_profile::image_contract;
use slate_snapshot::manifest::Manifest;
use slate_snapshot::{entry, fstab, validate, SnapshotName};

/// 2026-06-28 09:30:00 UTC.
const EPOCH: u64 = 1_782_639_000;
const SNAP: &str = "root-20260628-093000";
const RELEASE: &str = "6.1.0-test";
const CONFIG: &str = include_str!("../../machine-config/tests/fixtures/node-v1-own-ca.toml");

fn available() -> bool {
    slate_testkit::require_root()
        && slate_testkit::require_tool("mkfs.btrfs")
        && slate_testkit::require_tool("losetup")
        && slate_testkit::require_tool("mount")
}

use slate_testkit::sh;

/// The pool partition of `image` mounted read-only (top level) with losetup + mount, so the
/// check does not go through the code under test; unmounted and detached on drop.
struct Mounted {
    dir: tempfile::TempDir,
    loopdev: String,
}

impl Mounted {
    fn pool(image: &Path) -> Mounted {
        let disk = FileDisk::open_read_only(image).unwrap();
        let parts = slate_layout::partitions(disk).unwrap();
        let pool = parts.iter().find(|p| p.label == POOL_LABEL).unwrap();
        let loopdev = sh(
            "losetup",
            &[
                "-f",
                "--show",
                "-r",
                "-o",
                &pool.start.to_string(),
                "--sizelimit",
                &pool.len.to_string(),
                image.to_str().unwrap(),
            ],
        );
        let dir = tempfile::tempdir().unwrap();
        sh(
            "mount",
            &[
                "-o",
                "ro,subvolid=5",
                &loopdev,
                dir.path().to_str().unwrap(),
            ],
        );
        Mounted { dir, loopdev }
    }

    fn top(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).output();
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).output();
    }
}

/// A profile directory: a base root with /sbin/init, a stand-in kernel, a modules tree whose
/// modules.dep gives btrfs a dependency, stand-ins for systemd-boot and slate.
fn inputs_dir(extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in [
        "rootfs/sbin",
        "rootfs/etc",
        "rootfs/usr/bin",
        "rootfs/usr/lib/slate",
    ] {
        fs::create_dir_all(d.join(sub)).unwrap();
    }
    fs::write(d.join("rootfs/sbin/init"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(
        d.join("rootfs/sbin/init"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::write(d.join("rootfs/usr/bin/hello"), "hello\n").unwrap();
    fs::write(d.join("rootfs/usr/lib/slate/healthy"), "").unwrap();
    fs::write(d.join("rootfs/etc/fstab"), "# the base's, replaced\n").unwrap();
    fs::write(d.join("vmlinuz"), vec![0x4d; 300_000]).unwrap();
    let mods = d.join("mods").join(RELEASE);
    for (path, bytes) in [
        ("kernel/fs/btrfs/btrfs.ko", 4000),
        ("kernel/lib/libcrc32c.ko", 1000),
    ] {
        fs::create_dir_all(mods.join(path).parent().unwrap()).unwrap();
        fs::write(mods.join(path), vec![0x7f; bytes]).unwrap();
    }
    fs::write(
        mods.join("modules.dep"),
        "kernel/fs/btrfs/btrfs.ko: kernel/lib/libcrc32c.ko\nkernel/lib/libcrc32c.ko:\n",
    )
    .unwrap();
    fs::write(d.join("sd.efi"), vec![0x5a; 50_000]).unwrap();
    fs::write(d.join("slate"), vec![0xe1; 200_000]).unwrap();
    let profile = format!(
        r#"name = "slate"
version = "1.0.0"
arch = "amd64"
platform = "qemu"
variant = "btrfs"
{extra}
[kernel]
image = "vmlinuz"
modules_dir = "mods/{RELEASE}"
modules = ["btrfs"]
args = ["console=ttyS0", "panic=10", "slate.init=/usr/bin/machined"]
[rootfs]
base = "rootfs"
zstd_level = 3
[boot]
stub = "stub.efi"
systemd_boot = "sd.efi"
slate = "slate"
[image]
size_mib = 200
esp_mib = 40
menu_timeout = 0
[health]
timeout_secs = 20
[[health.checks]]
file = "/usr/lib/slate/healthy"
"#
    );
    fs::write(d.join("profile.toml"), profile).unwrap();
    dir
}

fn resolve(dir: &Path) -> Result<Inputs, slate_imager::ImagerError> {
    common::resolve(dir, OutputKind::BtrfsImage, EPOCH)
}

fn build(dir: &Path) -> PathBuf {
    let inputs = resolve(dir).unwrap();
    let steps = slate_imager::plan(&inputs);
    assert!(
        steps
            .iter()
            .any(|s| s.contains(SNAP) && s.contains("@state")),
        "{steps:?}"
    );
    let out = dir.join("disk.raw");
    slate_imager::build(&inputs, &out, &mut |_| {}).unwrap();
    out
}

#[test]
fn btrfs_image_holds_a_bootable_first_snapshot() {
    if !available() {
        return;
    }
    let dir = inputs_dir("");
    let image = build(dir.path());
    let snap = SnapshotName::parse(SNAP).unwrap();
    let uuid = slate_imager::pool_uuid("slate-1.0.0");
    assert_eq!(uuid, slate_imager::pool_uuid("slate-1.0.0"));
    assert_eq!(&uuid[14..15], "4", "a version-4-shaped UUID: {uuid}");
    assert_eq!(fs::metadata(&image).unwrap().len(), 200 << 20);

    // The GPT: the ESP, then the pool as "Linux root (x86-64)".
    let disk = FileDisk::open_read_only(&image).unwrap();
    let parts = slate_layout::partitions(slate_esp::ReadOnly(&disk)).unwrap();
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert_eq!((parts[0].type_guid, parts[0].len), (ESP_TYPE, 40 << 20));
    assert_eq!(parts[1].label, POOL_LABEL);
    assert_eq!(parts[1].type_guid, LINUX_ROOT_X86_64_TYPE);
    assert!(parts[1].len >= slate_imager::POOL_MIN_MIB << 20);

    // The pool: its UUID, the three subvolumes, the engine's directory.
    let pool = Mounted::pool(&image);
    let top = pool.top();
    assert_eq!(slate_host::pool_uuid(top).unwrap(), uuid);
    for sub in [SNAP, "@home", "@state"] {
        assert!(slate_host::is_subvolume(&top.join(sub)).unwrap(), "{sub}");
    }
    assert_eq!(
        slate_host::child_subvolumes(top).unwrap(),
        ["@home", "@state", SNAP]
    );
    assert_eq!(fs::read_dir(top.join("@state")).unwrap().count(), 0);
    let root = top.join(SNAP);

    // The root: the base, the generated files, fstab, /boot.
    assert_eq!(fs::read(root.join("usr/bin/hello")).unwrap(), b"hello\n");
    assert!(root.join("usr/lib/slate/healthy").is_file());
    assert!(root.join("home").is_dir());
    let os_release = fs::read_to_string(root.join("etc/os-release")).unwrap();
    assert!(
        os_release.contains("PRETTY_NAME=\"slate 1.0.0\""),
        "{os_release}"
    );
    let node = fs::read_to_string(root.join(image_contract::NODE_CONFIG_PATH)).unwrap();
    assert!(node.contains("/usr/lib/slate/healthy"), "{node}");
    let fstab_text = fs::read_to_string(root.join("etc/fstab")).unwrap();
    assert_eq!(
        fstab_text,
        format!(
            "UUID={uuid}\t/\tbtrfs\tsubvol={SNAP}\t0\t0\nUUID={uuid}\t/home\tbtrfs\tsubvol=@home\t0\t0\n"
        )
    );
    fstab::check_root(&fstab_text, &snap).unwrap();
    let kernel = fs::read(root.join(format!("boot/vmlinuz-{RELEASE}"))).unwrap();
    let initrd = fs::read(root.join(format!("boot/initrd.img-{RELEASE}"))).unwrap();
    assert_eq!(kernel, fs::read(dir.path().join("vmlinuz")).unwrap());
    let boot = validate::validate(&slate_snapshot_engine::tree::facts(&root), &snap).unwrap();
    assert_eq!(
        (boot.kernel.as_str(), boot.initrd.as_str()),
        (
            format!("vmlinuz-{RELEASE}").as_str(),
            format!("initrd.img-{RELEASE}").as_str()
        )
    );

    // The initramfs: slate as /init, the module closure, no root image.
    let archive = zstd::decode_all(&initrd[..]).unwrap();
    let entries = slate_cpio::parse_newc(&archive).unwrap();
    let names: Vec<&str> = entries.iter().filter_map(|e| e.name_str()).collect();
    assert!(names.contains(&"init"), "{names:?}");
    assert!(
        !names.contains(&image_contract::ROOTFS_IMAGE_PATH),
        "{names:?}"
    );
    let load = entries
        .iter()
        .find(|e| e.name_str() == Some(image_contract::MODULES_LOAD_PATH))
        .unwrap();
    assert_eq!(
        load.data,
        b"kernel/lib/libcrc32c.ko:\nkernel/fs/btrfs/btrfs.ko: kernel/lib/libcrc32c.ko\n"
    );

    // The manifest: key and first snapshot's manifest, verifying against the tree as it is.
    let key: [u8; 32] = fs::read(top.join(".slate/manifest.key"))
        .unwrap()
        .try_into()
        .unwrap();
    let mode = fs::metadata(top.join(".slate/manifest.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let recorded = Manifest::verify(
        &fs::read(top.join(format!(".slate/manifests/{SNAP}.manifest"))).unwrap(),
        &key,
    )
    .unwrap();
    let mut actual = Manifest::new(snap.clone());
    slate_snapshot_engine::tree::walk_into(&root, &mut actual).unwrap();
    for (path, bytes) in [
        (entry::kernel_path(&snap), &kernel),
        (entry::initrd_path(&snap), &initrd),
    ] {
        actual
            .insert(
                path.as_bytes(),
                slate_snapshot::manifest::Record::Esp {
                    size: bytes.len() as u64,
                    sha256: slate_snapshot::manifest::sha256(bytes),
                },
            )
            .unwrap();
    }
    assert_eq!(recorded.compare(&actual), vec![]);
    drop(pool);

    // The ESP: systemd-boot, loader.conf, the blessed entry booting the snapshot, copies
    // identical to /boot's.
    let sd = fs::read(dir.path().join("sd.efi")).unwrap();
    for path in [
        slate_esp::FALLBACK_LOADER_PATH,
        slate_esp::SYSTEMD_BOOT_PATH,
    ] {
        assert_eq!(
            slate_esp::session::read_file(&disk, path).unwrap().unwrap(),
            sd,
            "{path}"
        );
    }
    let conf = String::from_utf8(
        slate_esp::session::read_file(&disk, slate_esp::LOADER_CONF_PATH)
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert!(
        conf.contains("default root-*") && conf.contains("timeout 0"),
        "{conf}"
    );
    let scan = sdboot::scan(&disk).unwrap();
    assert_eq!(scan.entries.len(), 1, "{:?}", scan.entries);
    let found = scan.selected().unwrap();
    assert_eq!(found.name.file_name(), format!("{SNAP}.conf"));
    let options = found.conf.as_ref().unwrap().options.join(" ");
    assert_eq!(
        options,
        format!(
            "{} console=ttyS0 panic=10 slate.init=/usr/bin/machined",
            entry::root_options(&uuid, &snap)
        )
    );
    assert_eq!(
        found.conf.as_ref().unwrap().title.as_deref(),
        Some(format!("slate 1.0.0 2026-06-28 09:30:00 ({SNAP})").as_str())
    );
    assert_eq!(
        slate_esp::session::read_file(&disk, &entry::kernel_path(&snap))
            .unwrap()
            .unwrap(),
        kernel
    );
    assert_eq!(
        slate_esp::session::read_file(&disk, &entry::initrd_path(&snap))
            .unwrap()
            .unwrap(),
        initrd
    );
    // mtools reads the same FAT, if it is installed.
    if slate_testkit::find_tool("mtype").is_some() {
        let at = format!("{}@@{}", image.display(), parts[0].start);
        let text = sh(
            "mtype",
            &["-i", &at, &format!("::/loader/entries/{SNAP}.conf")],
        );
        assert!(text.contains(&format!("version {SNAP}")), "{text}");
    }
    drop(disk);

    // installer configure: @state/config/machine.toml, 0600 in 0700 directories; refused
    // again without --force; a dry run writes nothing.
    let dry = slate_installer::seed_config(&image, CONFIG, false, true).unwrap();
    assert!(!dry.written && dry.place.contains("@state/config/machine.toml"));
    let report = slate_installer::seed_config(&image, CONFIG, false, false).unwrap();
    assert_eq!(report.node_name, "node1");
    assert_eq!(
        report.place,
        format!("{POOL_LABEL}:@state/config/machine.toml")
    );
    {
        let pool = Mounted::pool(&image);
        let file = pool.top().join("@state/config/machine.toml");
        assert_eq!(fs::read_to_string(&file).unwrap(), CONFIG);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
    }
    let err = slate_installer::seed_config(&image, CONFIG, false, false).unwrap_err();
    assert!(chain(&err).contains("--force"), "{}", chain(&err));
    let renamed = CONFIG.replace(
        "name = \"node1\"",
        "name = \"node1\"\nhostname = \"node1-b\"",
    );
    slate_installer::seed_config(&image, &renamed, true, false).unwrap();
    let pool = Mounted::pool(&image);
    let text = fs::read_to_string(pool.top().join("@state/config/machine.toml")).unwrap();
    assert!(text.contains("hostname = \"node1-b\""));
}

fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// `bootloader = "grub"` (docs/formats.md §12.9): GRUB at the removable path, the constant
/// grub.cfg, the generated menu booting the first snapshot's own /boot, grubenv and the second
/// record `saved_entry=<first snapshot>` (read back by the real grub-editenv); no kernel copies
/// and no systemd-boot files; the manifest without ESP records.
#[test]
fn a_grub_btrfs_image_boots_the_first_snapshot_from_the_pool() {
    if !available() || !slate_testkit::require_tool("grub-editenv") {
        return;
    }
    let dir = inputs_dir("bootloader = \"grub\"\n");
    let profile = dir.path().join("profile.toml");
    let text = fs::read_to_string(&profile).unwrap().replace(
        "slate = \"slate\"",
        "slate = \"slate\"\ngrub_efi = \"grub.efi\"",
    );
    fs::write(&profile, text).unwrap();
    fs::write(dir.path().join("grub.efi"), vec![0x6b; 70_000]).unwrap();
    let inputs = resolve(dir.path()).unwrap();
    let plan = slate_imager::plan(&inputs).join("\n");
    assert!(
        plan.contains("GRUB") && plan.contains("grub/snapshots.cfg"),
        "{plan}"
    );
    let image = build(dir.path());
    let uuid = slate_imager::pool_uuid("slate-1.0.0");
    let disk = FileDisk::open_read_only(&image).unwrap();
    let read = |path: &str| slate_esp::session::read_file(&disk, path).unwrap();
    assert_eq!(read("EFI/BOOT/BOOTX64.EFI"), Some(vec![0x6b; 70_000]));
    assert_eq!(
        read("grub/grub.cfg"),
        Some(slate_bootloader::grub::snapshots::menu::grub_cfg(0).into_bytes())
    );
    for path in ["loader/loader.conf", "EFI/systemd/systemd-bootx64.efi"] {
        assert_eq!(read(path), None, "{path}");
    }
    let snap = SnapshotName::parse(SNAP).unwrap();
    assert!(
        sdboot::snapshot_files(&disk, &snap).unwrap().is_empty(),
        "no copies"
    );
    for path in ["grub/grubenv", "grub/slate-default.env"] {
        let copy = dir.path().join("env.copy");
        fs::write(&copy, read(path).unwrap()).unwrap();
        assert_eq!(
            sh("grub-editenv", &[copy.to_str().unwrap(), "list"]),
            format!("saved_entry={SNAP}"),
            "{path}"
        );
    }
    // The engine's view: GRUB's layout, one entry, the saved default and what boots.
    assert!(slate_bootloader::grub::snapshots::is_grub_layout(&disk).unwrap());
    let scan = slate_bootloader::grub::snapshots::scan(&disk).unwrap();
    assert_eq!(scan.entries.len(), 1);
    let e = &scan.entries[0];
    assert_eq!(
        (e.kernel.as_str(), e.initrd.as_str()),
        (
            &*format!("boot/vmlinuz-{RELEASE}"),
            &*format!("boot/initrd.img-{RELEASE}")
        )
    );
    assert_eq!(
        e.options,
        format!(
            "root=UUID={uuid} rootflags=subvol={SNAP} rootfstype=btrfs rw console=ttyS0 \
             panic=10 slate.init=/usr/bin/machined"
        )
    );
    assert_eq!(scan.selected().map(|e| e.snapshot.as_str()), Some(SNAP));
    assert_eq!(scan.saved().map(|e| e.snapshot.as_str()), Some(SNAP));
    // The paths the entry names exist in the pool; the manifest has no ESP records.
    let pool = Mounted::pool(&image);
    let root = pool.top().join(SNAP);
    assert!(root.join(&e.kernel).is_file() && root.join(&e.initrd).is_file());
    let manifest = fs::read(pool.top().join(format!(".slate/manifests/{SNAP}.manifest"))).unwrap();
    let text = String::from_utf8(manifest).unwrap();
    assert!(
        text.contains(&format!(" boot/vmlinuz-{RELEASE}\n")),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("e ")), "{text}");
}

#[test]
fn secureboot_and_small_profiles_are_refused_before_anything_is_built() {
    for (extra, field) in [("", "secureboot"), ("", "image.size_mib")] {
        let dir = inputs_dir(extra);
        let profile = dir.path().join("profile.toml");
        let mut text = fs::read_to_string(&profile).unwrap();
        match field {
            "secureboot" => text.push_str("[secureboot]\nkey = \"db.key\"\ncert = \"db.crt\"\n"),
            _ => text = text.replace("size_mib = 200", "size_mib = 160"),
        }
        fs::write(&profile, text).unwrap();
        let err = resolve(dir.path()).unwrap_err();
        let msg = chain(&err);
        assert!(msg.contains(field), "{field}: {msg}");
        assert!(msg.contains("btrfs-image"), "{field}: {msg}");
        // Nothing was built: the directory holds only the inputs.
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "mods",
                "profile.toml",
                "rootfs",
                "sd.efi",
                "slate",
                "vmlinuz"
            ]
        );
    }
}
