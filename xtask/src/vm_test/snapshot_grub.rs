//! The Btrfs snapshot engine on GRUB (issue 15, docs/formats.md §12.9): a btrfs-image of
//! `profiles/demo-btrfs.toml` with `bootloader = "grub"` boots under OVMF + GRUB, whose menu
//! entries read each snapshot's own /boot in the pool. Eight boots:
//!
//! 1. v1 from the image's first snapshot (grubenv `saved_entry` names it).
//! 2. v2 (`slate snapshot upgrade --command … --reboot`): the one-shot `next_entry` starts it,
//!    machined commits it after the health checks (`saved_entry` moves to v2).
//! 3. v3 fails its health check: machined rolls back (v3 recorded bad) and reboots; 4. v2.
//! 5. v4's initramfs is garbage: the kernel panics (panic=1) on its one try; 6. GRUB's
//!    one-shot is spent, so the next boot is the saved default v2, unattended.
//! 7. v5 hangs before its commit (a health check that never passes): the watchdog resets it on
//!    its one try; 8. v2 again, unattended.
//!
//! grubenv is read out of the image with mtools and listed by the real `grub-editenv` between
//! boots, as `grub.rs` does.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::grub::{grub_efi, grub_variant, grubenv};
use super::snapshot::{
    set_version, snapshot_list, state_of, upgrade, FIRST_SNAPSHOT, HANG, WATCHDOG_ARMED,
};
use super::{node_config, running, Node, Prepared, BOOT_TIMEOUT, RUNNING};
use crate::vm::{tail, Running, Vm};

/// Whether the kernel on `serial` was started from `snapshot`'s menu entry: GRUB's
/// `BOOT_IMAGE=` leads the command line the kernel prints (a line may still be arriving when
/// it is matched, so its start is what is checked).
fn booted(serial: &str, snapshot: &str) -> bool {
    serial.contains(&format!(
        "Kernel command line: BOOT_IMAGE=/{snapshot}/boot/"
    ))
}

/// An upgrade by `command` from the running `boot` whose snapshot then boots once (GRUB's
/// one-shot) and ends by itself (a panic's reboot, the watchdog's reset) with `sign` on its
/// console and no commit. Returns the snapshot and how long its try took (s).
fn one_failed_try(
    node: &Node,
    vm: &mut Vm,
    mut boot: Running,
    command: &str,
    sign: &str,
) -> Result<(String, f64)> {
    let snapshot = upgrade(node, &mut boot, command)?;
    let mut boot = vm.start()?;
    boot.wait_exit(BOOT_TIMEOUT + Duration::from_secs(120))
        .with_context(|| format!("{snapshot}'s one try ending by itself"))?;
    let serial = boot.serial();
    ensure!(
        booted(&serial, &snapshot) && serial.contains(sign) && !serial.contains("committed: "),
        "{snapshot} tried once, {sign:?} expected, and no commit:\n{}",
        tail(&serial, 30)
    );
    Ok((snapshot, boot.elapsed().as_secs_f64()))
}

/// The next boot, unattended, is `good` again; `failed` is listed bad and `pruned` is gone.
fn back_on(node: &Node, vm: &mut Vm, good: &str, failed: &str, pruned: &str) -> Result<Running> {
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], BOOT_TIMEOUT, "the boot after a failed try")?;
    ensure!(
        booted(&boot.serial(), good),
        "the boot after {failed}'s try is {good}:\n{}",
        tail(&boot.serial(), 40)
    );
    let status = node.status()?;
    ensure!(status["version"] == "2.0.0", "back on v2: {status}");
    let listing = snapshot_list(node)?;
    ensure!(
        state_of(&listing, failed) == Some("bad") && state_of(&listing, pruned).is_none(),
        "{failed} bad after its one try, {pruned} pruned: {listing}"
    );
    Ok(boot)
}

