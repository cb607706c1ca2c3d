//! VM scenarios run by the test command (`xtask vm-test`) and the demo (`xtask demo`): real
//! boots of images the imager built, judged by what the guest printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::util::{output, repo_root, run};
use crate::vm::Vm;
use crate::{base_rootfs, kernel, slate_static};

const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// What the demo root's PID 1 prints once the switch to the squashfs root has happened.
const ROOT_MARKER: &str = "SLATE-ROOT-OK";

/// Kernel cache, static slate, and the base root with slate in it.
pub fn prepare() -> Result<PathBuf> {
    kernel::kernel(false)?;
    let slate = slate_static::slate_static()?;
    let rootfs = repo_root().join("target/demo/rootfs");
    base_rootfs::base_rootfs(&rootfs, "0", Some(&slate), true)?;
    Ok(slate)
}

/// Build a disk image of the demo profile at `version` with the static slate (in its imager
/// role, as a release pipeline would).
pub fn build_image(slate: &Path, version: &str, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out.parent().unwrap_or(Path::new(".")))?;
    run(Command::new(slate)
        .args(["imager", "build", "--profile"])
        .arg(repo_root().join("profiles/demo.toml"))
        .args(["--version", version, "--output", "image", "--out"])
        .arg(out)
        .env("SOURCE_DATE_EPOCH", "1700000000"))
}

fn esp_listing(image: &Path) -> Result<String> {
    output(
        Command::new("mdir")
            .args(["-/", "-b", "-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg("::/EFI/Linux"),
    )
}

/// The image boots through systemd-boot and the UKI into slate's init, which mounts the squashfs
/// root and switches to it; the switched-to root prints its version and root filesystem type.
fn boots_to_the_squashfs_root(slate: &Path, work: &Path) -> Result<String> {
    let image = work.join("boot.raw");
    build_image(slate, "1.0.0", &image)?;
    ensure!(
        esp_listing(&image)?.contains("slate-1.0.0+3.efi"),
        "a fresh image carries the UKI with 3 tries"
    );
    let mut vm = Vm::new(&image, &work.join("vm-boot"))?;
    let boot = vm.boot(&[ROOT_MARKER], BOOT_TIMEOUT)?;
    let marker = boot.expect_match("the switched-to root's marker")?;
    ensure!(
        marker.contains("name=slate version=1.0.0 rootfs=squashfs"),
        "the root that came up is not the image's squashfs: {marker}"
    );
    for line in [
        "[slate] [initramfs] loaded 3/3",
        "[slate] [initramfs] switched root; executing /sbin/init",
    ] {
        ensure!(
            boot.serial.contains(line),
            "init did not log {line:?}; console:\n{}",
            boot.serial
        );
    }
    let listing = esp_listing(&image)?;
    ensure!(
        listing.contains("slate-1.0.0+2-1.efi"),
        "systemd-boot should have counted one try (+3 -> +2-1): {listing}"
    );
    Ok(format!(
        "{marker}; systemd-boot counted the try (slate-1.0.0+2-1.efi); {:.1?}",
        boot.elapsed
    ))
}

/// A scenario gets the static slate binary and a work directory, and describes what it saw.
type Scenario = fn(&Path, &Path) -> Result<String>;

pub fn vm_test() -> Result<()> {
    let slate = prepare()?;
    let work = repo_root().join("target/vm-test");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let scenarios: [(&str, Scenario); 1] =
        [("boots_to_the_squashfs_root", boots_to_the_squashfs_root)];
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in scenarios {
        match scenario(&slate, &work).with_context(|| format!("scenario {name}")) {
            Ok(detail) => {
                passed += 1;
                println!("vm {name} ... ok: {detail}");
            }
            Err(err) => {
                failed += 1;
                println!("vm {name} ... FAILED: {err:#}");
            }
        }
    }
    println!("vm: {passed} passed, {failed} failed");
    ensure!(failed == 0, "{failed} VM scenario(s) failed");
    Ok(())
}

/// The main job as far as slate goes today: build the demo image with the imager, boot it in
/// QEMU through systemd-boot and the UKI, and show what the node printed and what it left on
/// its disk.
pub fn demo() -> Result<()> {
    let slate = prepare()?;
    let work = repo_root().join("target/demo/run");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let image = work.join("disk.raw");
    println!("== the plan");
    run(Command::new(&slate)
        .args(["imager", "build", "--profile"])
        .arg(repo_root().join("profiles/demo.toml"))
        .args(["--output", "image", "--dry-run", "--out"])
        .arg(&image))?;
    println!("== building slate 1.0.0 as a disk image");
    build_image(&slate, "1.0.0", &image)?;
    println!("{}", output(Command::new("sgdisk").arg("-p").arg(&image))?);
    println!("{}", esp_listing(&image)?);
    println!("== booting it (QEMU, OVMF, systemd-boot, -accel tcg)");
    let mut vm = Vm::new(&image, &work.join("vm"))?;
    let boot = vm.boot(&[ROOT_MARKER], BOOT_TIMEOUT)?;
    for line in boot.serial.lines().filter(|l| l.contains("[slate]")) {
        println!("  {}", line.trim());
    }
    println!("  {}", boot.expect_match("the switched-to root's marker")?);
    println!("== after the boot: systemd-boot counted one try");
    println!("{}", esp_listing(&image)?);
    println!("== META on the node's disk");
    run(Command::new(&slate)
        .args(["meta", "list", "--output", "json", "--disk"])
        .arg(&image))?;
    Ok(())
}
