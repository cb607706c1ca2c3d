//! The Boot tasks that bring in the machine configuration: read it from STATE (or wait for it
//! in maintenance mode), then apply what it sets in the kernel and /etc.

use std::path::Path;

use slate_sequencer::{TaskContext, TaskError};

use crate::base::node::Node;
use crate::base::task::failed;
use crate::boot::facts::Facts;

/// The machine configuration from STATE; without one, maintenance mode until an operator
/// applies one.
pub fn machine_config(ctx: &TaskContext<'_>, node: &Node, facts: &Facts) -> Result<(), TaskError> {
    let path = crate::boot::maintenance::config_path();
    // STATE is mounted (the configuration is read from it): from here the outcome counters
    // are kept there.
    for note in node
        .journal
        .counters
        .attach(&crate::base::paths::state_dir())
    {
        node.journal.error(note);
    }
    let parsed =
        match crate::boot::machine::load(&crate::base::paths::state_dir()).map_err(failed)? {
            Some(parsed) => parsed,
            None => {
                // The operator must be able to reach the node: DHCP first (under systemd,
                // systemd-networkd's).
                if node.host == crate::base::node::Host::Pid1 {
                    crate::boot::network::dhcp(ctx, node, None)?;
                    facts
                        .network_up
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                }
                crate::boot::maintenance::wait_for_config(ctx, node, facts.watchdog.as_ref())?
            }
        };
    ctx.log(&format!(
        "machine configuration {}: node {}, hostname {}{}",
        path.display(),
        parsed.config.node.name,
        parsed.config.hostname(),
        parsed.migrated_from.map_or(String::new(), |v| format!(
            " (version {v}, migrated in memory to {})",
            parsed.config.version
        )),
    ));
    for warning in crate::boot::machine::warnings(&parsed.config) {
        ctx.log(&warning);
    }
    node.machine.set(parsed);
    Ok(())
}

/// What the configuration sets in /etc and the kernel, once /etc is writable.
pub fn configure(ctx: &TaskContext<'_>, node: &Node) -> Result<(), TaskError> {
    let config = node
        .machine
        .current()
        .ok_or_else(|| failed("no machine configuration"))?;
    crate::boot::machine::set_hostname(node, config.hostname()).map_err(failed)?;
    let written =
        crate::boot::machine::write_etc_files(Path::new("/etc"), &config).map_err(failed)?;
    if !written.is_empty() {
        ctx.log(&format!(
            "/etc files from the configuration: {}",
            written.join(" ")
        ));
    }
    Ok(())
}
