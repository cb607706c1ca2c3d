//! The top of PID 1: what happens when a sequence asks for a reboot or a power-off, or fails
//! fatally. Neither returns.

use std::time::Duration;

use slate_api::Stage;
use slate_host::AfterFailure;
use slate_sequencer::{error_chain, RebootMode};

use crate::base::node::{Host, Node};
use crate::settle::decision::Phase;
use crate::settle::kexec::{self, Via};

const SYNC_BUDGET: Duration = Duration::from_secs(30);

/// Stop every process, unmount, sync within the budget.
fn teardown(node: &Node) {
    node.journal.info("teardown: stopping all processes");
    slate_host::kill_all_processes(Duration::from_secs(2));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let points = slate_host::mount_points_for_teardown(&mounts).len();
    let busy = slate_host::unmount_all();
    node.journal.info(format_args!(
        "teardown: unmounted {} of {points} file systems",
        points.saturating_sub(busy.len())
    ));
    if !busy.is_empty() {
        node.journal.info(format_args!(
            "teardown: detached busy mounts: {}",
            busy.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let started = std::time::Instant::now();
    if slate_host::sync_with_budget(SYNC_BUDGET) {
        node.journal.info(format_args!(
            "teardown: synced in {:.1?}",
            started.elapsed()
        ));
    } else {
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

/// How the machine goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoDown {
    PowerOff,
    Restart,
}

/// How `mode` takes the machine down, and the line that says so (a restart by kexec says so
/// itself, in [`reboot`]).
fn going_down(mode: RebootMode) -> (GoDown, String) {
    match mode {
        RebootMode::PowerOff => (GoDown::PowerOff, "powering off".into()),
        RebootMode::Default | RebootMode::Powercycle | RebootMode::Kexec => {
            (GoDown::Restart, format!("rebooting ({mode})"))
        }
    }
}

/// The stage a node going down in `mode` reports.
fn stage_going_down(mode: RebootMode) -> Stage {
    match mode {
        RebootMode::PowerOff => Stage::ShuttingDown,
        RebootMode::Default | RebootMode::Powercycle | RebootMode::Kexec => Stage::Rebooting,
    }
}

/// A kexec being prepared beside the teardown, or why there is none.
type Loading = Result<std::thread::JoinHandle<Result<kexec::Prepared, String>>, String>;

/// When `mode` restarts by kexec here: the configuration read and the lockdown level checked
/// (before the teardown unmounts /etc and securityfs), then the next entry read and loaded on
/// a thread of its own while the teardown runs (both take about two seconds on a TCG guest).
/// `None`: restart through the firmware, as asked.
fn start_kexec(node: &Node, mode: RebootMode) -> Option<Loading> {
    let machine = node.machine.current().and_then(|c| c.reboot.mode);
    let image =
        crate::boot::health::load_config(std::path::Path::new(crate::boot::health::NODE_CONFIG))
            .ok()
            .and_then(|c| c.reboot)
            .map(|r| r.mode);
    if kexec::via(mode, machine, image) != Via::Kexec {
        return None;
    }
    Some(
        kexec::lockdown_allows(slate_host::lockdown().as_deref()).and_then(|()| {
            std::thread::Builder::new()
                .name("kexec-load".into())
                .spawn(kexec::prepare)
                .map_err(|e| format!("starting the loader thread: {e}"))
        }),
    )
}

/// The kexec that [`start_kexec`] prepared, once loaded; `None` (and the line that says why)
/// when a wanted kexec cannot be made.
fn loaded_kexec(node: &Node, loading: Option<Loading>) -> Option<kexec::Prepared> {
    let outcome = loading?.and_then(|thread| {
        thread
            .join()
            .unwrap_or_else(|_| Err("the loader thread panicked".into()))
    });
    match outcome {
        Ok(prepared) => {
            node.journal.info(format_args!(
                "kexec: loaded {} (kernel {} KiB, initramfs {} KiB)",
                prepared.plan.entry,
                prepared.plan.kernel.len() / 1024,
                prepared.plan.initrd.len() / 1024
            ));
            Some(prepared)
        }
        Err(why) => {
            node.journal.info(format_args!(
                "kexec unavailable: {why}; rebooting through the firmware"
            ));
            None
        }
    }
}

/// A sequence returned the typed reboot error: tear down and restart (or power off).
pub fn reboot(node: &Node, mode: RebootMode) -> ! {
    let stage = stage_going_down(mode);
    // The sequence's task may have said so already.
    if node.stage() != stage {
        node.set_stage(stage);
    }
    if node.host == Host::Systemd {
        let (how, line) = going_down(mode);
        if let Some(prepared) = loaded_kexec(node, start_kexec(node, mode)) {
            kexec_through_systemd(node, prepared);
        }
        node.journal.info(format_args!("{line} through systemd"));
        systemd_goes_down(node, how)
    }
    let loading = start_kexec(node, mode);
    teardown(node);
    let prepared = loaded_kexec(node, loading);
    let (how, line) = going_down(mode);
    if let Some(prepared) = prepared {
        node.journal.info(format_args!(
            "rebooting by kexec into {} ({mode})",
            prepared.plan.counted
        ));
        let why = kexec::jump(prepared);
        node.journal.error(format_args!(
            "kexec failed: {why}; rebooting through the firmware"
        ));
    }
    node.journal.info(line);
    let result = match how {
        GoDown::PowerOff => slate_host::poweroff(),
        GoDown::Restart => slate_host::reboot(),
    };
    let Err(err) = result;
    node.journal.error(format_args!("the reboot failed: {err}"));
    halt_forever(node)
}

/// Any other fatal error: log the whole chain, tear down, then reboot after a pause — or, with
/// `panic=0`, wait forever so the failure can be inspected.
pub fn fatal(node: &Node, error: &(dyn std::error::Error + 'static)) -> ! {
    let message = error_chain(error);
    node.journal.error(format_args!("fatal: {message}"));
    node.set_stage(Stage::Failed);
    if node.snapshot_root.is_some() {
        // No META on a snapshot root: the failure is in the journal and the status only.
        *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::Failure {
            version: node.version.clone(),
            reason: message.clone(),
        });
    } else if let Err(err) = crate::settle::transaction::record_failure(node, &message) {
        node.journal
            .error(format_args!("could not record the failure in META: {err}"));
    }
    if let Err(err) = crate::settle::transaction::settle(node, Phase::Fatal) {
        node.journal.error(format_args!("revert failed: {err}"));
    }
    node.journal
        .count(&[(slate_metrics::node_counters::BOOTS, "failed")]);
    // Stopped as a drain stops them (signal, grace), not by the teardown's kill of everything.
    if let Some(services) = node.services.get() {
        services.stop_all("the boot failed");
    }
    if node.host == Host::Pid1 {
        teardown(node);
    }
    let delay = match node.config.after_fatal {
        AfterFailure::Halt => halt_forever(node),
        AfterFailure::Reboot(delay) => delay,
    };
    node.journal.info(format_args!("rebooting in {delay:?}"));
    std::thread::sleep(delay);
    if node.host == Host::Systemd {
        systemd_goes_down(node, GoDown::Restart)
    }
    let Err(err) = slate_host::reboot();
    node.journal.error(format_args!("the reboot failed: {err}"));
    halt_forever(node)
}

/// Under systemd, a kexec that was loaded: the attempt counted first (the units still run, and
/// nothing but slate writes the ESP), then `systemctl kexec`, which stops every unit and jumps
/// into the loaded image. Returns when either step failed (the image unloaded; a reboot
/// through the firmware follows — after a counted attempt, systemd-boot counts once more, so
/// that failure costs the entry one try).
fn kexec_through_systemd(node: &Node, mut prepared: kexec::Prepared) {
    node.journal.info(format_args!(
        "rebooting by kexec into {} through systemd",
        prepared.plan.counted
    ));
    let failed = kexec::count(&mut prepared).err().or_else(|| {
        let queued = crate::boot::under_systemd::go_down("kexec");
        if queued.is_err() {
            let _ = slate_host::kexec_unload();
        }
        queued.err()
    });
    match failed {
        None => waits_for_systemd(node, "kexec"),
        Some(why) => node.journal.error(format_args!(
            "kexec failed: {why}; rebooting through the firmware"
        )),
    }
}

/// Under systemd: systemd stops every unit (this one among them) and takes the machine down.
fn systemd_goes_down(node: &Node, how: GoDown) -> ! {
    let verb = match how {
        GoDown::PowerOff => "poweroff",
        GoDown::Restart => "reboot",
    };
    match crate::boot::under_systemd::go_down(verb) {
        Ok(()) => waits_for_systemd(node, verb),
        Err(err) => node.journal.error(format_args!("the reboot failed: {err}")),
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// `systemctl VERB` is queued: systemd stops this service on its way down.
fn waits_for_systemd(node: &Node, verb: &str) -> ! {
    node.journal.info(format_args!(
        "systemctl {verb} queued; systemd stops this service"
    ));
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

// The rest of this module tears the machine down (kills every process, unmounts, reboots): it
// is exercised by the VM tests only.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_poweroff_powers_the_machine_off() {
        assert_eq!(
            going_down(RebootMode::PowerOff),
            (GoDown::PowerOff, "powering off".into())
        );
        assert_eq!(
            going_down(RebootMode::Default),
            (GoDown::Restart, "rebooting (default)".into())
        );
        assert_eq!(
            going_down(RebootMode::Powercycle),
            (GoDown::Restart, "rebooting (powercycle)".into())
        );
        assert_eq!(stage_going_down(RebootMode::PowerOff), Stage::ShuttingDown);
        assert_eq!(stage_going_down(RebootMode::Default), Stage::Rebooting);
        assert_eq!(stage_going_down(RebootMode::Powercycle), Stage::Rebooting);
        assert_eq!(stage_going_down(RebootMode::Kexec), Stage::Rebooting);
        assert_eq!(
            going_down(RebootMode::Kexec),
            (GoDown::Restart, "rebooting (kexec)".into())
        );
    }
}
