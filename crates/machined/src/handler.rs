//! The top of PID 1: what happens when a sequence asks for a reboot, or fails fatally.
//! Neither returns.

use std::time::Duration;

use slate_api::Stage;
use slate_sequencer::RebootMode;

use super::node::Node;

const SYNC_BUDGET: Duration = Duration::from_secs(30);
const FATAL_REBOOT_DELAY: Duration = Duration::from_secs(10);

/// Stop every process, unmount, sync within the budget.
fn teardown(node: &Node) {
    node.journal.info("teardown: stopping all processes");
    slate_host::kill_all_processes(Duration::from_secs(2));
    let busy = slate_host::unmount_all();
    if !busy.is_empty() {
        node.journal.info(format_args!(
            "teardown: detached busy mounts: {}",
            busy.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !slate_host::sync_with_budget(SYNC_BUDGET) {
        node.journal.error(format_args!(
            "teardown: sync did not finish within {SYNC_BUDGET:?}"
        ));
    }
}

fn halt_forever(node: &Node) -> ! {
    node.journal
        .info("halted: the node waits here to be inspected (panic=0)");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A sequence returned the typed reboot error: tear down and restart (or power off).
pub fn reboot(node: &Node, mode: RebootMode) -> ! {
    node.set_stage(Stage::Rebooting);
    teardown(node);
    // A power cycle and a reboot are the same to a machine without kexec: the firmware runs
    // again either way.
    let result = match mode {
        RebootMode::PowerOff => {
            node.journal.info("powering off");
            slate_host::poweroff()
        }
        RebootMode::Default | RebootMode::Powercycle => {
            node.journal.info(format_args!("rebooting ({mode})"));
            slate_host::reboot()
        }
    };
    let Err(err) = result;
    node.journal.error(format_args!("the reboot failed: {err}"));
    halt_forever(node)
}

/// Any other fatal error: log the whole chain, tear down, then reboot after a pause — or, with
/// `panic=0`, wait forever so the failure can be inspected.
pub fn fatal(node: &Node, error: &(dyn std::error::Error + 'static)) -> ! {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    node.journal.error(format_args!("fatal: {message}"));
    node.set_stage(Stage::Failed);
    if let Err(err) = super::transaction::record_failure(node, &message) {
        node.journal
            .error(format_args!("could not record the failure in META: {err}"));
    }
    match super::transaction::revert_if_pending(node) {
        Ok(Some(label)) => node
            .journal
            .info(format_args!("upgrade reverted: the next boot is {label}")),
        Ok(None) => {}
        Err(err) => node.journal.error(format_args!("revert failed: {err}")),
    }
    teardown(node);
    if node.config.halt_on_fatal {
        halt_forever(node)
    }
    node.journal
        .info(format_args!("rebooting in {FATAL_REBOOT_DELAY:?}"));
    std::thread::sleep(FATAL_REBOOT_DELAY);
    let Err(err) = slate_host::reboot();
    node.journal.error(format_args!("the reboot failed: {err}"));
    halt_forever(node)
}
