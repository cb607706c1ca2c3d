//! Staged upgrades: `slate upgrade --stage` records the bundle in META and reboots; the next
//! boot's Install sequence consumes the tags (deleted and flushed first), runs the bundle's own
//! installer before the OS comes up, and reboots into the new version. A staged upgrade to a
//! broken version returns to the previous one and is not tried again. `slate rollback` returns
//! to the previous version by hand, on trial. Every step is followed by the CLI's `--wait`
//! across the reboots (the harness powers the VM on again as each reboot ends QEMU), and a
//! pinned v1 outlives three upgrades that prune by `keep_versions`.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};

use super::{build_bundle, build_image, ensure_logged, running, Node, Prepared, BOOT_TIMEOUT};
use crate::vm::{Running, Vm};

/// `slate upgrade --stage`, then the staged boot that installs and reboots.
pub(super) fn stage(
    node: &Node,
    boot: &mut Running,
    vm: &mut Vm,
    bundle: &Path,
    version: &str,
    more: &[&str],
) -> Result<String> {
    let image = format!("oci-layout:{}", bundle.display());
    let mut args = vec!["upgrade", "--stage", "--image", &image];
    args.extend_from_slice(more);
    let answer = node.ok(&args)?;
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
    let installed = staged.expect(
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
    Ok(installed)
}

/// Runs `slate ARGS` (a `--wait`) beside the VM, powering the VM on again after each guest
/// reboot (`-no-reboot` ends QEMU), until the command ends; its output and the boot left running.
fn waiting(
    node: &Node,
    vm: &mut Vm,
    mut boot: Running,
    args: &[&str],
) -> Result<(std::process::Output, Running)> {
    let mut child = node
        .command(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running slate {args:?}"))?;
    let started = std::time::Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if !boot.is_running() {
            boot = vm.start()?;
        }
        if started.elapsed() > WAIT_LIMIT {
            let _ = child.kill();
            anyhow::bail!(
                "slate {args:?} still waiting after {WAIT_LIMIT:?}; the console ended with:\n{}",
                crate::vm::tail(&boot.serial(), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = child.wait_with_output()?;
    Ok((out, boot))
}

/// What a replacement must show on the node it replaced: new data partitions (a new
/// machine-id, a serving certificate issued anew for a new key) under the same configuration
/// (same node name and hostname, the same client certificates still accepted — `status` is
/// asked with them), and the console lines of the wipe and the restore.
fn replaced(node: &Node, boot: &Running, before: &serde_json::Value) -> Result<String> {
    let after = node.status()?;
    let serial = boot.serial();
    let wanted = [
        "this is the first boot of the replacement by 2.0.0",
        ") wiped", // "STATE (/dev/vda5) wiped"
        "is blank: formatting it (first boot)",
        "replaced: STATE and EPHEMERAL formatted afresh, the machine configuration restored",
        "API identity: serving certificate sha256",
    ];
    for line in wanted {
        ensure!(
            serial.contains(line),
            "the replacement's boot must print {line:?}; the console ended with:\n{}",
            crate::vm::tail(&serial, 40)
        );
    }
    let identity = serial
        .lines()
        .find(|l| l.contains("API identity: serving certificate sha256"))
        .unwrap_or_default();
    ensure!(
        identity.ends_with("(issued now)"),
        "a fresh STATE has no node key: the certificate is issued anew: {identity}"
    );
    ensure!(
        after["version"] == "2.0.0"
            && after["node_name"] == before["node_name"]
            && after["hostname"] == before["hostname"]
            && after["machine_id"].is_string()
            && after["machine_id"] != before["machine_id"],
        "after the replacement: same name and hostname, a new machine-id:\nbefore {before}\n\
         after {after}"
    );
    Ok(format!(
        "replaced: machine-id {} -> {}, node {} kept; {}",
        before["machine_id"].as_str().unwrap_or("?"),
        after["machine_id"].as_str().unwrap_or("?"),
        after["node_name"].as_str().unwrap_or("?"),
        identity.trim()
    ))
}

/// Longer than any --wait below needs under TCG on a loaded machine (three boots).
const WAIT_LIMIT: Duration = Duration::from_secs(900);

/// The `--output json` lines' `event` names, in order.
fn events(stdout: &[u8]) -> Result<Vec<String>> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).with_context(|| l.to_owned())?;
            Ok(v["event"].as_str().unwrap_or("?").to_owned())
        })
        .collect()
}

/// The ESP's entries as the node explains them: (name, pinned).
fn entries(node: &Node) -> Result<Vec<(String, bool)>> {
    let explained: serde_json::Value =
        serde_json::from_str(&node.ok(&["boot", "explain", "--output", "json"])?)?;
    Ok(explained["entries"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or("?").to_owned(),
                        e["pinned"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The file `upgrade --check` must report added, and the one it must report changed.
const CHECK_ADDED: &str = "usr/share/udhcpc/added-for-check.txt";
const CHECK_CHANGED: &str = "usr/share/udhcpc/default.script";

/// An installer bundle of `version` whose root differs from the demo's by exactly one added
/// file and one changed file (besides `/etc/os-release`, which names the version), for
/// `upgrade --check` to find.
fn build_check_bundle(slate: &Path, work: &Path, version: &str, out: &Path) -> Result<()> {
    let base = crate::util::repo_root().join("target/demo/rootfs");
    let root = work.join("rootfs-check");
    let _ = std::fs::remove_dir_all(&root);
    crate::util::run(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&base)
            .arg(&root),
    )?;
    let added = root.join(CHECK_ADDED);
    std::fs::create_dir_all(added.parent().unwrap_or(&root))?;
    std::fs::write(&added, "added for upgrade --check\n")?;
    let changed = root.join(CHECK_CHANGED);
    let mut text = std::fs::read_to_string(&changed)
        .with_context(|| format!("reading {}", changed.display()))?;
    text.push_str("# changed for upgrade --check\n");
    std::fs::write(&changed, text)?;
    let demo = crate::util::repo_root().join("profiles/demo.toml");
    let profile_text = std::fs::read_to_string(&demo).context("reading demo.toml")?;
    let absolute = format!("\"{}/../", demo.parent().unwrap_or(&root).display());
    let profile_text = profile_text
        .replace(
            "\"../target/demo/rootfs\"",
            &format!("{:?}", root.display().to_string()),
        )
        .replace("\"../", &absolute);
    let profile = work.join("check.toml");
    std::fs::write(&profile, profile_text)?;
    super::rollback::build(slate, &profile, "installer", version, &[], out)
}

pub(super) fn staged_upgrades(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("staged.raw");
    build_image(&prepared.slate, "1.0.0", &[], &image)?;
    let (v2, v4, v5) = (
        work.join("bundle-staged-v2"),
        work.join("bundle-staged-v4"),
        work.join("bundle-staged-v5"),
    );
    build_check_bundle(&prepared.slate, work, "2.0.0", &v2)?;
    build_bundle(&prepared.slate, "4.0.0", &[], &v4)?;
    build_bundle(
        &prepared.slate,
        "5.0.0",
        &["slate.debug.fail-task=network"],
        &v5,
    )?;
    let layout = |dir: &Path| format!("oci-layout:{}", dir.display());
    let mut vm = Vm::new(&image, &work.join("vm-staged"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };
    let mut lines = Vec::new();

    // v1 pinned: it must outlive the upgrades below, which prune by keep_versions = 2.
    let boot = running(&mut vm)?;
    let refused = node.refused(&["pin", "9.9.9"])?;
    ensure!(
        refused.contains("no UKI of version 9.9.9 is on the ESP"),
        "slate pin 9.9.9: {refused}"
    );
    let pinned = node.ok(&["pin", "1.0.0"])?;
    ensure!(
        pinned.contains("pinned 1.0.0; pinned: 1.0.0"),
        "slate pin: {pinned}"
    );
    lines.push(format!("$ slate pin 1.0.0\n{}", pinned.trim()));

    // What v2 would change, asked of the node: nothing written, nothing uploaded.
    let v2_ref = layout(&v2);
    let check = node.ok(&["upgrade", "--check", "--output", "json", "--image", &v2_ref])?;
    let diff: serde_json::Value =
        serde_json::from_str(&check).with_context(|| format!("upgrade --check: {check}"))?;
    let paths = |list: &str| -> Vec<String> {
        diff["rootfs"][list]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e["path"].as_str().unwrap_or("?").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (added, removed, mut changed) = (paths("added"), paths("removed"), paths("changed"));
    changed.sort();
    let expected_changed = ["/etc/os-release".to_owned(), format!("/{CHECK_CHANGED}")];
    // The directory holding the new file may count as changed (its size), nothing else.
    changed.retain(|p| p != "/usr/share/udhcpc");
    ensure!(
        added == [format!("/{CHECK_ADDED}")]
            && removed.is_empty()
            && changed == expected_changed
            && diff["version"]["old"] == "1.0.0"
            && diff["version"]["new"] == "2.0.0",
        "upgrade --check must list exactly one added and one changed file: added {added:?}, \
         removed {removed:?}, changed {changed:?}\n{check}"
    );
    ensure!(
        node.status()?["version"] == "1.0.0",
        "--check changed nothing"
    );
    let text = node.ok(&["upgrade", "--check", "--image", &v2_ref])?;
    lines.push(format!(
        "$ slate upgrade --check --image …v2\n{}",
        text.trim()
    ));

    // An immediate upgrade by replacement, followed to its commit: v2 starts from fresh data
    // partitions with the node's configuration put back.
    let before = node.status()?;
    let args = [
        "upgrade",
        "--replace",
        "--wait",
        "--output",
        "json",
        "--image",
        &v2_ref,
    ];
    let (out, boot) = waiting(&node, &mut vm, boot, &args)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "upgrade --wait to v2: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = events(&out.stdout)?;
    ensure!(
        seen == [
            "uploaded",
            "verified",
            "accepted",
            "rebooting",
            "booted",
            "committed"
        ] || seen
            == [
                "uploaded",
                "verified",
                "accepted",
                "installing",
                "rebooting",
                "booted",
                "committed"
            ],
        "upgrade --wait to v2: events {seen:?}\n{stdout}"
    );
    ensure!(
        stdout.contains(r#""event":"committed","version":"2.0.0""#),
        "{stdout}"
    );
    lines.push(format!(
        "$ slate upgrade --replace --wait --output json --image …v2\n{}",
        stdout.trim()
    ));
    lines.push(replaced(&node, &boot, &before)?);

    // A staged upgrade, followed across the staged boot that installs it, to its commit.
    let v4_ref = layout(&v4);
    let args = ["upgrade", "--stage", "--wait", "--image", &v4_ref];
    let (out, boot) = waiting(&node, &mut vm, boot, &args)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success() && stdout.contains("committed 4.0.0 in"),
        "upgrade --stage --wait to v4: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure_logged(&boot, "committed: slate-4.0.0")?;
    ensure!(node.status()?["version"] == "4.0.0");
    lines.push(format!(
        "$ slate upgrade --stage --wait --image …v4\n{}",
        stdout.trim()
    ));

    // A staged broken v5: the command follows it until the node is back on v4, and fails
    // naming why.
    let v5_ref = layout(&v5);
    let args = ["upgrade", "--stage", "--wait", "--image", &v5_ref];
    let (out, boot) = waiting(&node, &mut vm, boot, &args)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        !out.status.success()
            && stderr.contains("rolled back to 4.0.0: 5.0.0:")
            && stderr.contains("network"),
        "upgrade --stage --wait to the broken v5 must fail naming why: {stdout}{stderr}"
    );
    let status = node.status()?;
    ensure!(
        status["version"] == "4.0.0"
            && status["last_rollback"]["from"] == "5.0.0"
            && status["last_rollback"]["to"] == "4.0.0"
            && status["committed"] == true,
        "after v5: {status}"
    );
    lines.push(format!(
        "$ slate upgrade --stage --wait --image …v5  (exit {})\n{}\n{}",
        out.status.code().unwrap_or(-1),
        stdout.trim_end(),
        stderr.trim_end()
    ));
    ensure!(
        !boot.serial().contains("staged upgrade"),
        "the failed staged upgrade must not be tried again"
    );
    // Three upgrades later (v2, v4, v5), the pinned v1 is still there, v2 was pruned.
    let on_esp = entries(&node)?;
    ensure!(
        on_esp
            .iter()
            .any(|(n, pinned)| n.starts_with("slate-1.0.0") && *pinned)
            && !on_esp.iter().any(|(n, _)| n.starts_with("slate-2.0.0")),
        "after three upgrades with v1 pinned: {on_esp:?}"
    );

    // Back to the pinned v1 by hand: a dry run first, then the rollback, followed to its commit.
    let dry = node.ok(&["rollback", "--dry-run"])?;
    ensure!(
        dry.contains("would roll back") && dry.contains("slate-1.0.0+3.efi"),
        "slate rollback --dry-run: {dry}"
    );
    let (out, boot) = waiting(&node, &mut vm, boot, &["rollback", "--wait"])?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success() && stdout.contains("committed 1.0.0 in"),
        "rollback --wait: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure_logged(&boot, "committed: slate-1.0.0")?;
    let status = node.status()?;
    ensure!(
        status["version"] == "1.0.0"
            && status["last_rollback"]["from"] == "4.0.0"
            && status["last_rollback"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("by hand"))
            && status["pinned"] == serde_json::json!(["1.0.0"]),
        "after the rollback: {status}"
    );
    lines.push(format!("$ slate rollback --wait\n{}", stdout.trim()));
    let unpinned = node.ok(&["unpin", "1.0.0"])?;
    ensure!(
        unpinned.contains("unpinned 1.0.0; pinned: none"),
        "{unpinned}"
    );
    // `slate shutdown`: the node goes down in order and powers off (QEMU exits by itself).
    let mut boot = boot;
    let answer = node.ok(&["shutdown"])?;
    ensure!(answer.contains("shutdown accepted"), "{answer}");
    let asked = std::time::Instant::now();
    boot.wait_exit(Duration::from_secs(60))
        .context("slate shutdown should power the node off")?;
    for line in [
        "[slate] [machined] shutdown requested",
        "[slate] [machined] stage ShuttingDown",
        "[slate] [machined] teardown: synced in ",
        "[slate] [machined] powering off",
    ] {
        ensure_logged(&boot, line)?;
    }
    lines.push(format!(
        "$ slate shutdown\n{} (powered off {:.1?} later)",
        answer.trim(),
        asked.elapsed()
    ));
    Ok(lines.join("\n"))
}