/// The scenario; see the module documentation.
pub(super) fn btrfs_snapshot_grub(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let efi = grub_efi()?;
    let profile = grub_variant(work, &efi, "demo-btrfs", "grub-btrfs.toml", &[])?;
    let image = work.join("btrfs-grub.raw");
    super::snapshot::build_configured_btrfs_image(
        slate,
        &profile,
        &image,
        &node_config(slate, work, "btrfs-grub-node")?,
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
    step("as imaged", &format!("saved_entry={FIRST_SNAPSHOT}"))?;

    let mut vm = Vm::new(&image, &work.join("vm"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "btrfs-grub-node".into(),
    };
    // 1. v1, from the pool through GRUB.
    let mut boot = running(&mut vm)?;
    boot.expect(
        &[&format!("snapshot {FIRST_SNAPSHOT} was committed already")],
        Duration::from_secs(60),
        "v1 settled by the snapshot engine",
    )?;
    let serial = boot.serial();
    ensure!(
        serial.contains(&format!("subvol={FIRST_SNAPSHOT}, rw)"))
            && booted(&serial, FIRST_SNAPSHOT),
        "init mounted the snapshot root:\n{}",
        tail(&serial, 40)
    );

    // 2. v2 on its one-shot trial, committed: saved_entry moves.
    let v2 = upgrade(&node, &mut boot, &set_version("2.0.0"))?;
    step(
        "after the v2 upgrade",
        &format!("saved_entry={FIRST_SNAPSHOT} next_entry={v2}"),
    )?;
    let mut boot = running(&mut vm)?;
    let committed = boot.expect(
        &[&format!(
            "committed: snapshot {v2} (grubenv saved_entry {FIRST_SNAPSHOT} -> {v2})"
        )],
        Duration::from_secs(60),
        "v2 committed",
    )?;
    let status = node.status()?;
    ensure!(status["version"] == "2.0.0", "v2 runs: {status}");

    // 3. v3 fails its health check: machined rolls back, the reboot lands on v2.
    let v3 = upgrade(
        &node,
        &mut boot,
        &format!("{} && rm /usr/lib/slate/healthy", set_version("3.0.0")),
    )?;
    // The VM is down: v2's commit is on the disk.
    step(
        "after v2's commit and the v3 upgrade",
        &format!("saved_entry={v2} next_entry={v3}"),
    )?;
    let mut boot = vm.start()?;
    let reverted = boot.expect(
        &[&format!("snapshot reverted: {v3} failed its boot")],
        BOOT_TIMEOUT + Duration::from_secs(60),
        "v3 rolled back after its failed health check",
    )?;
    boot.wait_exit(Duration::from_secs(60))?;
    // The rollback removed the spent one-shot's empty next_entry.
    step("after v3's rollback", &format!("saved_entry={v2}"))?;
    let boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(status["version"] == "2.0.0", "back on v2: {status}");
    let listing = snapshot_list(&node)?;
    ensure!(
        state_of(&listing, &v3) == Some("bad") && state_of(&listing, &v2) == Some("good"),
        "v3 bad, v2 good: {listing}"
    );

    // 4. v4's initramfs is garbage: one try (GRUB's one-shot), a panic, then v2 unattended.
    let garbage = "for f in /boot/initrd.img-*; do echo garbage > \"$f\"; done";
    let (v4, secs) = one_failed_try(
        &node,
        &mut vm,
        boot,
        &format!("{} && {garbage}", set_version("4.0.0")),
        "VFS: Unable to mount root",
    )?;
    let panicked = format!("v4 panicked after {secs:.0} s");
    step(
        "after v4's one try",
        &format!("saved_entry={v2} next_entry="),
    )?;
    // v4's upgrade pruned bad v3 first.
    let boot = back_on(&node, &mut vm, &v2, &v4, &v3)?;

    // 5. v5 hangs before its commit: the watchdog resets it on its one try, then v2.
    let (v5, secs) = one_failed_try(
        &node,
        &mut vm,
        boot,
        &format!("{} && {HANG}", set_version("5.0.0")),
        WATCHDOG_ARMED,
    )?;
    let hung = format!("v5 reset by the watchdog after {secs:.0} s");
    step(
        "after v5's one try",
        &format!("saved_entry={v2} next_entry="),
    )?;
    let mut boot = back_on(&node, &mut vm, &v2, &v5, &v4)?;
    boot.kill();
    Ok(format!(
        "GRUB: v2 {v2} committed; v3 {v3} health check failed → rolled back → v2; v4 {v4} \
         kernel panic → one try → v2 unattended; v5 {v5} hung → watchdog reset → v2 | {} | {} \
         | {panicked} | {hung} | {}",
        committed.trim(),
        reverted.trim(),
        seen.join("; ")
    ))
}
