//! A kernel that cannot start does not strand the node (issue 44, item 4). v2 boots, commits
//! and puts slate's firmware boot options first in `BootOrder` (the console says `boot
//! options: …`); powered off, it is upgraded offline to a v3 whose kernel's compressed payload
//! is corrupted (64 bytes flipped in the middle of the bzImage's xz stream). Powered on once,
//! with nobody touching it:
//!
//! - systemd-boot: the stub fails ("EFI stub: ERROR: Failed to decompress kernel"),
//!   systemd-boot returns "Load Error" to the firmware, which starts the next option — slate's
//!   `slate start 2/4`, the loader again. Three starts spend v3's three tries (+3 → +2-1 →
//!   +1-2 → +0-3); the fourth boots v2, which commits and records v3's failure.
//! - GRUB: `linuxefi` hands the kernel to its EFI stub, which fails the same way and exits
//!   GRUB; the firmware starts GRUB again, whose `next_entry` one shot is spent: v2's slot.
//!
//! All of it within one QEMU process: no reset, no power cycle (QEMU runs with `-no-reboot`,
//! so a reset would end it). Recovery is timed from power-on and from the first failed start
//! to v2's stage Running.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::rollback::{build, said};
use super::{build_image, esp_listing, offline_upgrade, Node, Prepared, RUNNING};
use crate::util::repo_root;
use crate::vm::{tail, Running, Vm};

const V2: &str = "2.0.0";
const V3: &str = "3.0.0";
const STUB_FAILED: &str = "EFI stub: ERROR: Failed to decompress kernel";
/// The bound this scenario holds recovery to, from power-on to v2's stage Running, under TCG
/// on a loaded CI machine: measured 49 s (systemd-boot, three failed starts) and 29 s (GRUB,
/// one) with two scenarios at once on two cores (docs/update-transaction.md).
const RECOVERY_BOUND: Duration = Duration::from_secs(180);

/// The demo kernel with 64 bytes of its compressed payload inverted, at `work/vmlinuz-corrupt`:
/// the PE image and the setup header intact (the stub starts), the xz stream not (x86 boot
/// protocol: `setup_sects` at 0x1f1, `payload_offset` and `payload_length` at 0x248 and 0x24c,
/// from the protected-mode code at `(setup_sects + 1) * 512`).
fn corrupted_kernel(work: &Path) -> Result<PathBuf> {
    let source = repo_root().join(".cache/kernel/vmlinuz");
    let mut kernel = fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    let field = |at: usize| -> Result<u32> {
        let bytes = kernel.get(at..at + 4).context("a bzImage setup header")?;
        Ok(u32::from_le_bytes(bytes.try_into()?))
    };
    let setup_sects = usize::from(*kernel.get(0x1f1).context("a bzImage")?).max(4);
    let payload = (setup_sects + 1) * 512 + usize::try_from(field(0x248)?)?;
    let middle = payload + usize::try_from(field(0x24c)?)? / 2;
    let bytes = kernel
        .get_mut(middle..middle + 64)
        .context("the payload lies inside the kernel")?;
    for byte in bytes {
        *byte ^= 0xff;
    }
    let out = work.join("vmlinuz-corrupt");
    fs::write(&out, kernel)?;
    Ok(out)
}

