//! Boot benchmark (not a test): kernel start → machined stage Running, against a busybox /init
//! that mounts the same squashfs root, in the same VM (QEMU direct kernel boot, same kernel,
//! same command line, same disk). Times are the kernel's own timestamps from the serial log.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use slate_cpio::CpioWriter;

use crate::util::{repo_root, run};
use crate::vm_test::{build_image, prepare};

const BASELINE_MARKER: &str = "BASELINE-ROOT-MOUNTED";
const RUNNING: &str = "[slate] [machined] stage Running";

/// The kernel timestamp (seconds) of the first console line containing `marker`.
fn kernel_timestamp(serial: &str, marker: &str) -> Option<f64> {
    let line = serial.lines().find(|l| l.contains(marker))?;
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    line[open + 1..close].trim().parse().ok()
}

fn boot_direct(
    kernel: &Path,
    initrd: &Path,
    disk: &Path,
    cmdline: &str,
    marker: &str,
    log: &Path,
) -> Result<f64> {
    let _ = fs::remove_file(log);
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel", "tcg", "-m", "1024", "-smp", "1", "-display", "none", "-monitor", "none",
        ])
        .args(["-no-reboot", "-nic", "user,model=virtio-net-pci"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(cmdline)
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", disk.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting QEMU")?;
    let started = Instant::now();
    let result = loop {
        let serial = String::from_utf8_lossy(&fs::read(log).unwrap_or_default()).into_owned();
        if let Some(ts) = kernel_timestamp(&serial, marker) {
            break Ok(ts);
        }
        if child.try_wait()?.is_some() || started.elapsed() > Duration::from_secs(240) {
            break Err(anyhow::anyhow!(
                "{marker} not seen; console ended with:\n{}",
                crate::vm::tail(&serial, 30)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// A busybox initramfs that does what slate's init does up to the mounted root: pseudo
/// filesystems, the squashfs and loop modules, the squashfs mounted read-only through a loop
/// device; then it marks the moment in the kernel log.
fn baseline_initramfs(rootfs: &[u8], modules: &Path) -> Result<Vec<u8>> {
    let busybox = fs::read(repo_root().join(".cache/busybox/root/bin/busybox"))
        .context("reading busybox (xtask base-rootfs caches it)")?;
    let mut cpio = CpioWriter::new();
    for dir in ["bin", "dev", "proc", "sys", "newroot", "lib"] {
        cpio.dir(dir, 0o755)?;
    }
    cpio.char_device("dev/console", 0o600, 5, 1)?;
    cpio.file("bin/busybox", 0o755, busybox)?;
    cpio.symlink("bin/sh", "busybox")?;
    for module in [
        "kernel/fs/squashfs/squashfs.ko",
        "kernel/drivers/block/loop.ko",
    ] {
        let name = Path::new(module)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        cpio.file(
            &format!("lib/{name}"),
            0o644,
            fs::read(modules.join(module))?,
        )?;
    }
    cpio.file("rootfs.sqsh", 0o644, rootfs.to_vec())?;
    let script = format!(
        "#!/bin/sh\n/bin/busybox mount -t proc proc /proc\n/bin/busybox mount -t sysfs sys /sys\n\
         /bin/busybox mount -t devtmpfs dev /dev\n/bin/busybox insmod /lib/squashfs.ko\n\
         /bin/busybox insmod /lib/loop.ko\n\
         /bin/busybox mount -t squashfs -o loop,ro /rootfs.sqsh /newroot\n\
         echo \"{BASELINE_MARKER} $(/bin/busybox cat /newroot/etc/os-release | /bin/busybox grep IMAGE_VERSION)\" > /dev/kmsg\n\
         /bin/busybox poweroff -f\n"
    );
    cpio.file("init", 0o755, script)?;
    Ok(cpio.finish())
}

pub fn bench_boot() -> Result<()> {
    let prepared = prepare()?;
    let work = repo_root().join("target/bench/boot");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let profile = repo_root().join("profiles/demo.toml");
    let build = |kind: &str, out: &Path| {
        run(Command::new(&prepared.slate)
            .args(["imager", "build", "--profile"])
            .arg(&profile)
            .args(["--version", "1.0.0", "--output", kind, "--out"])
            .arg(out))
    };
    let (kernel, initrd, rootfs, cmdline) = (
        work.join("vmlinuz"),
        work.join("initramfs"),
        work.join("rootfs.sqsh"),
        work.join("cmdline"),
    );
    build("kernel", &kernel)?;
    build("initramfs", &initrd)?;
    build("rootfs", &rootfs)?;
    build("cmdline", &cmdline)?;
    let cmdline = fs::read_to_string(&cmdline)?.trim().to_string();
    let modules = fs::canonicalize(repo_root().join(".cache/kernel/modules"))?;
    let baseline = work.join("baseline.cpio");
    fs::write(
        &baseline,
        baseline_initramfs(&fs::read(&rootfs)?, &modules)?,
    )?;
    let disk = work.join("disk.raw");
    build_image(&prepared.slate, "1.0.0", &[], &disk)?;

    let base = boot_direct(
        &kernel,
        &baseline,
        &disk,
        &cmdline,
        BASELINE_MARKER,
        &work.join("baseline.log"),
    )?;
    let first = boot_direct(
        &kernel,
        &initrd,
        &disk,
        &cmdline,
        RUNNING,
        &work.join("slate-1.log"),
    )?;
    let second = boot_direct(
        &kernel,
        &initrd,
        &disk,
        &cmdline,
        RUNNING,
        &work.join("slate-2.log"),
    )?;
    let serial = fs::read_to_string(work.join("slate-2.log"))?;
    let Some(switched) = kernel_timestamp(&serial, "switched root") else {
        bail!("slate's init did not log the switch");
    };
    println!("boot to a mounted squashfs root vs slate to stage Running (kernel timestamps, one run each)");
    println!("  baseline busybox /init, root mounted:      {base:.3} s");
    println!(
        "  slate init, root switched:                 {switched:.3} s  (+{:.3} s vs baseline)",
        switched - base
    );
    println!("  slate machined Running, first boot:        {first:.3} s  (+{:.3} s; formats STATE and /var)", first - base);
    println!(
        "  slate machined Running, second boot:       {second:.3} s  (+{:.3} s; ratio {:.2}x)",
        second - base,
        second / base
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kernel_timestamps() {
        let serial = "[    1.500000] x\n[   12.345678] [slate] [machined] stage Running\n";
        assert_eq!(kernel_timestamp(serial, RUNNING), Some(12.345678));
        assert_eq!(kernel_timestamp(serial, "nope"), None);
    }
}
