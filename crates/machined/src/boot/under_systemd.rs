//! What machined's Boot sequence does instead, as a service of systemd on a systemd image
//! (docs/node.md, "A systemd image"): slate's init mounted STATE, /var and /etc before systemd
//! started; systemd-networkd brought the network up; the units ordered before
//! `boot-complete.target` are the image's own health checks.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use slate_node_fs::var_record::{VarRecord, VAR_RECORD};
use slate_sequencer::{TaskContext, TaskError};

use crate::base::node::Node;
use crate::base::paths::EPHEMERAL_MOUNT;
use crate::base::task::failed;
use crate::boot::facts::Facts;

/// How long the network task waits for systemd-networkd's address (the certificate names it).
const ADDRESS_WAIT: Duration = Duration::from_secs(60);

/// /var as init left it: mounted in the mode its record names (`/run/slate/var.json`;
/// persistent without one, as an init older than the record mounted it) — or refused, and
/// then the task fails with init's reason and the node waits in maintenance mode as on
/// slate's own OS (`facts.var_refused`).
pub fn var_by_init(ctx: &TaskContext<'_>, node: &Node, facts: &Facts) -> Result<(), TaskError> {
    let record = VarRecord::read(Path::new(VAR_RECORD))
        .map_err(|e| failed(format!("reading {VAR_RECORD}: {e}")))?;
    if let Some(VarRecord {
        mode,
        encrypted,
        locked: Some(why),
        ..
    }) = &record
    {
        *node.var.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::VarStatus {
            mode: mode.clone(),
            encrypted: *encrypted,
            unlocked: None,
            prepared: "not mounted: locked".to_owned(),
        });
        *facts.var_refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
        return Err(failed(format!("/var was not mounted by init: {why}")));
    }
    if !slate_host::is_mount_point(Path::new(EPHEMERAL_MOUNT))? {
        return Err(failed(format!(
            "{EPHEMERAL_MOUNT} is not a mount point: slate's init mounts EPHEMERAL there before \
             systemd starts (was this root booted through slate's initramfs?)"
        )));
    }
    let (mode, prepared, encrypted, unlocked) = match record {
        Some(r) => (
            r.mode,
            format!("{} by init, the {}'s mode", r.prepared, r.from),
            r.encrypted,
            r.unlocked,
        ),
        None => (
            slate_profile::VarMode::Persistent.name().to_owned(),
            "mounted by init".to_owned(),
            false,
            None,
        ),
    };
    let how = unlocked
        .as_deref()
        .map(|how| format!(", unlocked by {how}"))
        .unwrap_or_default();
    ctx.log(&format!("{EPHEMERAL_MOUNT}: {mode}, {prepared}{how}"));
    *node.var.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::VarStatus {
        mode,
        encrypted,
        unlocked,
        prepared,
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
pub fn boot_complete(node: &Node) -> Result<(), String> {
    let state = systemctl(&["is-active", "boot-complete.target"]);
    if state.trim() == "active" {
        node.journal.info(
            "boot assessment: boot-complete.target reached (every unit it requires succeeded)",
        );
        return Ok(());
    }
    let failed = systemctl(&["list-units", "--failed", "--plain", "--no-legend"]);
    let units = failed_units(&failed);
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

/// The unit names of `systemctl list-units --failed --plain --no-legend` (a line may begin with
/// a status bullet).
fn failed_units(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.contains('.')))
        .collect()
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

/// `slate health-check N`, run by `slate-check@N.service`: the image's check N (its
/// `/etc/slate/node.toml`), retried within `[health] timeout_secs`, as machined runs them on
/// slate's own OS. Lines go to stdout (the journal and the console); a failure is the error.
pub fn health_check_unit(index: usize) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let path = Path::new(crate::boot::health::NODE_CONFIG);
    let config = crate::boot::health::load_config(path)?;
    let health = config
        .health
        .with_context(|| format!("{} has no [health] section", path.display()))?;
    let check = health.checks.get(index).with_context(|| {
        format!(
            "{} has {} health check(s); there is no check {index}",
            path.display(),
            health.checks.len()
        )
    })?;
    let timeout = Duration::from_secs(u64::from(health.timeout_secs));
    // No service is slate's here (the profile refuses service checks on a systemd image).
    let passed = crate::boot::health::run_checks(
        std::slice::from_ref(check),
        timeout,
        &|_| None,
        &|line: &str| println!("health: {line}"),
    )?;
    println!(
        "health: check {index} passed in {:.1}s",
        passed.elapsed.as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::failed_units;

    #[test]
    fn failed_units_are_read_with_or_without_a_bullet() {
        let listing = "\u{25cf} slate-check@2.service loaded failed failed slate health check 2\n\
                       slate-setup-hooks.service loaded failed failed slate setup hooks\n\n";
        assert_eq!(
            failed_units(listing),
            ["slate-check@2.service", "slate-setup-hooks.service"]
        );
        assert!(failed_units("").is_empty());
    }
}
