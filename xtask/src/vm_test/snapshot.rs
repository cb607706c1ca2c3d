//! The Btrfs snapshot engine on a slate node (issue 15): one VM booted from
//! `slate imager build --output btrfs-image`, upgraded four times through
//! `slate snapshot upgrade --node … --command … --reboot`.
//!
//! 1. v1 boots from `root-<ts>` (slate's init mounts `root=UUID=… rootflags=subvol=…`); its
//!    entry was blessed by the imager.
//! 2. v2: a command changes /usr and the version, and adds a setup hook that appends the
//!    version to `/home/boots.log` and prints the file. It boots once on trial and is
//!    committed after the health checks (its entry loses its counter).
//! 3. v3's command removes the file a health check needs: the check fails, machined rolls
//!    back (the previous snapshot boots next, v3's entry is marked bad) and reboots; v2 runs.
//! 4. v4's command overwrites its initramfs: the kernel cannot mount its root and panics;
//!    after three tries systemd-boot starts v2 again, unattended.
//! 5. v5's command makes the boot hang (a health check that never passes, with a 20 s
//!    watchdog), and it is registered with `--tries 1`: the watchdog resets it once, then v2
//!    again. (Three tries are step 4's; one here saves two hung boots of CI time.)
//! 6. v6, a good one: committed, and the pool is pruned to three snapshots. Each upgrade
//!    pruned the bad snapshots first, so v1, v2 and v6 remain.
//!
//! /home is the `@home` subvolume, outside every snapshot: v6 finds the lines written by v3
//! and v5, which were rolled back.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::{configure_disk, node_config, running, Node, Prepared, BOOT_TIMEOUT};
use crate::util::{output, repo_root};
use crate::vm::{tail, Running, Vm};

/// `SOURCE_DATE_EPOCH` 1700000000 names the image's first snapshot.
pub(super) const FIRST_SNAPSHOT: &str = "root-20231114-221320";

/// The command that makes a snapshot version `version` (and keeps the /home hook in it).
pub(super) fn set_version(version: &str) -> String {
    format!(
        "sed -i -e 's/^IMAGE_VERSION=.*/IMAGE_VERSION={version}/' \
         -e 's/^VERSION_ID=.*/VERSION_ID={version}/' \
         -e 's/^PRETTY_NAME=.*/PRETTY_NAME=\"slate {version} (btrfs)\"/' /etc/os-release \
         && echo {version} > /usr/share/slate-snapshot-version"
    )
}

/// v2's addition: a setup hook recording the version in /home whenever the hooks are due (the
/// record of the last version they ran for is on `@state`: a return to an older snapshot runs
/// them again). `sync`, or a watchdog reset would lose the line.
const HOME_HOOK: &str = "printf '#!/bin/sh\\n. /etc/os-release\\n\
    echo \"$VERSION_ID\" >> /home/boots.log && sync\\n\
    echo \"setup: /home/boots.log: $(tr \"\\\\n\" \" \" < /home/boots.log)\"\\n' \
    > /usr/lib/slate/setup.d/30-home && chmod 755 /usr/lib/slate/setup.d/30-home";

/// A command that makes the new snapshot hang before its commit: a health check that never
/// passes (600 s to give up) and a 20 s hardware watchdog, fed only from the commit on.
pub(super) const HANG: &str = "printf '[health]\\ntimeout_secs = 600\\n[[health.checks]]\\n\
    file = \"/nonexistent\"\\n[watchdog]\\ntimeout_secs = 20\\n\
    device = \"/dev/watchdog\"\\n' > /etc/slate/node.toml";

/// What machined prints when it arms [`HANG`]'s watchdog.
pub(super) const WATCHDOG_ARMED: &str =
    "watchdog armed: /dev/watchdog, 20s (fed from the commit on)";

pub(super) fn snapshot_list(node: &Node) -> Result<serde_json::Value> {
    let text = node.ok(&["snapshot", "list", "--output", "json"])?;
    serde_json::from_str(&text).with_context(|| format!("snapshot list: {text}"))
}

/// `slate snapshot upgrade --node … --command CMD --reboot`; the new snapshot's name.
pub(super) fn upgrade(node: &Node, boot: &mut Running, command: &str) -> Result<String> {
    upgrade_with(node, boot, command, &[]).map(|(name, _)| name)
}

/// [`upgrade`] with more arguments; the new snapshot's name and what the node answered.
fn upgrade_with(
    node: &Node,
    boot: &mut Running,
    command: &str,
    more: &[&str],
) -> Result<(String, String)> {
    let mut args = vec!["snapshot", "upgrade", "--command", command, "--reboot"];
    args.extend_from_slice(more);
    let said = node.ok(&args)?;
    for line in said.lines() {
        println!("    | {line}");
    }
    ensure!(
        said.contains("(4) register: ") && said.contains("(5) manifest: "),
        "snapshot upgrade printed:\n{said}"
    );
    let name = said
        .lines()
        .find_map(|l| l.split("is rebooting into ").nth(1))
        .map(|n| n.trim().to_owned())
        .with_context(|| format!("no new snapshot named in:\n{said}"))?;
    boot.wait_exit(Duration::from_secs(120))
        .context("the node rebooting after the upgrade")?;
    Ok((name, said))
}

