//! A real Btrfs pool on a loop device with one root snapshot (busybox, a kernel and an
//! initramfs, fstab), mounted like a running root, and a GPT disk image with a FAT32 ESP.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_disk::FileDisk;
use slate_layout::MIB;
use slate_snapshot::SnapshotName;
use slate_snapshot_engine::{Change, Pool, UpgradeOptions, UpgradeReport};

pub const R0: &str = "root-20260101-000000";
/// 2026-01-02T00:00:00Z; each upgrade in a test adds an hour.
pub const T1: u64 = 1_767_312_000;

pub use slate_testkit::sh;

/// Whether the machine can run these tests (under CI=true a missing part fails the test).
pub fn available() -> bool {
    slate_testkit::require_root()
        && slate_testkit::require_tool("mkfs.btrfs")
        && slate_testkit::require_tool("losetup")
        && slate_testkit::require_tool("busybox")
}

/// Unmounts `path`, waiting while it is busy. The tests of a binary run on parallel threads,
/// and a child process another test forks holds copies of this test's open files until it
/// execs: for that moment the mount is busy. CI saw it once, right after `populate` (`umount:
/// …/setup: target is busy`).
fn unmount_when_free(path: &Path) {
    for _ in 0..50 {
        let out = Command::new("umount").arg(path).output().unwrap();
        if out.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("busy"),
            "umount {}: {stderr}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{} was still busy after 5 s", path.display());
}

#[derive(Debug)]
pub struct Env {
    pub dir: tempfile::TempDir,
    pub loopdev: String,
    pub root: PathBuf,
    pub esp: PathBuf,
    pub uuid: String,
}

impl Env {
    pub fn new() -> Env {
        Env::with_loader(false)
    }

    /// A pool whose ESP carries slate's GRUB layout for snapshot roots (docs/formats.md
    /// §12.9), R0 its saved default, as `slate imager build --output btrfs-image` lays it down.
    pub fn new_grub() -> Env {
        Env::with_loader(true)
    }

