//! Boot benchmark (not a test): kernel start → machined stage Running, against a busybox /init
//! that mounts the same squashfs root, in the same VM (QEMU direct kernel boot, same kernel,
//! same command line, same disk). Times are the kernel's own timestamps from the serial log.
//!
//! slate's warm-up boot is the image's first, which formats STATE and /var: its figure is
//! printed apart (not counted), and the measured runs are the boots after it, as on a node.
//! Every slate boot ends with the ACPI power button (machined unmounts, syncs, powers off), so
//! the next one starts from clean file systems as after a reboot; pulling the plug instead had
//! every measured boot replay STATE's and /var's journals (0.35 s of the figure).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;
use slate_cpio::CpioWriter;

use crate::bench::{Bench, Comparison, Sample, Side};
use crate::util::{repo_root, run};
use crate::vm_test::{build_image, prepare};

pub(crate) const BASELINE_MARKER: &str = "BASELINE-ROOT-MOUNTED";
const RUNNING: &str = "[slate] [machined] stage Running";

/// The kernel timestamp (seconds) of the first console line containing `marker`.
pub(crate) fn kernel_timestamp(serial: &str, marker: &str) -> Option<f64> {
    line_timestamp(serial.lines().find(|l| l.contains(marker))?)
}

/// The kernel timestamp of the last console line containing `marker`.
fn last_kernel_timestamp(serial: &str, marker: &str) -> Option<f64> {
    line_timestamp(serial.lines().rfind(|l| l.contains(marker))?)
}

fn line_timestamp(line: &str) -> Option<f64> {
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    line[open + 1..close].trim().parse().ok()
}

/// Where a slate boot's time went, as kernel timestamps read off its console: slate-init
/// started, its last module loaded, the root switched, machined's first line, its Initialize
/// sequence done (what lies between the two is machined's own start: the reaper, node.toml, the
/// watchdog armed; after it, the Boot sequence up to Running, the sample's value).
const BREAKDOWN: [(&str, &str); 5] = [
    ("init_started", "[slate] [initramfs] starting slate"),
    ("modules_loaded", "[slate] [initramfs] loaded "),
    ("root_switched", "[slate] [initramfs] switched root"),
    ("machined_started", "[slate] [machined] starting slate"),
    (
        "initialized",
        "[slate] [machined] initialize sequence: done",
    ),
];

/// The run's [`BREAKDOWN`] figures; fails if the console lacks one of them.
fn breakdown(serial: &str, running: f64) -> Result<Sample> {
    let mut sample = Sample::new(running);
    for (name, marker) in BREAKDOWN {
        let Some(at) = last_kernel_timestamp(serial, marker) else {
            bail!("the console has no line with {marker:?}");
        };
        sample = sample.with(name, "s", at);
    }
    Ok(sample)
}

/// How a measured boot ends once `marker` is seen.
#[derive(Clone, Copy, PartialEq)]
enum End {
    /// The guest ends itself (busybox's `poweroff -f`); QEMU is killed if it has not.
    Itself,
    /// The ACPI power button, and QEMU must exit by itself within a minute: the clean shutdown
    /// a reboot is.
    PowerButton,
}

fn boot_direct(
    kernel: &Path,
    initrd: &Path,
    disk: &Path,
    cmdline: &str,
    (marker, end): (&str, End),
    log: &Path,
) -> Result<f64> {
    let mut boot = DirectBoot::start(kernel, initrd, disk, cmdline, log)?;
    let at = boot.wait_for(marker, Duration::from_secs(240))?;
    if end == End::PowerButton {
        boot.power_off(Duration::from_secs(60))?;
    }
    Ok(at)
}

/// A QEMU direct kernel boot (no firmware, no boot loader): TCG, one vCPU, the disk on
/// virtio, user networking, the watchdog a node has, the console in a file. QEMU is killed
/// when this is dropped. (slate cannot commit such a boot: no firmware says which entry
/// booted.)
pub(crate) struct DirectBoot {
    child: Child,
    log: PathBuf,
}

impl DirectBoot {
    pub(crate) fn start(
        kernel: &Path,
        initrd: &Path,
        disk: &Path,
        cmdline: &str,
        log: &Path,
    ) -> Result<DirectBoot> {
        let _ = fs::remove_file(log);
        let child = Command::new("qemu-system-x86_64")
            .args([
                "-accel", "tcg", "-m", "1024", "-smp", "1", "-display", "none", "-monitor", "stdio",
            ])
            .args(["-no-reboot", "-nic", "user,model=virtio-net-pci"])
            // The watchdog a node has (the demo image arms it, as in the VM tests): without
            // one, slate's boot would log that it could not arm it.
            .args(["-device", "i6300esb"])
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
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting QEMU")?;
        Ok(DirectBoot {
            child,
            log: log.to_owned(),
        })
    }