pub(super) fn state_of<'a>(listing: &'a serde_json::Value, snapshot: &str) -> Option<&'a str> {
    listing["snapshots"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == snapshot)
        .and_then(|s| s["state"].as_str())
}

/// Boots until one is not on `snapshot`: each boot on it must end by itself (a panic's reboot,
/// the watchdog's reset) with `sign` on its console, `expected` times — its tries — and the
/// next boot, on another snapshot, reaches Running. Returns that boot and what was seen.
fn failed_tries(
    vm: &mut Vm,
    snapshot: &str,
    sign: &str,
    expected: usize,
) -> Result<(Running, String)> {
    let mut tries = Vec::new();
    loop {
        let mut boot = vm.start()?;
        // Which snapshot this boot is on: the kernel prints its command line.
        let cmdline = boot.expect(
            &["Kernel command line: "],
            BOOT_TIMEOUT,
            "the kernel starting",
        )?;
        if !cmdline.contains(&format!("subvol={snapshot} ")) {
            boot.expect(&[super::RUNNING], BOOT_TIMEOUT, "the fallback snapshot")?;
            ensure!(
                tries.len() == expected,
                "{snapshot} used {} tries, not {expected}",
                tries.len()
            );
            return Ok((
                boot,
                format!(
                    "{} failed {} ({})",
                    tries.len(),
                    if tries.len() == 1 { "try" } else { "tries" },
                    tries.join(", ")
                ),
            ));
        }
        ensure!(
            tries.len() < expected,
            "{snapshot} booted again after {expected} failed tries"
        );
        boot.wait_exit(Duration::from_secs(180))
            .with_context(|| format!("try {} of {snapshot} ending by itself", tries.len() + 1))?;
        let serial = boot.serial();
        ensure!(
            serial.contains(sign) && !serial.contains(&format!("committed: snapshot {snapshot}")),
            "try {} of {snapshot}: {sign:?} expected, and no commit:\n{}",
            tries.len() + 1,
            tail(&serial, 30)
        );
        tries.push(format!("{:.0} s", boot.elapsed().as_secs_f64()));
    }
}

/// Builds a btrfs-image of `profile` at version 1.0.0 and puts `config` on it. One at a time
/// across scenarios: the pool's UUID comes from the image id (name and version), and
/// mkfs.btrfs refuses a UUID that a loop device of the other scenario's build still carries.
pub(super) fn build_configured_btrfs_image(
    slate: &Path,
    profile: &Path,
    image: &Path,
    config: &Path,
) -> Result<()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    output(
        Command::new(slate)
            .args(["imager", "build", "--profile"])
            .arg(profile)
            .args(["--version", "1.0.0", "--output", "btrfs-image", "--out"])
            .arg(image)
            .args(
                super::FAILURE_KERNEL_ARGS
                    .iter()
                    .flat_map(|a| ["--kernel-arg", a]),
            )
            .arg("--cache")
            .arg(super::imager_cache())
            .env("SOURCE_DATE_EPOCH", "1700000000"),
    )?;
    configure_disk(slate, image, config)
}

