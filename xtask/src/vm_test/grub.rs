//! The GRUB variant of the upgrade story: a demo image with `bootloader = "grub"` boots under
//! OVMF + GRUB (slot A), is upgraded offline to v2 (slot B, `next_entry` one shot), commits
//! it (`saved_entry=B`), and returns to v2 unattended after a broken v3. At every step slate's
//! grubenv is read back out of the image with mtools and listed by the real `grub-editenv`.
//! With v2 committed, grubenv is overwritten with garbage: GRUB still boots the committed slot
//! B, from slate's second record `grub/slate-default.env` (issue 18).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::rollback::build;
use super::{demo_keys, running, Node, Prepared, BOOT_TIMEOUT};
use crate::util::{output, repo_root};
use crate::vm::Vm;

/// Build the GRUB EFI image (`grub-mkstandalone`, every module in its memdisk) around slate's
/// embedded config, into `target/grub/grubx64.efi`; rebuilt when the config changes.
pub fn grub_efi() -> Result<PathBuf> {
    let dir = repo_root().join("target/grub");
    fs::create_dir_all(&dir)?;
    let efi = dir.join("grubx64.efi");
    let cfg = dir.join("embedded.cfg");
    let wanted = slate_bootloader::grub::config::GRUB_EMBEDDED_CFG;
    if efi.exists() && fs::read_to_string(&cfg).ok().as_deref() == Some(wanted) {
        return Ok(efi);
    }
    fs::write(&cfg, wanted)?;
    output(
        Command::new("grub-mkstandalone")
            .args([
                "-O",
                "x86_64-efi",
                "--modules=part_gpt fat",
                "--locales=",
                "--themes=",
                "--fonts=",
            ])
            .arg("-o")
            .arg(&efi)
            .arg(format!("boot/grub/grub.cfg={}", cfg.display())),
    )
    .context("grub-mkstandalone (Debian package grub-efi-amd64-bin; scripts/install-deps)")?;
    Ok(efi)
}

/// `profiles/<name>.toml` written to `work/<out>` with absolute paths, `bootloader = "grub"`,
/// the GRUB EFI image, and each line starting with one of `replaced`'s keys replaced by its line.
pub(super) fn grub_variant(
    work: &Path,
    grub_efi: &Path,
    name: &str,
    out_name: &str,
    replaced: &[(&str, &str)],
) -> Result<PathBuf> {
    let profiles = repo_root().join("profiles");
    let text = fs::read_to_string(profiles.join(format!("{name}.toml")))
        .with_context(|| format!("reading {name}.toml"))?;
    let absolute = format!("\"{}/../", profiles.display());
    let mut out = String::new();
    for line in text.lines() {
        let line = line.replace("\"../", &absolute);
        let trimmed = line.trim();
        let line = if trimmed.starts_with("bootloader") {
            "bootloader = \"grub\"".to_string()
        } else if trimmed == "[boot]" {
            format!("[boot]\ngrub_efi = \"{}\"", grub_efi.display())
        } else if let Some((_, with)) = replaced.iter().find(|(key, _)| trimmed.starts_with(key)) {
            (*with).to_string()
        } else {
            line
        };
        out.push_str(&line);
        out.push('\n');
    }
    let path = work.join(out_name);
    fs::write(&path, out)?;
    Ok(path)
}

/// demo.toml on GRUB with an ESP with room for two slots of kernel + initramfs.
pub(super) fn grub_profile(work: &Path, grub_efi: &Path) -> Result<PathBuf> {
    grub_variant(
        work,
        grub_efi,
        "demo",
        "grub.toml",
        &[("size_mib", "size_mib = 512"), ("esp_mib", "esp_mib = 200")],
    )
}

/// `grub-editenv FILE list` of the image's `grub/grubenv` (copied out with mtools), one line.
pub(super) fn grubenv(image: &Path, work: &Path) -> Result<String> {
    let copy = work.join("grubenv.out");
    let _ = fs::remove_file(&copy);
    output(
        Command::new("mcopy")
            .arg("-n")
            .arg("-i")
            .arg(format!("{}@@1M", image.display()))
            .arg("::/grub/grubenv")
            .arg(&copy),
    )?;
    ensure!(
        fs::metadata(&copy)?.len() == 1024,
        "grubenv is not 1024 bytes"
    );
    let list = output(Command::new("grub-editenv").arg(&copy).arg("list"))?;
    Ok(list.trim().replace('\n', " "))
}

fn upgrade(slate: &Path, image: &Path, bundle: &Path) -> Result<std::process::Output> {
    Ok(Command::new(slate)
        .args(["installer", "upgrade", "--disk"])
        .arg(image)
        .arg("--bundle")
        .arg(bundle)
        .arg("--trusted-keys")
        .arg(demo_keys())
        .output()?)
}

