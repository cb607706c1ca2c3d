//! /var modes (issue 40) on a running node: a service of the machine configuration notes
//! whether the file it left on /var is still there. Persistent: found after a reboot. Switched
//! to `[var] mode = "ephemeral"` (a reboot): formatted at every boot, absent each time, and
//! `slate status` says so.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use super::{running, Node};
use crate::vm::{Running, Vm};

/// The service: says whether /var/lib/marker is there, then leaves one.
const MARKER: &str = "\n[[services]]\nname = \"marker\"\ncommand = ['/bin/sh', '-c', 'if [ -e \
                      /var/lib/marker ]; then echo \"marker found\"; else echo \"marker \
                      absent\"; fi; echo x > /var/lib/marker']\nrestart = \"never\"\ndepends_on \
                      = [\"var\"]\n";

/// What the marker service said at this boot (waits for it).
pub(super) fn marker_said(node: &Node<'_>) -> Result<&'static str> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs = node.ok(&["logs", "--service", "marker"])?;
        for said in ["marker found", "marker absent"] {
            if logs.contains(&format!("marker: {said}")) {
                return Ok(said);
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the marker service said nothing: {logs}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `slate reboot`, and the next boot running.
pub(super) fn reboot(node: &Node<'_>, vm: &mut Vm, mut boot: Running) -> Result<Running> {
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(90))?;
    running(vm)
}

/// `base`: the machine configuration the node holds. Returns a summary.
pub(super) fn persistent_then_ephemeral(
    node: &Node<'_>,
    vm: &mut Vm,
    boot: Running,
    work: &Path,
    base: &str,
) -> Result<(String, Running)> {
    let var = |status: &serde_json::Value| {
        (
            status["var"]["mode"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            status["var"]["prepared"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let (mode, _) = var(&node.status()?);
    ensure!(
        mode == "persistent",
        "the demo's /var is persistent: {mode}"
    );
    let with_marker = work.join("marker.toml");
    fs::write(&with_marker, format!("{base}{MARKER}"))?;
    let path = with_marker.to_str().unwrap_or("");
    node.ok(&["apply-config", path, "--mode", "no-reboot"])?;
    ensure!(marker_said(node)? == "marker absent", "a first marker");
    let mut boot = reboot(node, vm, boot)?;
    ensure!(
        marker_said(node)? == "marker found",
        "a persistent /var keeps the marker across a reboot"
    );

    let ephemeral = work.join("ephemeral.toml");
    fs::write(
        &ephemeral,
        format!("{base}{MARKER}\n[var]\nmode = \"ephemeral\"\n"),
    )?;
    let applied = node.ok(&[
        "apply-config",
        ephemeral.to_str().unwrap_or(""),
        "--mode",
        "no-reboot",
    ]);
    ensure!(
        applied.is_err(),
        "[var] mode cannot change without a reboot"
    );
    node.ok(&[
        "apply-config",
        ephemeral.to_str().unwrap_or(""),
        "--mode",
        "reboot",
    ])?;
    boot.wait_exit(Duration::from_secs(90))?;
    let mut boots = Vec::new();
    let mut boot = running(vm)?;
    for _ in 0..2 {
        ensure!(
            boot.serial().contains("formatting it afresh"),
            "an ephemeral /var is formatted at boot"
        );
        ensure!(
            marker_said(node)? == "marker absent",
            "an ephemeral /var never holds the last boot's marker"
        );
        let status = node.status()?;
        boots.push(var(&status));
        let text = node.ok(&["status"])?;
        ensure!(
            text.contains("var:      ephemeral, not encrypted (formatted (ephemeral))"),
            "{text}"
        );
        boot = reboot(node, vm, boot)?;
    }
    ensure!(
        boots
            .iter()
            .all(|(m, p)| m == "ephemeral" && p == "formatted (ephemeral)"),
        "status.var: {boots:?}"
    );
    Ok((
        "/var persistent: the marker found after a reboot; `[var] mode = \"ephemeral\"` refused \
         live, applied with a reboot: formatted afresh and the marker absent at each of two \
         boots, status `var: ephemeral, not encrypted (formatted (ephemeral))`"
            .to_owned(),
        boot,
    ))
}
