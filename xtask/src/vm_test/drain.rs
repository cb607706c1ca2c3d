//! Issue 38 on a running node, before its upgrade to v2: a machine configuration applied live
//! adds a crash-looping service (its restarts back off, visible in `slate services` and its log,
//! while the web service and the API carry on) and a drain command that fails — the upgrade is
//! refused with the command's output, nothing drained or written; a second configuration
//! removes the service live and drains with a command that succeeds, whose line the upgrade's
//! console must then show before the web service stops.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

use super::{workload, Node};
use crate::util::repo_root;
use crate::vm::Running;

/// What the failing drain command prints before it exits 2.
const REFUSING: &str = "echo \"refusing $SLATE_DRAIN_REASON of $SLATE_NODE_NAME to \
                        $SLATE_TARGET_VERSION\"; exit 2";
/// What the succeeding one prints.
const CORDONED: &str = "echo \"cordoned $SLATE_NODE_NAME for $SLATE_DRAIN_REASON to \
                        $SLATE_TARGET_VERSION\"";
/// The line the upgrade to v2 must show on the console, before the web service stops.
pub(super) const CORDONED_LINE: &str = "drain: cordoned node1 for upgrade to 2.0.0";

/// The `[drain]` of a machine configuration whose command prints [`CORDONED_LINE`]'s kind.
pub(super) fn cordoning_section() -> String {
    drain_section(CORDONED)
}

fn drain_section(script: &str) -> String {
    format!("\n[drain]\ncommand = ['/bin/sh', '-c', '{script}']\ntimeout_secs = 20\n")
}

fn service<'a>(listed: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    listed["services"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
}

/// Runs the steps above on v1 (`reference`: v2 in the registry); `base` is the configuration
/// node1 holds now. Returns a summary.
pub(super) fn refused_then_cordoned(
    node: &Node<'_>,
    boot: &Running,
    work: &Path,
    base: &str,
    reference: &str,
    web_port: u16,
) -> Result<String> {
    let services = || -> Result<serde_json::Value> {
        Ok(serde_json::from_str(
            &node.ok(&["services", "--output", "json"])?,
        )?)
    };
    let web_pid =
        |listed: &serde_json::Value| service(listed, "web").and_then(|w| w["pid"].as_u64());
    let before = web_pid(&services()?).context("web has no pid")?;
    let crashing = work.join("node1-crash-loop.toml");
    fs::write(
        &crashing,
        format!(
            "{base}\n[[services]]\nname = \"crash\"\ncommand = ['/bin/sh', '-c', 'echo \
             crashing; exit 3']\nrestart_delay_ms = 200\nrestart_delay_max_ms = 1600\n{}",
            drain_section(REFUSING)
        ),
    )?;
    let applied = node.ok(&[
        "apply-config",
        crashing.to_str().unwrap_or(""),
        "--mode",
        "no-reboot",
    ])?;
    ensure!(
        applied.starts_with("applied: services, drain changed; no reboot needed"),
        "apply-config: {applied}"
    );

    // The crash loop backs off, and nothing else suffers.
    let deadline = Instant::now() + Duration::from_secs(60);
    let crash = loop {
        let listed = services()?;
        let crash = service(&listed, "crash")
            .with_context(|| format!("no service crash after the live apply: {listed}"))?
            .clone();
        if crash["restarts"].as_u64().unwrap_or(0) >= 4 {
            ensure!(
                web_pid(&listed) == Some(before)
                    && service(&listed, "web").is_some_and(|w| w["ready"] == true),
                "the web service ran on, untouched, beside the crash loop: {listed}"
            );
            break crash;
        }
        ensure!(
            Instant::now() < deadline,
            "crash never restarted 4 times: {crash}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    ensure!(
        crash["last_exit"] == "exit code 3",
        "the crash's last exit: {crash}"
    );
    let asked = Instant::now();
    let status = node.status()?;
    let answered = asked.elapsed();
    ensure!(
        status["stage"] == "Running" && answered < Duration::from_secs(5),
        "the API answers beside the crash loop ({answered:?}): {status}"
    );
    let log = node.ok(&["logs", "--service", "crash"])?;
    for delay in [
        "restart 1 in 200 ms",
        "restart 2 in 400 ms",
        "restart 3 in 800 ms",
        "restart 4 in 1600 ms",
    ] {
        ensure!(log.contains(delay), "{delay:?} in crash's log: {log}");
    }
    let row = node
        .ok(&["services"])?
        .lines()
        .find(|l| l.starts_with("crash"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .context("no crash row in `slate services`")?;

    // A drain command that fails refuses the upgrade: nothing stopped, nothing written.
    let cache = repo_root().join(format!("target/vm-test-cache/{}", node.port));
    let refused = node.refused(&[
        "upgrade",
        "--image",
        reference,
        "--cache",
        cache.to_str().unwrap_or("."),
        "--wait",
        "--timeout",
        "300",
    ])?;
    ensure!(
        refused.contains("the drain command failed: it exited with status 2; its last output: refusing upgrade of node1 to 2.0.0")
            && refused.contains("The upgrade is refused before anything was written"),
        "the upgrade with a failing drain command: {refused}"
    );
    let serial = boot.serial();
    ensure!(
        !serial.contains("installer: ")
            && !serial.contains("service web: stopping (an upgrade is installed)"),
        "a refused upgrade ran its installer or drained the services"
    );
    let status = node.status()?;
    ensure!(
        status["version"] == "1.0.0" && status["stage"] == "Running",
        "still v1, running: {status}"
    );
    ensure!(
        web_pid(&services()?) == Some(before),
        "the web service was stopped by a refused upgrade"
    );
    workload::serves_version(web_port, "1.0.0")?;

    // Removed live; the next drain cordons.
    let cordoning = work.join("node1-cordon.toml");
    fs::write(&cordoning, format!("{base}{}", drain_section(CORDONED)))?;
    let applied = node.ok(&[
        "apply-config",
        cordoning.to_str().unwrap_or(""),
        "--mode",
        "no-reboot",
    ])?;
    ensure!(
        applied.starts_with("applied: services, drain changed"),
        "apply-config: {applied}"
    );
    let listed = services()?;
    ensure!(
        service(&listed, "crash").is_none() && web_pid(&listed) == Some(before),
        "crash removed live, web untouched: {listed}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !boot
        .serial()
        .contains("services applied live: removed crash")
    {
        ensure!(
            Instant::now() < deadline,
            "no `services applied live: removed crash` on the console"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(format!(
        "live apply added crash (`{row}`: restarts 200/400/800/1600 ms, web pid {before} \
         untouched, status in {} ms); the upgrade refused by the failing drain command \
         (nothing drained, still v1); crash removed live",
        answered.as_millis()
    ))
}