/// `profile` with its `[kernel] image` replaced by `kernel`, at `work/<name>.toml`.
fn with_kernel(profile_text: &str, kernel: &Path, work: &Path, name: &str) -> Result<PathBuf> {
    let mut out = String::new();
    let mut replaced = false;
    for line in profile_text.lines() {
        if line.trim_start().starts_with("image =") && !replaced {
            out.push_str(&format!("image = \"{}\"\n", kernel.display()));
            replaced = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    ensure!(replaced, "the profile names its kernel image");
    let path = work.join(format!("{name}.toml"));
    fs::write(&path, out)?;
    Ok(path)
}

/// What one scenario saw, for its summary line.
struct Recovery {
    failed_starts: usize,
    first_failure: Duration,
    running: Duration,
    options: String,
    last_failure: String,
}

/// v2 up and committed on `image`, its boot options written; powered off; upgraded offline to
/// `v3`; one power-on back to v2. `failed_starts` is how many times the stub must fail.
fn kernel_cannot_start(
    prepared: &Prepared,
    image: &Path,
    v3: &Path,
    vm_dir: &Path,
    failed_starts: usize,
) -> Result<Recovery> {
    let mut vm = Vm::new(image, vm_dir)?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(image),
    };
    let mut boot = super::running(&mut vm)?;
    let written = boot.expect(
        &["boot options: "],
        Duration::from_secs(120),
        "v2 committed and writing slate's boot options",
    )?;
    ensure!(
        written.contains(
            "(4 starts of EFI/BOOT/BOOTX64.EFI) first in BootOrder: wrote 4 option(s), BootOrder"
        ),
        "{written}"
    );
    let options = said(&written).to_owned();
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(90))?;

    let installed = offline_upgrade(&prepared.slate, image, v3)?;
    ensure!(installed.contains("installed "), "{installed}");
    let mut boot = vm.start()?;
    boot.expect(
        &[STUB_FAILED],
        RECOVERY_BOUND,
        "v3's kernel failing to start",
    )?;
    let first_failure = boot.elapsed();
    boot.expect(
        &[RUNNING],
        RECOVERY_BOUND,
        "v2 up again without a power cycle",
    )?;
    let running = boot.elapsed();
    ensure!(boot.is_running(), "no reset on the way back");
    boot.expect(
        &["rollback recorded: "],
        Duration::from_secs(120),
        "v2 committed, recording the return",
    )?;
    let serial = boot.serial();
    let failed = serial.matches(STUB_FAILED).count();
    ensure!(
        failed == failed_starts,
        "{failed} failed starts, expected {failed_starts}:\n{}",
        tail(&serial, 60)
    );
    // Each failed start, and the one that brought v2 back, was one of slate's options.
    for k in 1..=failed_starts + 1 {
        let option = format!("\"slate start {k}/4\"");
        ensure!(
            serial
                .lines()
                .any(|l| l.contains("BdsDxe: starting Boot") && l.contains(&option)),
            "the firmware started slate's option {k}:\n{}",
            tail(&serial, 60)
        );
    }
    show_recovery(&boot);
    let status = node.status()?;
    let failure = &status["last_failure"];
    ensure!(
        status["version"] == V2
            && failure["version"] == V3
            && failure["reason"]
                .as_str()
                .is_some_and(|r| r.contains("did not come up in its boot tries"))
            && status["last_rollback"]["from"] == V3,
        "back on v2 with v3's failure recorded: {status}"
    );
    ensure!(
        boot.wait_for(&["boot options: "], Duration::from_secs(30))?
            .is_some_and(|l| l.ends_with("nothing to change")),
        "v2's options kept as they were"
    );
    boot.kill();
    Ok(Recovery {
        failed_starts: failed,
        first_failure,
        running,
        options,
        last_failure: failure["reason"].as_str().unwrap_or_default().to_owned(),
    })
}

/// The firmware's and the loader's lines of the failed starts and the way back.
fn show_recovery(boot: &Running) {
    super::show(
        boot,
        &[
            "BdsDxe: starting",
            "BdsDxe: failed to start",
            "EFI stub: ERROR",
            "Failed to execute",
            "Booting `",
            RUNNING,
        ],
    );
}

fn summary(loader: &str, r: &Recovery) -> String {
    format!(
        "{loader}: {}; corrupted v3: {} failed start(s), the first {:.0?} after power-on, v2 \
         Running {:.0?} after power-on ({:.0?} after the first failure), no reset; \
         last_failure: {}",
        r.options,
        r.failed_starts,
        r.first_failure,
        r.running,
        r.running.saturating_sub(r.first_failure),
        r.last_failure
    )
}

/// systemd-boot: the demo image and a corrupted-kernel v3 bundle.
pub(super) fn sdboot_kernel_cannot_start(prepared: &Prepared, work: &Path) -> Result<String> {
    let started = Instant::now();
    let slate = &prepared.slate;
    let image = work.join("kernel.raw");
    build_image(slate, V2, &[], &image)?;
    let profiles = repo_root().join("profiles");
    let demo = fs::read_to_string(profiles.join("demo.toml"))?
        .replace("\"../", &format!("\"{}/../", profiles.display()));
    let profile = with_kernel(&demo, &corrupted_kernel(work)?, work, "corrupt-kernel")?;
    let v3 = work.join("bundle-v3");
    build(slate, &profile, "installer", V3, &[], &v3)?;
    let recovery = kernel_cannot_start(prepared, &image, &v3, &work.join("vm"), 3)?;
    let listing = esp_listing(&image)?;
    ensure!(
        listing.contains("slate-3.0.0+0-3.efi"),
        "v3 out of tries:\n{listing}"
    );
    Ok(format!(
        "{}; slate-3.0.0+0-3.efi on the ESP; {:.0?} in all",
        summary("systemd-boot", &recovery),
        started.elapsed()
    ))
}

/// GRUB: the GRUB variant of the demo image and the same corrupted kernel in slot B.
pub(super) fn grub_kernel_cannot_start(prepared: &Prepared, work: &Path) -> Result<String> {
    let started = Instant::now();
    let slate = &prepared.slate;
    let profile = super::grub::grub_profile(work, &super::grub::grub_efi()?)?;
    let image = work.join("grub-kernel.raw");
    build(slate, &profile, "image", V2, &[], &image)?;
    let corrupt = with_kernel(
        &fs::read_to_string(&profile)?,
        &corrupted_kernel(work)?,
        work,
        "grub-corrupt-kernel",
    )?;
    let v3 = work.join("grub-bundle-v3");
    build(slate, &corrupt, "installer", V3, &[], &v3)?;
    let recovery = kernel_cannot_start(prepared, &image, &v3, &work.join("vm-grub"), 1)?;
    let env = super::grub::grubenv(&image, work)?;
    ensure!(
        env == "saved_entry=A",
        "v2's slot A stays the default: {env}"
    );
    Ok(format!(
        "{}; grubenv {env}; {:.0?} in all",
        summary("GRUB", &recovery),
        started.elapsed()
    ))
}
