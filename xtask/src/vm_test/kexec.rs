//! Reboots by kexec (issue 16): one node, one QEMU process for as long as kexec carries it.
//!
//! 1. `slate reboot --mode kexec --wait`: machined loads the entry systemd-boot would start
//!    (the blessed v1) from its UKI and jumps; the console between the two boots shows a new
//!    kernel and no firmware (no OVMF `BdsDxe:`, no `EFI stub:` — both printed by the first,
//!    firmware, boot), QEMU never exited (`-no-reboot` would have ended it on any reset), and
//!    the node is Running again with a new boot id, naming its entry from `slate.entry=`.
//! 2. `[reboot] mode = "kexec"` applied live in the machine configuration; an upgrade to v2
//!    reboots by kexec into `slate-2.0.0+2-1.efi` (the attempt counted before the jump) and
//!    commits.
//! 3. A broken v3 (init cannot start machined) with one try, reached by kexec: the counted
//!    attempt leaves `slate-3.0.0+0-1.efi`, init's own reboot goes through the firmware, and
//!    systemd-boot's boot counting brings v2 back, which records the rollback.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::{build_bundle, build_image, ensure_logged, running, Node, Prepared};
use crate::util::repo_root;
use crate::vm::{tail, Running, Vm};

/// What only a boot through the firmware prints on this setup: OVMF's boot manager and the
/// kernel's EFI stub (a kexec enters the kernel past the stub).
pub const FIRMWARE_MARKERS: [&str; 2] = ["BdsDxe: ", "EFI stub: "];
/// machined's line just before the jump.
pub const KEXEC_LINE: &str = "[slate] [machined] rebooting by kexec into ";
const RUNNING: &str = "[slate] [machined] stage Running";

/// The console from the last `marker` on (empty when it never appeared).
fn from_last<'a>(serial: &'a str, marker: &str) -> &'a str {
    serial.rfind(marker).map_or("", |at| &serial[at..])
}

/// Judge the console from the last kexec line on: a new kernel, stage Running, no firmware.
/// Returns the kexec line.
pub fn kexec_was_clean(boot: &mut Running) -> Result<String> {
    ensure!(
        boot.is_running(),
        "QEMU exited: the machine was reset instead of kexec'd; console:\n{}",
        tail(&boot.serial(), 30)
    );
    let serial = boot.serial();
    let after = from_last(&serial, KEXEC_LINE);
    ensure!(
        !after.is_empty(),
        "no kexec line on the console:\n{}",
        tail(&serial, 40)
    );
    for marker in FIRMWARE_MARKERS {
        ensure!(
            !after.contains(marker),
            "{marker:?} after the kexec: the firmware ran; console:\n{}",
            tail(after, 40)
        );
    }
    ensure!(
        after.contains("Linux version") && after.contains(RUNNING),
        "a new kernel up to stage Running after the kexec:\n{}",
        tail(after, 40)
    );
    let line = after.lines().next().unwrap_or_default();
    Ok(line
        .split_once("[machined] ")
        .map_or(line, |(_, said)| said)
        .trim()
        .to_owned())
}

/// The node `name`'s installed configuration (`work/NAME.machine.toml`) with `[reboot] mode =
/// "kexec"` (edited, not made anew: `slate gen config` would issue a new CA, which needs a
/// reboot to apply).
fn kexec_config(work: &Path, name: &str) -> Result<std::path::PathBuf> {
    let installed = std::fs::read_to_string(work.join(format!("{name}.machine.toml")))?;
    ensure!(
        !installed.contains("[reboot]"),
        "no [reboot] yet: {installed}"
    );
    let path = work.join(format!("{name}-kexec.machine.toml"));
    std::fs::write(&path, format!("{installed}\n[reboot]\nmode = \"kexec\"\n"))?;
    Ok(path)
}