pub(super) fn grub_upgrade_and_revert(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let efi = grub_efi()?;
    let profile = grub_profile(work, &efi)?;
    let image = work.join("grub.raw");
    let (v2, v3) = (work.join("grub-bundle-v2"), work.join("grub-bundle-v3"));
    build(slate, &profile, "image", "1.0.0", &[], &image)?;
    build(slate, &profile, "installer", "2.0.0", &[], &v2)?;
    build(
        slate,
        &profile,
        "installer",
        "3.0.0",
        &["slate.debug.fail-task=network"],
        &v3,
    )?;
    let mut seen = Vec::new();
    let mut step = |what: &str, expect: &str| -> Result<()> {
        let env = grubenv(&image, work)?;
        println!("  grubenv {what}: {env}");
        ensure!(
            env == expect,
            "grubenv {what}: {env:?}, expected {expect:?}"
        );
        seen.push(format!("{what}: {env}"));
        Ok(())
    };
    step("as imaged", "saved_entry=A")?;

    let mut vm = Vm::new(&image, &work.join("vm-grub"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };
    let mut boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(status["version"] == "1.0.0", "v1: {status}");
    ensure!(
        boot.serial().contains("slate.slot=A"),
        "v1 booted from slot A"
    );
    boot.kill();

    let out = upgrade(slate, &image, &v2)?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains("installed B (fallback A"),
        "upgrade to v2: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    step("after the v2 upgrade", "saved_entry=A next_entry=B")?;

    let mut boot = running(&mut vm)?;
    let committed = boot.expect(&["committed: "], Duration::from_secs(60), "v2 committed")?;
    ensure!(node.status()?["version"] == "2.0.0", "v2 is up");
    ensure!(
        boot.serial().contains("slate.slot=B"),
        "v2 booted from slot B"
    );
    boot.kill();
    step("after v2's commit", "saved_entry=B")?;
    let corrupted = corrupted_grubenv_boots_the_record(slate, &image, work, &mut vm, &node)?;
    step("restored after the corrupted boot", "saved_entry=B")?;

    let out = upgrade(slate, &image, &v3)?;
    ensure!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("installed A (fallback B"),
        "upgrade to v3: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    step("after the v3 upgrade", "saved_entry=B next_entry=A")?;
    let mut boot = vm.start()?;
    boot.expect(
        &["[slate] [machined] fatal:"],
        BOOT_TIMEOUT,
        "v3's fatal boot",
    )?;
    let reverted = boot.expect(
        &["upgrade reverted: the next boot is"],
        Duration::from_secs(30),
        "the revert",
    )?;
    ensure!(reverted.contains("is B"), "{reverted}");
    boot.wait_exit(Duration::from_secs(90))?;
    step("after v3's revert", "saved_entry=B")?;

    // A v3 whose health check cannot pass: machined records it, reverts, reboots into v2.
    let health_profile = work.join("grub-health.toml");
    fs::write(
        &health_profile,
        super::rollback::without_health(&fs::read_to_string(&profile)?)
            + "\n[health]\ntimeout_secs = 5\n[[health.checks]]\nfile = \"/nonexistent/ready\"\n\n\
               [watchdog]\ntimeout_secs = 60\n",
    )?;
    let v3h = work.join("grub-bundle-v3-health");
    build(slate, &health_profile, "installer", "3.0.5", &[], &v3h)?;
    let out = upgrade(slate, &image, &v3h)?;
    ensure!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("installed A (fallback B"),
        "upgrade to the unhealthy v3: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut boot = vm.start()?;
    let unhealthy = boot.expect(
        &["health check `file /nonexistent/ready` failed"],
        BOOT_TIMEOUT,
        "the failing health check",
    )?;
    boot.expect(
        &["upgrade reverted: the next boot is B"],
        Duration::from_secs(30),
        "the revert after the health check",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    step("after the unhealthy v3's revert", "saved_entry=B")?;

    let mut boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["last_failure"]["version"] == "3.0.5",
        "after the reverts: {status}"
    );

    // Staged on GRUB: v4 installed by the next boot before the OS comes up; a broken v5 staged
    // the same way returns to v4 and is not tried again.
    let (v4, v5) = (work.join("grub-bundle-v4"), work.join("grub-bundle-v5"));
    build(slate, &profile, "installer", "4.0.0", &[], &v4)?;
    build(
        slate,
        &profile,
        "installer",
        "5.0.0",
        &["slate.debug.fail-task=network"],
        &v5,
    )?;
    super::staged::stage(&node, &mut boot, &mut vm, &v4, "4.0.0", &[])?;
    let mut boot = running(&mut vm)?;
    boot.expect(&["committed: "], Duration::from_secs(60), "v4 committed")?;
    ensure!(node.status()?["version"] == "4.0.0", "staged v4 is up");
    step("after staged v4's commit", "saved_entry=A")?;
    super::staged::stage(&node, &mut boot, &mut vm, &v5, "5.0.0", &[])?;
    let mut broken = vm.start()?;
    broken.expect(
        &["upgrade reverted: the next boot is A"],
        BOOT_TIMEOUT,
        "staged v5 reverted",
    )?;
    broken.wait_exit(Duration::from_secs(90))?;
    let mut boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "4.0.0" && !boot.serial().contains("staged upgrade"),
        "after staged v5: {status}"
    );
    boot.kill();
    step("after staged v5's revert", "saved_entry=A")?;

    // A grubenv that is not GRUB's: the installer refuses before writing anything.
    let bad = work.join("grubenv.bad");
    fs::write(&bad, vec![b'x'; 1024])?;
    output(
        Command::new("mcopy")
            .args(["-o", "-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg(&bad)
            .arg("::/grub/grubenv"),
    )?;
    let out = upgrade(slate, &image, &v3)?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        !out.status.success() && err.contains("signature"),
        "a bad grubenv: {err}"
    );
    println!(
        "  a corrupted grubenv: {}",
        err.lines().last().unwrap_or("").trim()
    );

    Ok(format!(
        "OVMF + GRUB: v1 (slot A) -> offline upgrade -> v2 via next_entry, committed ({}); \
         {corrupted}; \
         broken v3 reverted to v2 unattended ({}); unhealthy v3 reverted ({}); staged v4 installed at boot and committed, \
         staged broken v5 reverted to v4 and not retried; grubenv: {}",
        committed.trim(),
        reverted.trim(),
        unhealthy.trim(),
        seen.join("; ")
    ))
}

/// `file` copied onto the image's ESP at `path` (mtools, overwriting).
fn mcopy_in(image: &Path, file: &Path, path: &str) -> Result<()> {
    output(
        Command::new("mcopy")
            .args(["-o", "-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg(file)
            .arg(format!("::/{path}")),
    )?;
    Ok(())
}

/// v2 committed in slot B, the machine off: grubenv overwritten with 1024 bytes of garbage
/// (GRUB's `load_env` refuses the block). Offline, `slate boot explain` names slot B from the
/// second record; one boot shows GRUB starting slot B (`slate.slot=B` on the kernel command
/// line) and the node up on v2, with nothing to commit. The good grubenv is put back after.
fn corrupted_grubenv_boots_the_record(
    slate: &Path,
    image: &Path,
    work: &Path,
    vm: &mut Vm,
    node: &Node,
) -> Result<String> {
    let good = work.join("grubenv.good");
    let _ = fs::remove_file(&good);
    output(
        Command::new("mcopy")
            .arg("-n")
            .arg("-i")
            .arg(format!("{}@@1M", image.display()))
            .arg("::/grub/grubenv")
            .arg(&good),
    )?;
    let garbage = work.join("grubenv.garbage");
    fs::write(&garbage, vec![b'x'; 1024])?;
    mcopy_in(image, &garbage, "grub/grubenv")?;

    let explain = Command::new(slate)
        .args(["boot", "explain", "--disk"])
        .arg(image)
        .output()?;
    let text = String::from_utf8_lossy(&explain.stdout).into_owned();
    ensure!(
        explain.status.success() && text.contains("slate-default.env"),
        "explain with a corrupted grubenv: {text}{}",
        String::from_utf8_lossy(&explain.stderr)
    );
    let why = text
        .lines()
        .find(|l| l.contains("slate-default.env"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    println!("  explain, grubenv corrupted: {why}");

    let mut boot = running(vm)?;
    let status = node.status()?;
    let serial = boot.serial();
    let cmdline = serial
        .lines()
        .find(|l| l.contains("slate.slot="))
        .unwrap_or_default()
        .trim()
        .to_owned();
    ensure!(
        status["version"] == "2.0.0" && serial.contains("slate.slot=B"),
        "a corrupted grubenv boots the committed v2 in slot B: {status}; {cmdline}"
    );
    println!(
        "  booted with grubenv corrupted: version {}, {cmdline}",
        status["version"]
    );
    boot.kill();
    mcopy_in(image, &good, "grub/grubenv")?;
    Ok(format!(
        "grubenv overwritten with garbage: v2 booted from slot B by the second record \
         (version {}, slate.slot=B)",
        status["version"]
    ))
}