    /// Everything the guest printed so far.
    pub(crate) fn serial(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// The kernel timestamp of the first console line containing `marker`, waiting up to
    /// `timeout` for it; fails with the console's tail if QEMU ends or time runs out first.
    pub(crate) fn wait_for(&mut self, marker: &str, timeout: Duration) -> Result<f64> {
        let started = Instant::now();
        loop {
            let serial = self.serial();
            if let Some(ts) = kernel_timestamp(&serial, marker) {
                return Ok(ts);
            }
            if self.child.try_wait()?.is_some() || started.elapsed() > timeout {
                bail!(
                    "{marker} not seen; console ended with:\n{}",
                    crate::vm::tail(&serial, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The ACPI power button; QEMU must then exit by itself within `timeout` (the clean
    /// shutdown a reboot is).
    pub(crate) fn power_off(&mut self, timeout: Duration) -> Result<()> {
        let pressed = self
            .child
            .stdin
            .as_mut()
            .context("QEMU's monitor")?
            .write_all(b"system_powerdown\n");
        let deadline = Instant::now() + timeout;
        while pressed.is_ok() && self.child.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        if self.child.try_wait()?.is_none() {
            bail!(
                "the guest did not power off within {timeout:?} of the power button; console \
                 ended with:\n{}",
                crate::vm::tail(&self.serial(), 30)
            );
        }
        Ok(())
    }
}

impl Drop for DirectBoot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A busybox initramfs that does what slate's init does up to the mounted root: pseudo
/// filesystems, `modules` loaded one by one in their order (by file name and bytes; efivarfs
/// only when booted through UEFI, as slate's init does), the squashfs mounted read-only through
/// a loop device; then it marks the moment in the kernel log. A step that fails ends init (the
/// kernel panics), so the marker is never printed and the benchmark fails.
fn baseline_initramfs(rootfs: &[u8], modules: Vec<(String, Vec<u8>)>) -> Result<Vec<u8>> {
    let busybox = fs::read(repo_root().join(".cache/busybox/root/bin/busybox"))
        .context("reading busybox (xtask base-rootfs caches it)")?;
    let mut cpio = CpioWriter::new();
    for dir in ["bin", "dev", "proc", "sys", "newroot", "lib"] {
        cpio.dir(dir, 0o755)?;
    }
    cpio.char_device("dev/console", 0o600, 5, 1)?;
    cpio.file("bin/busybox", 0o755, busybox)?;
    cpio.symlink("bin/sh", "busybox")?;
    let mut loads = String::new();
    for (name, data) in modules {
        let load = format!("/bin/busybox insmod /lib/{name}");
        loads += &if name == "efivarfs.ko" {
            format!("/bin/busybox test -d /sys/firmware/efi && {load}\n")
        } else {
            format!("{load}\n")
        };
        cpio.file(&format!("lib/{name}"), 0o644, data)?;
    }
    cpio.file("rootfs.sqsh", 0o644, rootfs.to_vec())?;
    let script = format!(
        "#!/bin/sh\nset -e\n/bin/busybox mount -t proc proc /proc\n/bin/busybox mount -t sysfs sys /sys\n\
         /bin/busybox mount -t devtmpfs dev /dev\n{loads}\
         /bin/busybox mount -t squashfs -o loop,ro /rootfs.sqsh /newroot\n\
         echo \"{BASELINE_MARKER} $(/bin/busybox cat /newroot/etc/os-release | /bin/busybox grep IMAGE_VERSION)\" > /dev/kmsg\n\
         /bin/busybox poweroff -f\n"
    );
    cpio.file("init", 0o755, script)?;
    Ok(cpio.finish())
}

/// The modules in slate's initramfs (uncompressed, as `--output initramfs` writes it), by file
/// name, in its load order.
fn initramfs_modules(initramfs: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let entries = slate_cpio::parse_newc(initramfs).context("reading slate's initramfs")?;
    let file = |name: &str| {
        entries
            .iter()
            .find(|e| e.name_str() == Some(name))
            .map(|e| e.data.clone())
    };
    let order = file(slate_profile::image_contract::MODULES_LOAD_PATH)
        .context("slate's initramfs has no module load order")?;
    let mut modules = Vec::new();
    for line in String::from_utf8(order)?.lines() {
        let path = line.split(':').next().unwrap_or_default();
        let data = entries
            .iter()
            .find(|e| {
                e.name_str().is_some_and(|n| {
                    n.starts_with("lib/modules/") && n.ends_with(&format!("/{path}"))
                })
            })
            .map(|e| e.data.clone())
            .with_context(|| format!("slate's initramfs lacks {path}"))?;
        let name = Path::new(path)
            .file_name()
            .context("a module path without a file name")?;
        modules.push((name.to_string_lossy().into_owned(), data));
    }
    ensure!(!modules.is_empty(), "slate's initramfs loads no module");
    Ok(modules)
}

/// What a direct kernel boot of a profile needs ([`build_parts`]).
pub(crate) struct Parts {
    pub kernel: PathBuf,
    /// slate's initramfs, which carries the root squashfs.
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
    pub cmdline: String,
}

/// The kernel, initramfs, root squashfs and command line of `profile` at 1.0.0, built into
/// `dir` by the imager.
pub(crate) fn build_parts(slate: &Path, profile: &Path, dir: &Path) -> Result<Parts> {
    let build = |kind: &str, out: &Path| {
        run(Command::new(slate)
            .args(["imager", "build", "--profile"])
            .arg(profile)
            .args(["--version", "1.0.0", "--output", kind, "--out"])
            .arg(out))
    };
    let (kernel, initrd, rootfs, cmdline) = (
        dir.join("vmlinuz"),
        dir.join("initramfs"),
        dir.join("rootfs.sqsh"),
        dir.join("cmdline"),
    );
    build("kernel", &kernel)?;
    build("initramfs", &initrd)?;
    build("rootfs", &rootfs)?;
    build("cmdline", &cmdline)?;
    let cmdline = fs::read_to_string(&cmdline)?.trim().to_string();
    Ok(Parts {
        kernel,
        initrd,
        rootfs,
        cmdline,
    })
}

/// The busybox baseline's initramfs for `rootfs`, written to `out`: squashfs and loop, all
/// it needs to mount the root.
pub(crate) fn write_baseline_initramfs(rootfs: &Path, out: &Path) -> Result<()> {
    let dir = fs::canonicalize(repo_root().join(".cache/kernel/modules"))?;
    let mut modules = Vec::new();
    for module in [
        "kernel/fs/squashfs/squashfs.ko",
        "kernel/drivers/block/loop.ko",
    ] {
        let name = Path::new(module).file_name().context("a module's name")?;
        let data = fs::read(dir.join(module)).with_context(|| format!("reading {module}"))?;
        modules.push((name.to_string_lossy().into_owned(), data));
    }
    fs::write(out, baseline_initramfs(&fs::read(rootfs)?, modules)?)
        .with_context(|| format!("writing {}", out.display()))
}

pub fn bench_boot() -> Result<Vec<Comparison>> {
    let prepared = prepare()?;
    let work = repo_root().join("target/bench/boot");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let Parts {
        kernel,
        initrd,
        rootfs,
        cmdline,
    } = build_parts(
        &prepared.slate,
        &repo_root().join("profiles/demo.toml"),
        &work,
    )?;
    let baseline_initrd = work.join("baseline.cpio");
    write_baseline_initramfs(&rootfs, &baseline_initrd)?;
    // The kernel's part of slate's boot apart from slate's own: busybox loading every module
    // slate's init loads. What slate adds beyond this side is its own code's.
    let same_modules = initramfs_modules(&fs::read(&initrd)?)?;
    let module_count = same_modules.len();
    let same_modules_initrd = work.join("baseline-same-modules.cpio");
    fs::write(
        &same_modules_initrd,
        baseline_initramfs(&fs::read(&rootfs)?, same_modules)?,
    )
    .with_context(|| format!("writing {}", same_modules_initrd.display()))?;
    let disk = work.join("disk.raw");
    build_image(&prepared.slate, "1.0.0", &[], &disk)?;

    let slate = Side::new("slate to machined Running", |run| {
        let log = work.join(format!("slate-{run}.log"));
        let running = boot_direct(
            &kernel,
            &initrd,
            &disk,
            &cmdline,
            (RUNNING, End::PowerButton),
            &log,
        )?;
        let serial =
            fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
        // After the warm-up, every boot follows a clean power-off: a journal replay here
        // would mean the last shutdown was not clean (and would be measured as boot time).
        if run > 0 && serial.contains("recovering journal") {
            bail!("boot {run} replayed a journal: the power-off before it was not clean");
        }
        breakdown(&serial, running)
    });
    // A busybox boot from `initrd`, its console in `<stem>-<run>.log`, to the root mounted.
    let busybox = |initrd: &Path, stem: &str, run: usize| {
        let log = work.join(format!("{stem}-{run}.log"));
        let marker = (BASELINE_MARKER, End::Itself);
        boot_direct(&kernel, initrd, &disk, &cmdline, marker, &log).map(Sample::new)
    };
    let baseline = Side::new("busybox /init to root mounted", |run| {
        busybox(&baseline_initrd, "baseline", run)
    });
    let with_modules = Side::new(
        &format!("busybox /init loading slate's {module_count} modules"),
        |run| busybox(&same_modules_initrd, "baseline-same-modules", run),
    );
    let mut c = Bench::new("boot to Running", "s")
        .about("kernel start to machined stage Running (slate) vs to a mounted squashfs root")
        .about("(busybox /init); kernel timestamps, QEMU TCG, 1 vCPU, the same kernel and disk")
        .about("slate's warm-up boot is the image's first (it formats STATE and /var)")
        .about("slate's figures: kernel timestamps of init started, its last module loaded, the")
        .about("root switched, machined's first line and its Initialize sequence done, each run's")
        .about("read off its console")
        .about("and busybox /init loading every module slate's init loads, in its order: what")
        .about("slate adds beyond that side is its own code's, not the kernel's module loads")
        .run(slate, baseline, vec![with_modules])?;
    if let Some(modules) = c.also().first() {
        let own = c.slate.stats().median - modules.stats().median;
        c.extra(
            "slate_own_s",
            json!(own),
            format!(
                "slate's own part (slate − busybox with the same {module_count} modules, by the \
                 medians): {}{}",
                if own < 0.0 { "-" } else { "+" },
                crate::bench::format_value(own.abs(), "s")
            ),
        );
    }
    c.print();
    Ok(vec![c])
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

    #[test]
    fn a_boot_breaks_down_at_the_last_module_and_fails_without_a_milestone() {
        let serial = "[    1.600000] [slate] [initramfs] starting slate 0.1.0\n\
                      [    1.650000] [slate] [initramfs] loaded 1/2 squashfs in 21 ms\n\
                      [    1.900000] [slate] [initramfs] loaded 2/2 ext4 in 133 ms\n\
                      [    1.950000] [slate] [initramfs] switched root; executing /x\n\
                      [    2.100000] [slate] [machined] starting slate 0.1.0\n\
                      [    2.200000] [slate] [machined] initialize sequence: 4 phase(s)\n\
                      [    2.300000] [slate] [machined] initialize sequence: done in 93ms\n";
        let sample = breakdown(serial, 2.6).unwrap();
        let figures: Vec<(&str, f64)> = sample.figures().map(|(n, _, v)| (n, v)).collect();
        assert_eq!(
            figures,
            [
                ("init_started", 1.6),
                ("modules_loaded", 1.9),
                ("root_switched", 1.95),
                ("machined_started", 2.1),
                ("initialized", 2.3)
            ]
        );
        let without_machined = serial.replace("[machined] starting", "[machined] begun");
        let err = breakdown(&without_machined, 2.6).unwrap_err().to_string();
        assert!(err.contains("[machined] starting"), "{err}");
    }

    #[test]
    fn the_same_modules_side_loads_slate_s_modules_in_slate_s_order() {
        let order = slate_profile::image_contract::MODULES_LOAD_PATH;
        let mut cpio = CpioWriter::new();
        cpio.file(
            "lib/modules/6.1.0-57-amd64/kernel/fs/ext4/ext4.ko",
            0o644,
            b"ext4".to_vec(),
        )
        .unwrap();
        cpio.file(
            "lib/modules/6.1.0-57-amd64/kernel/fs/jbd2/jbd2.ko",
            0o644,
            b"jbd2".to_vec(),
        )
        .unwrap();
        cpio.file(
            order,
            0o644,
            "kernel/fs/jbd2/jbd2.ko:\nkernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko\n"
                .as_bytes()
                .to_vec(),
        )
        .unwrap();
        let modules = initramfs_modules(&cpio.finish()).unwrap();
        assert_eq!(
            modules,
            [
                ("jbd2.ko".to_owned(), b"jbd2".to_vec()),
                ("ext4.ko".to_owned(), b"ext4".to_vec())
            ]
        );

        let mut cpio = CpioWriter::new();
        cpio.file(
            order,
            0o644,
            "kernel/fs/ext4/ext4.ko:\n".as_bytes().to_vec(),
        )
        .unwrap();
        let err = initramfs_modules(&cpio.finish()).unwrap_err().to_string();
        assert!(err.contains("lacks kernel/fs/ext4/ext4.ko"), "{err}");
    }
}