/// The scenario; see the module documentation.
pub(super) fn kexec_reboots(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let image = work.join("kexec.raw");
    build_image(slate, "1.0.0", &[], &image)?;
    let builder = {
        let (slate, work) = (slate.clone(), work.to_owned());
        std::thread::spawn(move || -> Result<_> {
            let (v2, v3) = (work.join("bundle-v2"), work.join("bundle-v3"));
            build_bundle(&slate, "2.0.0", &[], &v2)?;
            build_bundle(&slate, "3.0.0", &["slate.init=/nonexistent"], &v3)?;
            Ok((v2, v3))
        })
    };
    let mut vm = Vm::new(&image, &work.join("vm-kexec"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };

    // Boot 1, through the firmware: the markers a firmware boot prints are there.
    let mut boot = running(&mut vm)?;
    let first_boot = boot.elapsed();
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(60),
        "v1 committed",
    )?;
    let serial = boot.serial();
    for marker in FIRMWARE_MARKERS {
        ensure!(
            serial.contains(marker),
            "a firmware boot prints {marker:?} on this setup; console:\n{}",
            tail(&serial, 40)
        );
    }
    let before = node.status()?;

    // 1. `slate reboot --mode kexec --wait`.
    let asked = Instant::now();
    let waited = node.ok(&["reboot", "--mode", "kexec", "--wait"])?;
    let kexec_reboot = asked.elapsed();
    ensure!(
        waited.contains("committed 1.0.0"),
        "reboot --wait: {waited}"
    );
    let line = kexec_was_clean(&mut boot)?;
    ensure!(
        line.starts_with("rebooting by kexec into slate-1.0.0.efi (kexec)"),
        "{line}"
    );
    ensure_logged(&boot, "kexec: loaded slate-1.0.0.efi (kernel ")?;
    let after = node.status()?;
    ensure!(
        after["boot_id"] != before["boot_id"] && after["boot_id"].is_string(),
        "a new boot id: {before} then {after}"
    );
    ensure!(
        after["stage"] == "Running" && after["booted_entry"] == "slate-1.0.0.efi",
        "Running again on the entry slate.entry= names: {after}"
    );

    // 2. The machine configuration makes kexec the default; an upgrade's reboot takes it.
    let config = kexec_config(work, "kexec")?;
    let applied = node.ok(&[
        "apply-config",
        config.to_str().unwrap_or_default(),
        "--mode",
        "no-reboot",
    ])?;
    ensure!(applied.contains("applied"), "apply-config: {applied}");
    let (v2, v3) = builder
        .join()
        .map_err(|_| anyhow::anyhow!("the bundle builder panicked"))??;
    let cache = repo_root().join(format!("target/vm-test-cache/{}", node.port));
    let cache = cache.to_str().unwrap_or(".");
    let asked = Instant::now();
    let upgraded = node.ok(&[
        "upgrade",
        "--image",
        &format!("oci-layout:{}", v2.display()),
        "--cache",
        cache,
        "--wait",
    ])?;
    let upgrade_took = asked.elapsed();
    ensure!(upgraded.contains("committed 2.0.0"), "upgrade: {upgraded}");
    let line = kexec_was_clean(&mut boot)?;
    ensure!(
        line.starts_with("rebooting by kexec into slate-2.0.0+2-1.efi (default)"),
        "the upgrade's reboot counted the try and kexec'd: {line}"
    );
    boot.expect(
        &["committed: slate-2.0.0+2-1.efi blessed as slate-2.0.0.efi"],
        Duration::from_secs(30),
        "v2 committed after the kexec",
    )?;
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["booted_entry"] == "slate-2.0.0+2-1.efi",
        "v2 by kexec: {status}"
    );

    // 3. A broken v3 with one try, reached by kexec: boot counting brings v2 back.
    let answer = node.ok(&[
        "upgrade",
        "--image",
        &format!("oci-layout:{}", v3.display()),
        "--cache",
        cache,
        "--tries",
        "1",
    ])?;
    ensure!(answer.contains("accepted"), "upgrade to v3: {answer}");
    boot.expect(
        &["rebooting by kexec into slate-3.0.0+0-1.efi"],
        Duration::from_secs(180),
        "the kexec into v3, its only try counted",
    )?;
    boot.wait_exit(Duration::from_secs(120))
        .context("v3's init should fail and reboot through the firmware")?;
    let serial = boot.serial();
    let v3_boot = from_last(&serial, KEXEC_LINE);
    ensure!(
        v3_boot.contains("slate.init=/nonexistent") && v3_boot.contains("rebooting in 1 s"),
        "v3 started by kexec and its init failed:\n{}",
        tail(v3_boot, 30)
    );
    ensure!(
        !FIRMWARE_MARKERS.iter().any(|m| v3_boot.contains(m)),
        "v3 was reached by kexec, not the firmware"
    );
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-2.0.0.efi"],
        Duration::from_secs(60),
        "v2 committed again after v3 spent its try",
    )?;
    let status = node.status()?;
    let rollback = &status["last_rollback"];
    ensure!(
        status["version"] == "2.0.0"
            && rollback["from"] == "3.0.0"
            && rollback["to"] == "2.0.0"
            && rollback["reason"]
                .as_str()
                .is_some_and(|r| r.contains("boot tries")),
        "boot counting reverted v3: {status}"
    );
    boot.kill();
    Ok(format!(
        "first boot to Running in {first_boot:.1?} (firmware: BdsDxe and EFI stub seen); \
         `slate reboot --mode kexec --wait` committed again in {kexec_reboot:.1?}, same QEMU \
         process, no firmware output between the boots, new boot id, booted_entry \
         slate-1.0.0.efi from slate.entry=; [reboot] mode = \"kexec\" applied live: upgrade to \
         2.0.0 committed in {upgrade_took:.1?} through a kexec into slate-2.0.0+2-1.efi; a \
         broken 3.0.0 (init fails, 1 try) reached by kexec as slate-3.0.0+0-1.efi, its init's \
         firmware reboot came back to 2.0.0 by boot counting ({})",
        rollback["reason"].as_str().unwrap_or_default()
    ))
}

/// The console has the lines the scenario reads (a check of the helpers on a captured log).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_kexec_segment_is_judged() {
        let serial =
            "BdsDxe: loading\nEFI stub: x\n[slate] [machined] rebooting by kexec into a.efi \
                      (kexec)\nLinux version\n[slate] [machined] rebooting by kexec into b.efi \
                      (default)\nLinux version 6\n";
        let last = from_last(serial, KEXEC_LINE);
        assert!(last.starts_with("[slate] [machined] rebooting by kexec into b.efi"));
        assert!(!FIRMWARE_MARKERS.iter().any(|m| last.contains(m)));
        assert_eq!(from_last(serial, "nowhere"), "");
    }
}
