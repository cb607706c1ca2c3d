//! Broken upgrades come back by themselves. One node, installed straight as v2 (a disk image of
//! the demo profile: health checks and a watchdog), is upgraded offline to three broken v3s in
//! turn, and each time returns to v2 with nobody touching it:
//!
//! - (a) a health check that cannot pass: machined takes the fatal path, records the failure in
//!   META, reverts the upgrade and reboots;
//! - (b) init cannot start machined (`slate.init=/nonexistent`): nobody can revert, so
//!   systemd-boot's boot counting spends the tries (+3 → +2-1 → +1-2 → +0-3) and falls back;
//!   v2's commit records v3.0.2 as the last failure;
//! - (c) a Boot task hangs: the watchdog, armed by machined and never fed before a commit,
//!   resets the machine (QEMU exits under `-no-reboot`; the harness powers it on again), and
//!   boot counting falls back.
//!
//! The bundles are built while v2's first boot runs, and that boot is kept up past its watchdog
//! timeout: a committed node is fed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::{
    build_image, ensure_logged, esp_listing, offline_upgrade, running, Node, Prepared, BOOT_TIMEOUT,
};
use crate::util::{output, repo_root};
use crate::vm::{tail, Running, Vm};

const V2: &str = "2.0.0";
const HEALTH_FAILS: &str = "3.0.1";
const INIT_FAILS: &str = "3.0.2";
const HANGS: &str = "3.0.3";
/// Its web service listens on another port than its readiness check asks: never ready.
const WORKLOAD_FAILS: &str = "3.0.4";
/// (a): the API answers, but a file that never appears is required; 5 s to pass.
const MISSING: &str = "/nonexistent/ready";
/// (c): one try, and a watchdog short enough to keep the test quick.
const HANG_TRIES: u32 = 1;
const HANG_WATCHDOG_SECS: u32 = 10;