    fn with_loader(grub: bool) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("pool.img");
        fs::File::create(&img).unwrap().set_len(320 * MIB).unwrap();
        sh("mkfs.btrfs", &["-q", "-f", img.to_str().unwrap()]);
        let loopdev = sh("losetup", &["-f", "--show", img.to_str().unwrap()]);
        let setup = dir.path().join("setup");
        let root = dir.path().join("root");
        fs::create_dir_all(&setup).unwrap();
        fs::create_dir_all(&root).unwrap();
        sh("mount", &[&loopdev, setup.to_str().unwrap()]);
        slate_host::create_subvolume(&setup, R0).unwrap();
        let uuid = slate_host::pool_uuid(&setup).unwrap();
        populate(&setup.join(R0), &uuid);
        unmount_when_free(&setup);
        let env = Env {
            esp: dir.path().join("esp.img"),
            dir,
            loopdev,
            root,
            uuid,
        };
        env.boot(R0);
        // The top level stays mounted where the engine mounts it, so the tests can look at
        // it between commands (the engine reuses a mount it finds, and leaves it).
        fs::create_dir_all(env.top()).unwrap();
        sh(
            "mount",
            &[
                "-o",
                "subvolid=5",
                &env.loopdev,
                env.top().to_str().unwrap(),
            ],
        );
        make_esp(&env.esp);
        if grub {
            let mut disk = FileDisk::open(&env.esp).unwrap();
            slate_bootloader::grub::snapshots::lay_down(&mut disk, 1, &env.grub_entry(R0)).unwrap();
        }
        env
    }

    /// The GRUB menu entry of a snapshot with the fixture's kernel and initramfs.
    pub fn grub_entry(&self, snapshot: &str) -> slate_bootloader::grub::snapshots::menu::MenuEntry {
        slate_bootloader::grub::snapshots::menu::MenuEntry::new(
            &slate_snapshot::entry::EntrySpec {
                snapshot: SnapshotName::parse(snapshot).unwrap(),
                pool_uuid: self.uuid.clone(),
                os_name: "Test OS 1".into(),
                extra_options: vec!["quiet".into()],
            },
            "boot/vmlinuz-6.1.0-1-amd64",
            "boot/initrd.img-6.1.0-1-amd64",
        )
        .unwrap()
    }

    /// What GRUB does at power-on: consume a one-shot next_entry; then mount what it starts.
    pub fn grub_reboot(&self) -> String {
        let mut disk = FileDisk::open(&self.esp).unwrap();
        let started = slate_bootloader::grub::snapshots::simulate_boot(&mut disk)
            .unwrap()
            .unwrap();
        self.boot(started.as_str());
        started.to_string()
    }

    /// `grub-editenv FILE list` of the ESP's `path` (copied out through slate's FAT reader).
    pub fn grub_editenv(&self, path: &str) -> Vec<String> {
        let disk = FileDisk::open_read_only(&self.esp).unwrap();
        let bytes = slate_esp::session::read_file(&disk, path).unwrap().unwrap();
        let copy = self.dir.path().join("grubenv.copy");
        fs::write(&copy, bytes).unwrap();
        let list = sh("grub-editenv", &[copy.to_str().unwrap(), "list"]);
        list.lines().map(str::to_owned).collect()
    }

    /// The ids of GRUB's generated menu, in menu order.
    pub fn grub_menu(&self) -> Vec<String> {
        let disk = FileDisk::open_read_only(&self.esp).unwrap();
        slate_bootloader::grub::snapshots::scan(&disk)
            .unwrap()
            .entries
            .iter()
            .map(|e| e.snapshot.to_string())
            .collect()
    }

    /// Mounts `snapshot` as the running root (what booting it would do).
    pub fn boot(&self, snapshot: &str) {
        let _ = Command::new("umount").arg(&self.root).output();
        sh(
            "mount",
            &[
                "-o",
                &format!("subvol={snapshot}"),
                &self.loopdev,
                self.root.to_str().unwrap(),
            ],
        );
    }

    pub fn top(&self) -> PathBuf {
        PathBuf::from(format!("/run/slate/btrfs-{}", self.uuid))
    }

    pub fn pool(&self) -> Pool {
        Pool::open(&self.root, &self.esp, true).unwrap()
    }

    pub fn upgrade(
        &self,
        change: Change,
        hour: u64,
    ) -> Result<UpgradeReport, slate_snapshot_engine::EngineError> {
        let pool = self.pool();
        let opts = UpgradeOptions {
            change,
            dry_run: false,
            cmdline: "BOOT_IMAGE=/x root=/dev/sda ro quiet".into(),
            now: Some(T1 + hour * 3600),
            tries: None,
        };
        slate_snapshot_engine::upgrade(&pool, &opts, &mut |l| println!("{l}"))
    }

    pub fn command(
        &self,
        cmd: &str,
        hour: u64,
    ) -> Result<UpgradeReport, slate_snapshot_engine::EngineError> {
        self.upgrade(Change::Command(cmd.into()), hour)
    }

    /// Names of the subvolumes on the top level.
    pub fn subvolumes(&self) -> Vec<String> {
        let pool = self.pool();
        pool.snapshots()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    pub fn esp_files(&self, snapshot: &str) -> usize {
        let disk = FileDisk::open_read_only(&self.esp).unwrap();
        slate_bootloader::sdboot::snapshots::snapshot_files(
            &disk,
            &SnapshotName::parse(snapshot).unwrap(),
        )
        .unwrap()
        .len()
    }

    pub fn entries(&self) -> Vec<String> {
        let disk = FileDisk::open_read_only(&self.esp).unwrap();
        slate_bootloader::sdboot::snapshots::scan(&disk)
            .unwrap()
            .entries
            .iter()
            .map(|e| e.name.file_name().to_owned())
            .collect()
    }

    pub fn next_boot(&self) -> Option<String> {
        let disk = FileDisk::open_read_only(&self.esp).unwrap();
        slate_bootloader::sdboot::snapshots::scan(&disk)
            .unwrap()
            .selected()
            .map(|e| e.name.file_name().to_owned())
    }

    /// What systemd-boot does at boot: count the attempt on the entry it starts; then mount it.
    pub fn reboot(&self) -> String {
        let mut disk = FileDisk::open(&self.esp).unwrap();
        let started = slate_bootloader::sdboot::snapshots::simulate_boot_attempt(&mut disk)
            .unwrap()
            .unwrap();
        self.boot(&started[..R0.len()]);
        started
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-R")
            .arg("-l")
            .arg(&self.root)
            .output();
        let _ = Command::new("umount")
            .arg("-R")
            .arg("-l")
            .arg(self.top())
            .output();
        let _ = Command::new("losetup")
            .arg("-d")
            .arg(&self.loopdev)
            .output();
    }
}

/// A minimal root: busybox as /bin/sh and /sbin/init, a kernel and initramfs, os-release,
/// fstab mounting the subvolume, a few files under /usr.
fn populate(root: &Path, uuid: &str) {
    for d in [
        "bin",
        "sbin",
        "boot",
        "etc",
        "usr/bin",
        "usr/lib",
        "usr/share/doc",
        "proc",
        "sys",
        "dev",
        "tmp",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::copy("/usr/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "echo", "rm", "sed", "touch", "sleep", "mkdir", "cat", "mv", "chmod", "false", "true",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::os::unix::fs::symlink("/bin/busybox", root.join("sbin/init")).unwrap();
    fs::write(root.join("boot/vmlinuz-6.1.0-1-amd64"), vec![0x4d; 70_000]).unwrap();
    fs::write(
        root.join("boot/initrd.img-6.1.0-1-amd64"),
        vec![0x1f; 30_000],
    )
    .unwrap();
    fs::write(
        root.join("usr/lib/os-release"),
        "PRETTY_NAME=\"Test OS 1\"\nID=test\n",
    )
    .unwrap();
    fs::write(root.join("usr/bin/hello"), "#!/bin/sh\necho hello 1\n").unwrap();
    fs::write(root.join("usr/share/doc/version"), "1\n").unwrap();
    fs::write(
        root.join("etc/fstab"),
        format!(
            "UUID={uuid} / btrfs rw,subvol=/{R0} 0 0\nUUID={uuid} /home btrfs subvol=@home 0 0\n"
        ),
    )
    .unwrap();
}

fn make_esp(path: &Path) {
    let mut disk = FileDisk::create(path, slate_testkit::esp::ESP_ONLY_DISK).unwrap();
    slate_testkit::esp::esp_only(&mut disk, "snapshot-tests", 1);
}