/// The scenario; see the module documentation.
pub(super) fn btrfs_snapshot_upgrades(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let image = work.join("btrfs.raw");
    build_configured_btrfs_image(
        slate,
        &repo_root().join("profiles/demo-btrfs.toml"),
        &image,
        &node_config(slate, work, "btrfs-node")?,
    )?;
    let mut vm = Vm::new(&image, &work.join("vm"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "btrfs-node".into(),
    };
    let mut lines = Vec::new();

    // 1. v1 from the image's first snapshot.
    let mut boot = running(&mut vm)?;
    boot.expect(
        &[&format!("snapshot {FIRST_SNAPSHOT} was committed already")],
        Duration::from_secs(60),
        "v1 settled by the snapshot engine",
    )?;
    let serial = boot.serial();
    ensure!(
        serial.contains(&format!("subvol={FIRST_SNAPSHOT}, rw)")),
        "init mounted the snapshot root:\n{}",
        tail(&serial, 40)
    );
    ensure!(
        node.status()?["version"] == "1.0.0",
        "v1 runs: {}",
        node.status()?
    );

    // 2. v2: changed /usr and version, on trial, committed after its health checks.
    let v2 = upgrade(
        &node,
        &mut boot,
        &format!("{} && {HOME_HOOK}", set_version("2.0.0")),
    )?;
    let mut boot = running(&mut vm)?;
    let committed = boot.expect(
        &[&format!(
            "committed: snapshot {v2} (loader/entries/{v2}+2-1.conf -> {v2}.conf)"
        )],
        Duration::from_secs(60),
        "v2 committed",
    )?;
    lines.push(committed);
    let status = node.status()?;
    ensure!(status["version"] == "2.0.0", "v2 runs: {status}");
    let listing = snapshot_list(&node)?;
    ensure!(
        listing["running"] == v2.as_str() && state_of(&listing, &v2) == Some("good"),
        "v2 running and good: {listing}"
    );

    // 3. v3 fails its health check: rolled back by machined, v2 again.
    let v3 = upgrade(
        &node,
        &mut boot,
        &format!("{} && rm /usr/lib/slate/healthy", set_version("3.0.0")),
    )?;
    let mut boot = vm.start()?;
    let reverted = boot.expect(
        &[&format!("snapshot reverted: {v3} failed its boot")],
        BOOT_TIMEOUT + Duration::from_secs(60),
        "v3 rolled back after its failed health check",
    )?;
    lines.push(reverted);
    ensure!(
        boot.serial()
            .contains("health check `file /usr/lib/slate/healthy` failed"),
        "the failed check named:\n{}",
        tail(&boot.serial(), 30)
    );
    boot.wait_exit(Duration::from_secs(60))?;
    let mut boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(status["version"] == "2.0.0", "back on v2: {status}");

    // 4. v4's initramfs is garbage: the kernel cannot mount its root and panics (panic=1, the scenarios' FAILURE_KERNEL_ARGS),
    // three times, then systemd-boot starts v2 again.
    let v4 = upgrade(
        &node,
        &mut boot,
        &format!(
            "{} && for f in /boot/initrd.img-*; do echo garbage > \"$f\"; done",
            set_version("4.0.0")
        ),
    )?;
    let (mut boot, panics) = failed_tries(&mut vm, &v4, "VFS: Unable to mount root", 3)?;
    lines.push(format!("v4: {panics}"));
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0",
        "back on v2 after the kernel failure: {status}"
    );
    let listing = snapshot_list(&node)?;
    ensure!(
        state_of(&listing, &v4) == Some("bad"),
        "v4's entry is bad after three tries: {listing}"
    );

    // 5. v5 hangs before its commit, with one try: the watchdog and boot counting bring v2
    // back after a single reset.
    let (v5, said) = upgrade_with(
        &node,
        &mut boot,
        &format!("{} && {HANG}", set_version("5.0.0")),
        &["--tries", "1"],
    )?;
    ensure!(
        said.contains(&format!("loader/entries/{v5}+1.conf"))
            && said.contains("1 failed try make it bad"),
        "v5 registered with one try:\n{said}"
    );
    let (mut boot, hangs) = failed_tries(&mut vm, &v5, WATCHDOG_ARMED, 1)?;
    lines.push(format!("v5: {hangs}"));
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0",
        "back on v2 after the hang: {status}"
    );
    let listing = snapshot_list(&node)?;
    ensure!(
        state_of(&listing, &v5) == Some("bad") && state_of(&listing, &v4).is_none(),
        "v5's entry is bad after its one try; v5's upgrade pruned bad v4 first: {listing}"
    );

    // 6. v6, good: committed; three snapshots remain; /home kept every version's line.
    let v6 = upgrade(&node, &mut boot, &set_version("6.0.0"))?;
    let mut boot = running(&mut vm)?;
    boot.expect(
        &[&format!("committed: snapshot {v6}")],
        Duration::from_secs(60),
        "v6 committed",
    )?;
    let home = boot.expect(
        &["setup: /home/boots.log: "],
        Duration::from_secs(5),
        "the /home hook",
    )?;
    // v3 and v5 wrote their lines before they were rolled back (v4 never reached its setup
    // hooks): /home is the same through every snapshot.
    let versions: Vec<&str> = home
        .split("boots.log: ")
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        versions.first() == Some(&"2.0.0")
            && versions.contains(&"3.0.0")
            && versions.contains(&"5.0.0")
            && !versions.contains(&"4.0.0")
            && versions.last() == Some(&"6.0.0"),
        "/home kept the lines of the rolled-back versions: {home}"
    );
    let listing = snapshot_list(&node)?;
    let mut names: Vec<&str> = listing["snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .collect();
    names.sort_unstable();
    // Each upgrade pruned the bad snapshot before any good one: v1 (the image's), v2, v6.
    ensure!(
        names == [FIRST_SNAPSHOT, v2.as_str(), v6.as_str()] && listing["running"] == v6.as_str(),
        "three snapshots after five upgrades, the bad ones pruned first, v6 running: {listing}"
    );
    lines.push(home.trim().to_owned());
    Ok(format!(
        "v2 {v2} committed; v3 {v3} health check failed → reverted; v4 {v4} kernel failed → \
         3 tries → v2; v5 {v5} (--tries 1) hung → 1 watchdog reset → v2; v6 {v6} committed; snapshots \
         {names:?}; {}",
        lines.join(" | ")
    ))
}