/// Profile text without its `[health]` (and `[[health.checks]]`) and `[watchdog]` sections.
pub(super) fn without_health(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let header = trimmed.trim_matches(|c| c == '[' || c == ']');
            skipping = header == "health" || header.starts_with("health.") || header == "watchdog";
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The demo profile with its `[health]` and `[watchdog]` sections replaced by `sections`. The
/// copy lives in the work directory and a profile's relative paths resolve against its own
/// directory, so the demo's (all `../…`) are made absolute.
pub(super) fn variant_profile(work: &Path, name: &str, sections: &str) -> Result<PathBuf> {
    let profiles = repo_root().join("profiles");
    let text = fs::read_to_string(profiles.join("demo.toml")).context("reading demo.toml")?;
    let absolute = format!("\"{}/../", profiles.display());
    let mut out = without_health(&text.replace("\"../", &absolute));
    out.push('\n');
    out.push_str(sections);
    let path = work.join(format!("{name}.toml"));
    fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `slate imager build` of any profile (quiet: it may run while a VM boots); installer bundles
/// are signed with the demo key, disk images get a machine configuration on STATE (the node is
/// named after the image file).
pub(super) fn build(
    slate: &Path,
    profile: &Path,
    kind: &str,
    version: &str,
    extra_args: &[&str],
    out: &Path,
) -> Result<()> {
    let mut cmd = Command::new(slate);
    cmd.args(["imager", "build", "--profile"])
        .arg(profile)
        .args(["--version", version, "--output", kind, "--out"])
        .arg(out)
        .arg("--cache")
        .arg(super::imager_cache())
        .env("SOURCE_DATE_EPOCH", "1700000000");
    for arg in super::FAILURE_KERNEL_ARGS.iter().chain(extra_args) {
        cmd.args(["--kernel-arg", arg]);
    }
    output(&mut cmd)?;
    match kind {
        "installer" => super::sign_bundle(slate, out)?,
        "image" => {
            let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("node");
            let config = super::node_config(slate, out.parent().unwrap_or(Path::new(".")), stem)?;
            super::configure_disk(slate, out, &config)?;
        }
        _ => {}
    }
    Ok(())
}

/// The four broken bundles.
fn build_broken_bundles(slate: &Path, work: &Path) -> Result<[PathBuf; 4]> {
    let demo = repo_root().join("profiles/demo.toml");
    let health = variant_profile(
        work,
        "rollback-health",
        &format!(
            "[health]\ntimeout_secs = 5\n[[health.checks]]\ntcp = \"127.0.0.1:50000\"\n\
             [[health.checks]]\nfile = \"{MISSING}\"\n\n[watchdog]\ntimeout_secs = 60\n"
        ),
    )?;
    let hang = variant_profile(
        work,
        "rollback-hang",
        &format!("[watchdog]\ntimeout_secs = {HANG_WATCHDOG_SECS}\n"),
    )?;
    // The demo's web service moved to port 8081 while its readiness check still asks 8080,
    // and the health checks require it within 20 s.
    let workload = variant_profile(
        work,
        "rollback-workload",
        "[health]\ntimeout_secs = 20\n[[health.checks]]\nservice = \"web\"\n\n\
         [watchdog]\ntimeout_secs = 60\n",
    )?;
    let text = fs::read_to_string(&workload)?;
    let moved = text.replace("\"-p\", \"8080\"", "\"-p\", \"8081\"");
    ensure!(moved != text, "the demo's web service listens on 8080");
    fs::write(&workload, moved)?;
    let out = |v: &str| work.join(format!("bundle-{v}"));
    build(
        slate,
        &workload,
        "installer",
        WORKLOAD_FAILS,
        &[],
        &out(WORKLOAD_FAILS),
    )?;
    build(
        slate,
        &health,
        "installer",
        HEALTH_FAILS,
        &[],
        &out(HEALTH_FAILS),
    )?;
    build(
        slate,
        &demo,
        "installer",
        INIT_FAILS,
        &["slate.init=/nonexistent"],
        &out(INIT_FAILS),
    )?;
    build(
        slate,
        &hang,
        "installer",
        HANGS,
        &["slate.debug.hang-task=network"],
        &out(HANGS),
    )?;
    Ok([
        out(HEALTH_FAILS),
        out(INIT_FAILS),
        out(HANGS),
        out(WORKLOAD_FAILS),
    ])
}

/// [`offline_upgrade`] giving the new entry `tries` boot-counting tries.
fn offline_upgrade_tries(slate: &Path, image: &Path, bundle: &Path, tries: u32) -> Result<String> {
    output(
        Command::new(slate)
            .args(["installer", "upgrade", "--disk"])
            .arg(image)
            .arg("--bundle")
            .arg(bundle)
            .arg("--trusted-keys")
            .arg(super::demo_keys())
            .args(["--tries", &tries.to_string()]),
    )
}

/// The ESP file name of `version`'s entry (`slate-3.0.2+1-2.efi`), if there is one.
fn entry(image: &Path, version: &str) -> Result<Option<String>> {
    let listing = esp_listing(image)?;
    let (counted, blessed) = (format!("slate-{version}+"), format!("slate-{version}.efi"));
    Ok(listing
        .lines()
        .filter_map(|l| l.trim().rsplit(['/', '\\']).next())
        .find(|n| n.starts_with(&counted) || *n == blessed)
        .map(str::to_string))
}

/// Power the committed v2 off over the API, once its commit (and the watchdog's feeding)
/// started, so the next upgrade is written to a powered-off disk.
fn power_off(boot: &mut Running, node: &Node<'_>) -> Result<()> {
    boot.expect(
        &["watchdog: committed"],
        Duration::from_secs(90),
        "v2 committed and its watchdog fed",
    )?;
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(90))
}

/// After a broken v3: v2 boots by itself, passes its checks and commits (dropping the marker
/// the failed upgrade left, if nobody could revert it). Returns the boot and its status.
fn back_on_v2(vm: &mut Vm, node: &Node<'_>) -> Result<(Running, serde_json::Value)> {
    let mut boot = running(vm)?;
    boot.expect(
        &["health: 4/4 checks passed"],
        Duration::from_secs(90),
        "v2's health checks",
    )?;
    let status = node.status()?;
    ensure!(status["version"] == V2, "back on v2: {status}");
    Ok((boot, status))
}

/// What machined said on a console line, without the kernel's timestamp and the prefix.
pub(super) fn said(line: &str) -> &str {
    line.split_once("[slate] [machined] ")
        .map(|(_, text)| text)
        .unwrap_or(line)
}

fn last_failure(status: &serde_json::Value) -> (String, String) {
    let failure = &status["last_failure"];
    (
        failure["version"].as_str().unwrap_or("none").to_string(),
        failure["reason"].as_str().unwrap_or("").to_string(),
    )
}

/// The scenario; see the module documentation.
pub(super) fn broken_upgrades_roll_back(prepared: &Prepared, work: &Path) -> Result<String> {
    let started = Instant::now();
    let slate = &prepared.slate;
    let image = work.join("rollback.raw");
    build_image(slate, V2, &[], &image)?;
    ensure!(
        entry(&image, V2)?.as_deref() == Some("slate-2.0.0+3.efi"),
        "a fresh v2 image"
    );

    // v2's first boot, with the broken bundles built meanwhile.
    let builder = {
        let (slate, work) = (slate.clone(), work.to_owned());
        std::thread::spawn(move || {
            let started = Instant::now();
            build_broken_bundles(&slate, &work).map(|bundles| (bundles, started.elapsed()))
        })
    };
    let mut vm = Vm::new(&image, &work.join("vm-rollback"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };
    let mut boot = running(&mut vm)?;
    let fed = boot.expect(
        &["watchdog: committed"],
        Duration::from_secs(90),
        "v2 committed and its watchdog fed",
    )?;
    let fed_since = Instant::now();
    ensure_logged(&boot, "health: 4/4 checks passed")?;
    ensure_logged(
        &boot,
        "committed: slate-2.0.0+2-1.efi blessed as slate-2.0.0.efi",
    )?;
    let armed = boot.expect(&["watchdog armed:"], Duration::ZERO, "the watchdog armed")?;
    let timeout: u64 = armed
        .split("watchdog armed: /dev/watchdog, ")
        .nth(1)
        .and_then(|r| r.split('s').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("the armed line names its timeout: {armed}"))?;
    let (bundles, built_in) = builder
        .join()
        .map_err(|_| anyhow::anyhow!("the bundle builder panicked"))??;
    // The watchdog was armed before the commit: once its timeout has passed since the commit,
    // only the feeding keeps this boot alive.
    let outlive = Duration::from_secs(timeout + 5);
    std::thread::sleep(outlive.saturating_sub(fed_since.elapsed()));
    ensure!(
        boot.is_running(),
        "the committed node was reset although fed; console:\n{}",
        tail(&boot.serial(), 30)
    );
    ensure!(node.status()?["stage"] == "Running");
    println!(
        "  v2 (image): {}; {}; still up {:.0?} after its commit; the 4 broken bundles built \
         meanwhile in {built_in:.0?}",
        said(&armed),
        said(&fed),
        fed_since.elapsed()
    );
    power_off(&mut boot, &node)?;
    let [health_bundle, init_bundle, hang_bundle, workload_bundle] = bundles;

    // (a) A health check that cannot pass: machined records it, reverts, reboots.
    let variant = Instant::now();
    let installed = offline_upgrade(slate, &image, &health_bundle)?;
    ensure!(
        installed.contains("installed slate-3.0.1+3.efi (fallback slate-2.0.0.efi"),
        "{installed}"
    );
    let mut boot = vm.start()?;
    let fatal = boot.expect(
        &["[slate] [machined] fatal:"],
        BOOT_TIMEOUT,
        "v3.0.1's health check failing",
    )?;
    ensure!(
        fatal.contains(&format!(
            "health check `file {MISSING}` failed: {MISSING} does not exist"
        )),
        "the fatal line names the check: {fatal}"
    );
    let reverted = boot.expect(
        &["upgrade reverted: the next boot is"],
        Duration::from_secs(30),
        "the revert",
    )?;
    ensure!(reverted.contains("slate-2.0.0.efi"), "{reverted}");
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&boot, "health: `tcp 127.0.0.1:50000` passed")?;
    ensure!(
        !boot.serial().contains("watchdog: committed"),
        "nothing feeds the watchdog before a commit"
    );
    let bad = entry(&image, HEALTH_FAILS)?;
    ensure!(
        bad.as_deref() == Some("slate-3.0.1+0-1.efi"),
        "v3.0.1 marked bad: {bad:?}"
    );
    let (mut boot, status) = back_on_v2(&mut vm, &node)?;
    let (failed_version, reason) = last_failure(&status);
    ensure!(
        failed_version == HEALTH_FAILS
            && reason.contains(&format!("health check `file {MISSING}` failed")),
        "status names the failed version and why: {status}"
    );
    println!(
        "  (a) health check fails: {}; {}; {} on the ESP; back on {V2} in {:.0?}, status \
         last_failure {failed_version}: {reason}",
        said(&fatal),
        said(&reverted),
        bad.unwrap_or_default(),
        variant.elapsed()
    );
    power_off(&mut boot, &node)?;

    // (b) init cannot start machined: only boot counting can help.
    let variant = Instant::now();
    let installed = offline_upgrade(slate, &image, &init_bundle)?;
    ensure!(
        installed.contains("installed slate-3.0.2+3.efi"),
        "{installed}"
    );
    let mut names = vec![entry(&image, INIT_FAILS)?.unwrap_or_default()];
    for attempt in 1..=3 {
        let mut boot = vm.start()?;
        boot.expect(
            &["[slate] [initramfs] rebooting in"],
            BOOT_TIMEOUT,
            &format!("v3.0.2's init failing (try {attempt})"),
        )?;
        ensure_logged(&boot, "slate.init=/nonexistent")?;
        boot.wait_exit(Duration::from_secs(90))?;
        ensure!(
            !boot.serial().contains("[slate] [machined]"),
            "machined never starts in v3.0.2"
        );
        names.push(entry(&image, INIT_FAILS)?.unwrap_or_default());
    }
    ensure!(
        names
            == [
                "slate-3.0.2+3.efi",
                "slate-3.0.2+2-1.efi",
                "slate-3.0.2+1-2.efi",
                "slate-3.0.2+0-3.efi"
            ],
        "boot counting spends the tries: {names:?}"
    );
    let (mut boot, _) = back_on_v2(&mut vm, &node)?;
    let dropped = boot.expect(
        &["committed: slate-2.0.0.efi"],
        Duration::from_secs(60),
        "v2 committed, dropping the failed upgrade's marker",
    )?;
    ensure!(
        dropped.contains("upgrade marker (fallback slate-2.0.0.efi) dropped"),
        "{dropped}"
    );
    // Nothing of v3.0.2 ran to record its failure: v2's commit does (issue 44), after the
    // status `back_on_v2` read.
    boot.expect(
        &["rollback recorded: 3.0.2 -> 2.0.0"],
        Duration::from_secs(30),
        "v2's commit recording v3.0.2's failure",
    )?;
    let status = node.status()?;
    let (failed_version, reason) = last_failure(&status);
    ensure!(
        failed_version == INIT_FAILS && reason.contains("did not come up in its boot tries"),
        "v2's commit records v3.0.2's failure: {status}"
    );
    println!(
        "  (b) init cannot exec machined (slate.init=/nonexistent): {}; back on {V2} in {:.0?}, \
         {} (recorded by v2's commit: last_failure {failed_version}: {reason})",
        names.join(" -> "),
        variant.elapsed(),
        said(&dropped)
    );
    power_off(&mut boot, &node)?;

    // (c) A hang before the commit: the watchdog resets the machine.
    let variant = Instant::now();
    let installed = offline_upgrade_tries(slate, &image, &hang_bundle, HANG_TRIES)?;
    ensure!(
        installed.contains("installed slate-3.0.3+1.efi"),
        "{installed}"
    );
    let mut boot = vm.start()?;
    let armed = boot.expect(&["watchdog armed:"], BOOT_TIMEOUT, "v3.0.3 arming")?;
    ensure!(
        armed.contains(&format!("/dev/watchdog, {HANG_WATCHDOG_SECS}s")),
        "{armed}"
    );
    boot.expect(
        &["fault injected by slate.debug.hang-task=network"],
        Duration::from_secs(60),
        "v3.0.3 hanging",
    )?;
    let hung = Instant::now();
    boot.wait_exit(Duration::from_secs(u64::from(HANG_WATCHDOG_SECS) + 90))?;
    let reset_after = hung.elapsed();
    let serial = boot.serial();
    ensure!(
        !serial.contains("reboot: Restarting system") && !serial.contains("rebooting"),
        "nothing rebooted v3.0.3 but the watchdog:\n{}",
        tail(&serial, 20)
    );
    let bad = entry(&image, HANGS)?;
    ensure!(
        bad.as_deref() == Some("slate-3.0.3+0-1.efi"),
        "v3.0.3's only try spent: {bad:?}"
    );
    let (mut boot, _) = back_on_v2(&mut vm, &node)?;
    boot.expect(
        &["upgrade marker (fallback slate-2.0.0.efi) dropped"],
        Duration::from_secs(60),
        "v2 committed, dropping the hung upgrade's marker",
    )?;
    println!(
        "  (c) slate.debug.hang-task=network (installer upgrade --tries {HANG_TRIES}, \
         {HANG_WATCHDOG_SECS}s watchdog): {}; reset by the watchdog {reset_after:.0?} after the \
         hang (no reboot logged), {} on the ESP; back on {V2} in {:.0?}",
        said(&armed),
        bad.unwrap_or_default(),
        variant.elapsed()
    );
    power_off(&mut boot, &node)?;

    // (d) The workload never becomes ready: the version is not committed, machined reverts.
    let variant = Instant::now();
    let installed = offline_upgrade(slate, &image, &workload_bundle)?;
    ensure!(
        installed.contains("installed slate-3.0.4+3.efi (fallback slate-2.0.0.efi"),
        "{installed}"
    );
    let mut boot = vm.start()?;
    let fatal = boot.expect(
        &["[slate] [machined] fatal:"],
        BOOT_TIMEOUT,
        "v3.0.4's web service never ready",
    )?;
    ensure!(
        fatal.contains("health check `service web` failed: service web is not ready"),
        "the fatal line names the service: {fatal}"
    );
    let reverted = boot.expect(
        &["upgrade reverted: the next boot is"],
        Duration::from_secs(30),
        "the revert",
    )?;
    ensure!(reverted.contains("slate-2.0.0.efi"), "{reverted}");
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&boot, "service web: started, pid")?;
    // The fatal path stops the services as a drain does, before its teardown kills the rest.
    let (stopping, stopped) = super::workload::drained(&boot.serial(), "the boot failed")?;
    let (mut boot, status) = back_on_v2(&mut vm, &node)?;
    let (failed_version, reason) = last_failure(&status);
    ensure!(
        failed_version == WORKLOAD_FAILS && reason.contains("health check `service web` failed"),
        "status names the version whose workload failed: {status}"
    );
    let web = super::workload::serves_version(vm.web_port, V2)?;
    println!(
        "  (d) web service never ready (port 8081, checked on 8080): {}; {}; `{stopping}`, \
         `{stopped}`; back on {V2} in {:.0?}, {web}",
        said(&fatal),
        said(&reverted),
        variant.elapsed()
    );
    boot.kill();
    Ok(format!(
        "v2 fed past its watchdog; health-check failure reverted by machined, init failure and \
         hang (watchdog reset) returned by boot counting, a workload never ready reverted by \
         machined; back on {V2} each time, unattended, in {:.0?}",
        started.elapsed()
    ))
}
