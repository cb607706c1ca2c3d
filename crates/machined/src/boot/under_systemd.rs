//! What machined's Boot sequence does instead, as a service of systemd on a systemd image
//! (docs/node.md, "A systemd image"): slate's init mounted STATE, /var and /etc before systemd
//! started; systemd-networkd brought the network up; the units ordered before
//! `boot-complete.target` are the image's own health checks.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use slate_sequencer::{TaskContext, TaskError};

use crate::base::node::Node;
use crate::base::paths::EPHEMERAL_MOUNT;
use crate::base::task::failed;

/// How long the network task waits for systemd-networkd's address (the certificate names it).
const ADDRESS_WAIT: Duration = Duration::from_secs(60);

/// /var as init left it: mounted, persistent, not encrypted.
pub fn var_by_init(ctx: &TaskContext<'_>, node: &Node) -> Result<(), TaskError> {
    if !slate_host::is_mount_point(Path::new(EPHEMERAL_MOUNT))? {
        return Err(failed(format!(
            "{EPHEMERAL_MOUNT} is not a mount point: slate's init mounts EPHEMERAL there before \
             systemd starts (was this root booted through slate's initramfs?)"
        )));
    }
    ctx.log(&format!("{EPHEMERAL_MOUNT}: mounted by slate's init"));
    *node.var.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::VarStatus {
        mode: slate_profile::VarMode::Persistent.name().to_owned(),
        encrypted: false,
        unlocked: None,
        prepared: "mounted by init".into(),
    });
    Ok(())
}

/// The addresses systemd-networkd gave the first interface, for the serving certificate.
pub fn addresses(ctx: &TaskContext<'_>, node: &Node) -> Result<(), TaskError> {
    let interface = crate::boot::network::first_interface()?;
    let started = std::time::Instant::now();
    while slate_host::ipv4_addresses(&interface)?.is_empty() {
        if started.elapsed() > ADDRESS_WAIT {
            ctx.log(&format!(
                "{interface}: no IPv4 address after {ADDRESS_WAIT:?}; the certificate names \
                 the node's name only"
            ));
            return Ok(());
        }
        ctx.sleep(Duration::from_millis(250))?;
    }
    crate::boot::network::record_addresses(ctx, node, &interface)
}

/// systemd's boot assessment: the boot is good only if `boot-complete.target` was reached —
/// every unit it requires (slate's setup hooks, the image's health units) succeeded.
/// slate-machined.service is ordered after it, so its state is settled when this runs.
pub fn boot_complete() -> Result<(), String> {
    let state = systemctl(&["is-active", "boot-complete.target"]);
    if state.trim() == "active" {
        return Ok(());
    }
    let failed = systemctl(&["list-units", "--failed", "--plain", "--no-legend"]);
    let units: Vec<&str> = failed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    Err(format!(
        "boot-complete.target is {}: {}",
        if state.trim().is_empty() {
            "unknown"
        } else {
            state.trim()
        },
        if units.is_empty() {
            "no unit failed (was it started?)".to_owned()
        } else {
            format!("failed units: {}", units.join(", "))
        }
    ))
}

/// Ask systemd to take the machine down (`reboot`, `poweroff`): it stops every unit, this
/// one among them.
pub fn go_down(verb: &str) -> Result<(), String> {
    let out = Command::new("systemctl")
        .args(["--no-block", verb])
        .output()
        .map_err(|e| format!("systemctl {verb}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "systemctl {verb}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn systemctl(args: &[&str]) -> String {
    Command::new("systemctl")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
