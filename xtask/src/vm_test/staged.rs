//! Staged upgrades: `slate upgrade --stage` records the bundle in META and reboots; the next
//! boot's Install sequence consumes the tags (deleted and flushed first), runs the bundle's own
//! installer before the OS comes up, and reboots into the new version. A staged upgrade to a
//! broken version returns to the previous one and is not tried again. `slate rollback` returns
//! to the previous version by hand, on trial.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Result};

use super::{build_bundle, build_image, ensure_logged, running, Node, Prepared, BOOT_TIMEOUT};
use crate::vm::{Running, Vm};

/// `slate upgrade --stage`, then the staged boot that installs and reboots.
pub(super) fn stage(
    node: &Node,
    boot: &mut Running,
    vm: &mut Vm,
    bundle: &Path,
    version: &str,
) -> Result<()> {
    let answer = node.ok(&[
        "upgrade",
        "--stage",
        "--image",
        &format!("oci-layout:{}", bundle.display()),
    ])?;
    ensure!(
        answer.contains("accepted"),
        "slate upgrade --stage: {answer}"
    );
    boot.expect(
        &["staged the upgrade to"],
        Duration::from_secs(60),
        "the upgrade staged in META",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(boot, "[slate] [machined] rebooting (default)")?;
    ensure!(
        !boot.serial().contains("installer: installed"),
        "a staged upgrade must not install before the reboot"
    );
    // The staged boot: tags consumed, the installer run before the Boot sequence.
    let mut staged = vm.start()?;
    staged.expect(
        &[&format!("running the staged upgrade to {version}")],
        BOOT_TIMEOUT,
        "the staged upgrade at boot",
    )?;
    staged.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "the staged installer",
    )?;
    staged.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&staged, "taken out of META before it runs")?;
    ensure!(
        !staged.serial().contains("stage Running"),
        "the staged upgrade runs before the OS comes up"
    );
    Ok(())
}

pub(super) fn staged_upgrades(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("staged.raw");
    build_image(&prepared.slate, "1.0.0", &[], &image)?;
    let (v4, v5) = (work.join("bundle-staged-v4"), work.join("bundle-staged-v5"));
    build_bundle(&prepared.slate, "4.0.0", &[], &v4)?;
    build_bundle(
        &prepared.slate,
        "5.0.0",
        &["slate.debug.fail-task=network"],
        &v5,
    )?;
    let mut vm = Vm::new(&image, &work.join("vm-staged"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
    };

    let mut boot = running(&mut vm)?;
    stage(&node, &mut boot, &mut vm, &v4, "4.0.0")?;
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-4.0.0"],
        Duration::from_secs(60),
        "v4 committed",
    )?;
    ensure!(node.status()?["version"] == "4.0.0");

    // Back to v1 by hand: a dry run first (nothing written, no reboot), then the rollback: v1
    // boots on trial with v4 recorded to return to, and its Running commits it.
    let dry = node.ok(&["rollback", "--dry-run"])?;
    ensure!(
        dry.contains("would roll back") && dry.contains("slate-1.0.0+3.efi"),
        "slate rollback --dry-run: {dry}"
    );
    let answer = node.ok(&["rollback"])?;
    ensure!(
        answer.contains("rollback to 1.0.0 accepted")
            && answer.contains("slate-1.0.0+3.efi")
            && answer.contains("slate-4.0.0.efi"),
        "slate rollback: {answer}"
    );
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&boot, "rollback to 1.0.0 requested")?;
    let mut boot = running(&mut vm)?;
    let rolled_back = boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(60),
        "v1 committed after the rollback",
    )?;
    ensure!(node.status()?["version"] == "1.0.0");

    stage(&node, &mut boot, &mut vm, &v5, "5.0.0")?;
    let mut broken = vm.start()?;
    let reverted = broken.expect(
        &["upgrade reverted: the next boot is"],
        BOOT_TIMEOUT,
        "v5 reverted",
    )?;
    ensure!(reverted.contains("slate-1.0.0.efi"), "{reverted}");
    broken.wait_exit(Duration::from_secs(90))?;
    let boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "1.0.0" && status["last_failure"]["version"] == "5.0.0",
        "after v5: {status}"
    );
    ensure!(
        !boot.serial().contains("staged upgrade"),
        "the failed staged upgrade must not be tried again"
    );
    // v4 was pruned by v5's install and v5 failed: nothing left to go back to.
    let refused = node.refused(&["rollback"])?;
    ensure!(
        refused.contains("nothing to roll back to"),
        "slate rollback with nothing to go back to: {refused}"
    );
    Ok(format!(
        "v1 -> staged v4 (installed by the next boot before the OS, committed); `slate rollback` \
         -> v1 on trial, committed ({rolled_back}); staged broken v5 -> reverted to v1 and not \
         retried ({reverted}); a second rollback refused: nothing to roll back to"
    ))
}
