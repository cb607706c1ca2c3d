//! containerd_workload (issue 38): the containerd profile — the demo's root with containerd and
//! runc layered as a signed system extension — runs a container built here (busybox httpd)
//! through containerd as the node's `web` service, its data on /var. v1 serves it; v2 changes
//! only the extension's version (the bundle diff says so) and the upgrade drains — the drain
//! command, then web, then containerd — before the installer; v2 runs the container again with
//! v1's data; a v3 whose container never becomes ready is reverted to v2 unattended.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

use super::{
    drain, node_config, online_upgrade, rollback, running, workload, Node, Prepared, BOOT_TIMEOUT,
};
use crate::containerd_ext::containerd_ext;
use crate::util::{output, repo_root};
use crate::vm::{Running, Vm};

/// The extension's versions: v2 changes only this; v3's container listens on 8081.
const EXTENSIONS: [(&str, u16); 3] = [("1.6.20-1", 8080), ("1.6.20-2", 8080), ("1.6.20-3", 8081)];
/// The line the web wrapper appends to the page (on /var) at each start.
fn start_line(image: &str, extension: &str, port: u16) -> String {
    format!("start: image {image} extension containerd {extension} port {port}")
}

/// profiles/containerd.toml with `extension` in place of its own and its paths absolute;
/// `health_timeout` replaces the `[health]` timeout (a version that fails, fails soon).
fn profile(
    work: &Path,
    name: &str,
    extension: &Path,
    health_timeout: Option<u32>,
) -> Result<PathBuf> {
    let profiles = repo_root().join("profiles");
    let text = fs::read_to_string(profiles.join("containerd.toml"))?;
    let mut lines: Vec<String> = text
        .replace("\"../", &format!("\"{}/../", profiles.display()))
        .lines()
        .map(str::to_owned)
        .collect();
    let ext = lines
        .iter()
        .position(|l| l.starts_with("extensions = "))
        .context("profiles/containerd.toml has no `extensions =` line")?;
    lines[ext] = format!("extensions = [\"{}\"]", extension.display());
    if let Some(secs) = health_timeout {
        let health = lines
            .iter()
            .position(|l| l == "[health]")
            .context("no [health]")?;
        let timeout = lines[health..]
            .iter()
            .position(|l| l.starts_with("timeout_secs = "))
            .context("no [health] timeout_secs")?;
        lines[health + timeout] = format!("timeout_secs = {secs}");
    }
    let path = work.join(format!("{name}.toml"));
    fs::write(&path, lines.join("\n") + "\n")?;
    Ok(path)
}

/// The three bundles, and v1 installed onto the blank disk `image` with a configuration that
/// drains with a cordoning command.
fn build(prepared: &Prepared, work: &Path, image: &Path) -> Result<[PathBuf; 3]> {
    let slate = &prepared.slate;
    let mut bundles = Vec::new();
    for (i, (extension, port)) in EXTENSIONS.into_iter().enumerate() {
        let manifest = containerd_ext(extension, port, slate)?;
        let failing = (port != 8080).then_some(45);
        let profile = profile(work, &format!("containerd-v{}", i + 1), &manifest, failing)?;
        let bundle = work.join(format!("bundle-v{}", i + 1));
        let version = format!("{}.0.0", i + 1);
        rollback::build(slate, &profile, "installer", &version, &[], &bundle)?;
        bundles.push(bundle);
    }
    let config = node_config(slate, work, "node1")?;
    let mut text = fs::read_to_string(&config)?;
    text.push_str(&drain::cordoning_section());
    fs::write(&config, text)?;
    super::install_blank_disk(slate, image, &bundles[0], "1.0.0", &config)?;
    bundles
        .try_into()
        .map_err(|_| anyhow::anyhow!("three bundles"))
}

/// `slate bundle diff` of v1 and v2: the version, the extension and os-release, nothing else.
fn only_the_extension_changed(slate: &Path, v1: &Path, v2: &Path) -> Result<String> {
    let diff = output(Command::new(slate).args(["bundle", "diff"]).arg(v1).arg(v2))?;
    ensure!(
        diff.contains("version: 1.0.0 -> 2.0.0")
            && diff.contains("extension containerd: 1.6.20-1 -> 1.6.20-2"),
        "bundle diff v1 v2: {diff}"
    );
    for unchanged in ["kernel", "initramfs modules", "init /init", "slate binary"] {
        ensure!(
            !diff.contains(unchanged),
            "v2 changes only the extension, yet `{unchanged}` differs: {diff}"
        );
    }
    let rootfs: Vec<&str> = diff.lines().filter(|l| l.starts_with("~ ")).collect();
    ensure!(
        rootfs.iter().all(|l| l.contains("os-release")),
        "only os-release changes in the root: {diff}"
    );
    Ok(diff
        .lines()
        .find(|l| l.starts_with("extension containerd"))
        .unwrap_or_default()
        .to_owned())
}

/// The upgrade's drain on the console: the command cordoned, then web and then containerd
/// stopped, each by its own stop signal within its grace period (nothing killed).
fn drained_in_order(boot: &Running) -> Result<String> {
    let serial = boot.serial();
    // Each after the one before it (the restart before the upgrade stopped web too).
    let mut from = 0;
    let mut next = |needle: &str| -> Result<usize> {
        let at = serial[from..]
            .find(needle)
            .map(|i| from + i)
            .with_context(|| format!("no {needle:?} on the console in the drain's order"))?;
        from = at;
        Ok(at)
    };
    let cordoned = next(drain::CORDONED_LINE)?;
    next("service web: stopping (an upgrade is installed)")?;
    let web_stopped = next("service web: stopped (")?;
    next("service containerd: stopping (an upgrade is installed)")?;
    let containerd_stopped = next("service containerd: stopped (")?;
    next("installer: installed")?;
    ensure!(
        !serial.contains("still running"),
        "a service outlived its grace period"
    );
    let line = |at: usize| serial[at..].lines().next().unwrap_or_default().to_owned();
    Ok(format!(
        "`{}`, `{}`, `{}`",
        line(cordoned),
        line(web_stopped),
        line(containerd_stopped)
    ))
}

pub(super) fn containerd_workload(prepared: &Prepared, work: &Path) -> Result<String> {
    let started = Instant::now();
    let image = work.join("containerd.raw");
    let [v1, v2, v3] = build(prepared, work, &image)?;
    let diff = only_the_extension_changed(&prepared.slate, &v1, &v2)?;
    let built = started.elapsed();
    let mut vm = Vm::new(&image, &work.join("vm"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "node1".into(),
    };
    let wait = Duration::from_secs(120);
    let (e1, e2, e3) = (EXTENSIONS[0].0, EXTENSIONS[1].0, EXTENSIONS[2].0);
    let first = start_line("1.0.0", e1, 8080);

    let mut boot = running(&mut vm)?;
    boot.expect(&["committed: slate-1.0.0"], wait, "v1 committed")?;
    workload::page_with(vm.web_port, "/", &[&first], wait)?;
    let listed: serde_json::Value =
        serde_json::from_str(&node.ok(&["services", "--output", "json"])?)?;
    for name in ["containerd", "web"] {
        let service = listed["services"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == name))
            .with_context(|| format!("no service {name}: {listed}"))?;
        ensure!(
            service["state"] == "running" && service["ready"] == true,
            "{name} running and ready: {service}"
        );
    }
    let pid = listed["services"][1]["pid"].clone();
    let restarted: serde_json::Value =
        serde_json::from_str(&node.ok(&["service", "restart", "web", "--output", "json"])?)?;
    ensure!(restarted["pid"] != pid, "a new web process: {restarted}");
    workload::page_with(vm.web_port, "/", &[&first, &first], wait)?;
    let logs = node.ok(&["logs", "--service", "web"])?;
    ensure!(
        logs.contains("service web: stopped (exit code 0)")
            && logs.contains("web: web: importing slate.local/web")
            && logs.contains("web: web: running slate.local/web"),
        "web's log: the import, the run, and a stop by its own signal: {logs}"
    );

    online_upgrade(&node, &mut boot, &v2, "2.0.0")?;
    let drained = drained_in_order(&boot)?;
    let mut boot = running(&mut vm)?;
    boot.expect(&["committed: slate-2.0.0"], wait, "v2 committed")?;
    let second = start_line("2.0.0", e2, 8080);
    workload::page_with(vm.web_port, "/", &[&first, &second], wait)?;

    online_upgrade(&node, &mut boot, &v3, "3.0.0")?;
    let mut boot = vm.start()?;
    let fatal = boot.expect(
        &["[slate] [machined] fatal:"],
        BOOT_TIMEOUT,
        "v3's container never ready",
    )?;
    ensure!(
        fatal.contains("health check `service web` failed"),
        "{fatal}"
    );
    boot.expect(
        &["upgrade reverted: the next boot is slate-2.0.0.efi"],
        Duration::from_secs(60),
        "the revert",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    let _boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["last_failure"]["version"] == "3.0.0",
        "back on v2, v3's failure recorded: {status}"
    );
    // v3 ran its container (its line is on /var) on a port nothing checks; v2's runs again.
    let third = start_line("3.0.0", e3, 8081);
    workload::page_with(vm.web_port, "/", &[&first, &second, &third, &second], wait)?;
    Ok(format!(
        "built in {:.0?}; v1's container served through containerd; restarted by its own \
         signal; v1 -> v2 `{diff}`: drained {drained}; v2 serves v1's and its own start lines \
         (/var); v3 (container on 8081) reverted to v2 unattended, whose container serves again",
        built
    ))
}
