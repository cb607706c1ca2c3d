//! machined's sequences as phase lists, and their tasks. Ordering lives only in phase
//! boundaries: tasks of one phase run concurrently.

use std::net::SocketAddr;
use std::path::Path;

use slate_api::Stage;
use slate_host::BlockPartition;
use slate_meta::tag_name;
use slate_sequencer::{
    PhaseListBuilder, RebootMode, Sequence, SequenceKind, TaskContext, TaskError,
};

use crate::base::node::{Host, Node};
use crate::base::paths::{EPHEMERAL_MOUNT, STATE_MOUNT};
use crate::base::task::{failed, task};
use crate::boot::drain::{drain, DrainReason};
use crate::boot::facts::Facts;
use crate::boot::volumes::{
    erase_var, mount_var, mount_volume, refused_status, wait_for_partition, wipe_head, VarRefused,
};

pub fn initialize<'a>(node: &'a Node, facts: &'a Facts) -> Sequence<'a> {
    PhaseListBuilder::new()
        .append(
            "systemRequirements",
            [task(node, "checkRequirements", |_| {
                if !Path::new("/proc/self").exists() {
                    return Err(failed("/proc is not mounted"));
                }
                Ok(())
            })],
        )
        .append(
            "earlyServices",
            [task(node, "mountEfivars", |ctx| {
                match slate_host::mount_efivarfs() {
                    Ok(true) => ctx.log("efivarfs mounted"),
                    Ok(false) => ctx.log("not booted through UEFI: no EFI variables"),
                    Err(err) => ctx.log(&format!("efivarfs unavailable: {err}")),
                }
                Ok(())
            })],
        )
        .append_when(
            node.snapshot_root.is_none(),
            "meta",
            [task(node, "loadMeta", move |ctx| {
                load_meta(ctx, node, facts)
            })],
        )
        .append_when(
            node.snapshot_root.is_some(),
            "snapshotRoot",
            [task(node, "openSnapshotRoot", move |ctx| {
                crate::boot::snapshot_volumes::initialize(ctx, node, &facts.system_disk)
            })],
        )
        .append(
            "config",
            [task(node, "loadConfig", move |ctx| {
                let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
                let root = mounts
                    .lines()
                    .rev()
                    .find_map(|l| {
                        let f: Vec<&str> = l.split_whitespace().collect();
                        (f.get(1) == Some(&"/")).then(|| f.get(2).copied().unwrap_or("?"))
                    })
                    .unwrap_or("unknown");
                ctx.log(&format!(
                    "mode {}, version {}, booted entry {}, root {root}",
                    node.mode.as_str(),
                    node.version,
                    node.booted_entry.as_deref().unwrap_or("unknown")
                ));
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Initialize)
}

fn load_meta(ctx: &TaskContext<'_>, node: &Node, facts: &Facts) -> Result<(), TaskError> {
    let part = match wait_for_partition(ctx, crate::base::system_disk::META_LABEL, None) {
        Ok(part) => part,
        Err(err) => {
            ctx.log(&format!("no META partition: {err}"));
            return Ok(());
        }
    };
    let mut store = open_meta(&part)?;
    for warning in store.warnings() {
        ctx.log(&format!("META: {warning}"));
    }
    let entries: Vec<String> = store
        .entries()
        .iter()
        .map(|e| match tag_name(e.tag) {
            Some(name) => format!("{name}={}", String::from_utf8_lossy(e.value)),
            None => format!("{}={}", e.tag, String::from_utf8_lossy(e.value)),
        })
        .collect();
    ctx.log(&format!(
        "META on {}: {} value(s) {}",
        part.device.display(),
        entries.len(),
        entries.join(" ")
    ));
    for line in crate::settle::records::load(node, |tag| store.get(tag)) {
        ctx.log(&line);
    }
    match crate::boot::upgrade::consume_staged(&mut store) {
        Ok(Some(staged)) => {
            ctx.log(&format!(
                "a staged upgrade to {} was waiting; taken out of META before it runs",
                staged.image
            ));
            *facts.staged.lock().unwrap_or_else(|p| p.into_inner()) = Some(staged);
        }
        Ok(None) => {}
        Err(err) => ctx.log(&format!("the staged upgrade in META is dropped: {err}")),
    }
    let replace = store.get(slate_meta::tags::REPLACE_ON_BOOT);
    match crate::boot::replace::at_boot(replace, &node.version) {
        crate::boot::replace::AtBoot::Nothing => {}
        crate::boot::replace::AtBoot::Replace(record) => {
            ctx.log(&format!(
                "this is the first boot of the replacement by {}: STATE and EPHEMERAL start \
                 afresh",
                record.version
            ));
            *facts.replace.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
        }
        crate::boot::replace::AtBoot::Drop(why) => {
            store.delete(slate_meta::tags::REPLACE_ON_BOOT);
            store
                .flush()
                .map_err(|e| failed(format!("deleting META ReplaceOnBoot: {e}")))?;
            ctx.log(&format!("META ReplaceOnBoot deleted: {why}"));
        }
    }
    *facts.system_disk.lock().unwrap_or_else(|p| p.into_inner()) = Some(part.disk);
    Ok(())
}

fn open_meta(part: &BlockPartition) -> Result<crate::base::system_disk::SystemMeta, TaskError> {
    crate::base::system_disk::open_meta_on(part, true)
        .map_err(|e| failed(format!("reading META: {e}")))
}

pub fn install<'a>(node: &'a Node, facts: &'a Facts) -> Sequence<'a> {
    let installed = facts.system_disk().is_some();
    let staged = facts
        .staged
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let builder = match staged.map(|s| crate::boot::upgrade::staged_plan(&s)) {
        Some(Ok(plan)) => {
            node.journal.info(format_args!(
                "running the staged upgrade to {}",
                plan.version
            ));
            crate::boot::upgrade::staged_phases(node, plan, PhaseListBuilder::new())
        }
        Some(Err(err)) => {
            node.journal.error(format_args!(
                "the staged upgrade cannot run: {err}; booting on"
            ));
            PhaseListBuilder::new()
        }
        None => PhaseListBuilder::new(),
    };
    builder
        .append_when(
            !installed,
            "install",
            [task(node, "install", |_| {
                Err(failed(
                    "no disk carries a slate installation (no META partition); \
                     install with `slate installer` first",
                ))
            })],
        )
        .into_sequence(SequenceKind::Install)
}

pub fn boot<'a>(
    node: &'a Node,
    facts: &'a Facts,
    start_api: impl FnOnce(&TaskContext<'_>) -> Result<SocketAddr, TaskError> + Send + 'a,
) -> Sequence<'a> {
    let disk = facts.system_disk();
    let disk2 = disk.clone();
    let snapshot_root = node.snapshot_root.as_ref();
    // Under systemd, slate's init mounted STATE, /var and /etc before systemd started, and
    // systemd brings up the network, runs the setup hooks and the services.
    let pid1 = node.host == Host::Pid1;
    let image_root = snapshot_root.is_none() && pid1;
    let replace = facts
        .replace
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .filter(|_| pid1);
    let mut config_tasks = vec![task(node, "machineConfig", move |ctx| {
        crate::boot::boot_config::machine_config(ctx, node, facts)
    })];
    // As soon as STATE is mounted: the API's TLS waits for the kernel's CRNG. (systemd keeps
    // its own seed.)
    if pid1 {
        config_tasks.push(task(node, "randomSeed", move |ctx| {
            crate::boot::random_seed::random_seed_task(ctx, &node.journal)
        }));
    }
    PhaseListBuilder::new()
        .append_when(
            replace.is_some(),
            "replace",
            crate::boot::replace::wipe_tasks(node, disk.clone()),
        )
        .append_when(
            snapshot_root.is_some(),
            "volumes",
            crate::boot::snapshot_volumes::volume_tasks(node),
        )
        .append_when(
            image_root,
            "volumes",
            [task(node, "mountState", move |ctx| {
                mount_volume(ctx, "STATE", disk.as_deref(), Path::new(STATE_MOUNT))
            })],
        )
        .append_when(
            replace.is_some(),
            "restore",
            crate::boot::replace::restore_tasks(node, replace.clone()),
        )
        .append("config", config_tasks)
        // After the machine configuration, whose `[var] mode` wins over the image's.
        .append_when(
            image_root,
            "var",
            [task(node, "mountEphemeral", move |ctx| {
                let config = node.machine.current();
                let mode = config
                    .as_ref()
                    .and_then(|c| c.var_mode())
                    .unwrap_or(facts.image_var);
                let recovery_key = config.map(|c| c.recovery_key()).unwrap_or_default();
                let var = match mount_var(ctx, disk2.as_deref(), mode, recovery_key) {
                    Ok(var) => var,
                    Err(Err(err)) => return Err(err),
                    // Rebooting would find the same volume and the same TPM: the node waits
                    // in maintenance mode (`locked`, after this sequence) for its owner.
                    Err(Ok(VarRefused(why))) => {
                        *node.var.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(refused_status(mode));
                        *facts.var_refused.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(why.clone());
                        return Err(failed(format!("/var was not mounted: {why}")));
                    }
                };
                *node.var.lock().unwrap_or_else(|p| p.into_inner()) = Some(var);
                Ok(())
            })],
        )
        .append_when(
            !pid1,
            "var",
            [task(node, "varByInit", move |ctx| {
                crate::boot::under_systemd::var_by_init(ctx, node, facts)
            })],
        )
        // A snapshot root's /etc is its own, writable and snapshotted with it.
        .append_when(
            image_root,
            "etc",
            [task(node, "etcOverlay", move |ctx| {
                crate::boot::etc::overlay_task(ctx, node, &crate::boot::etc::etc_keep_list(node))
            })],
        )
        .append(
            "configure",
            [task(node, "applyConfig", move |ctx| {
                crate::boot::boot_config::configure(ctx, node)
            })],
        )
        .append_when(
            pid1,
            "setup",
            [task(node, "setupHooks", move |ctx| {
                crate::boot::etc::setup_hooks_task(ctx, node)
            })],
        )
        .append(
            "network",
            [task(node, "network", move |ctx| {
                if pid1 {
                    crate::boot::network::network(ctx, node, facts)
                } else {
                    crate::boot::under_systemd::addresses(ctx, node)
                }
            })],
        )
        .append(
            "api",
            [task(node, "startApi", move |ctx| {
                // The server binds before `start_api` returns, so it accepts from here on.
                let addr = start_api(ctx)?;
                ctx.log(&format!("API listening on {addr}"));
                Ok(())
            })],
        )
        // Last: every milestone a service may wait for (network, /var, /etc) is reached.
        .append_when(
            pid1,
            "services",
            [task(node, "startServices", move |ctx| {
                crate::boot::services::start_task(ctx, node, &facts.image_services)
            })],
        )
        .into_sequence(SequenceKind::Boot)
}

/// Maintenance mode after /var was refused (a tpm2 volume this machine's TPM does not unlock,
/// no TPM, a volume the mode does not open): the network and the node API, nothing that could
/// write to /var — no setup hooks, no services, no commit. The operator reads why in `slate
/// status` and reboots, resets, or opens the disk elsewhere with the recovery key. Under
/// systemd, init refused it (/var is a tmpfs) and systemd-networkd has the network.
pub fn locked<'a>(
    node: &'a Node,
    facts: &'a Facts,
    start_api: impl FnOnce(&TaskContext<'_>) -> Result<SocketAddr, TaskError> + Send + 'a,
) -> Sequence<'a> {
    PhaseListBuilder::new()
        .append(
            "network",
            [task(node, "network", move |ctx| match node.host {
                Host::Pid1 => crate::boot::network::network(ctx, node, facts),
                Host::Systemd => crate::boot::under_systemd::addresses(ctx, node),
            })],
        )
        .append(
            "api",
            [task(node, "startApi", move |ctx| {
                let addr = start_api(ctx)?;
                ctx.log(&format!(
                    "maintenance mode: /var is locked; API listening on {addr} (slate status \
                     says why; slate reset wipes it)"
                ));
                Ok(())
            })],
        )
        .into_sequence(SequenceKind::Boot)
}

pub fn reboot(node: &Node, mode: RebootMode) -> Sequence<'_> {
    drain(node, PhaseListBuilder::new(), DrainReason::Reboot)
        .append(
            "reboot",
            [task(node, "reboot", move |_| {
                node.set_stage(Stage::Rebooting);
                Err(TaskError::Reboot(mode))
            })],
        )
        .into_sequence(SequenceKind::Reboot)
}

/// Shutdown (SIGTERM, SIGPWR, the power button): the handler's teardown, then power off.
pub fn shutdown(node: &Node) -> Sequence<'_> {
    drain(node, PhaseListBuilder::new(), DrainReason::Shutdown)
        .append(
            "shutdown",
            [task(node, "powerOff", move |_| {
                node.set_stage(Stage::ShuttingDown);
                Err(TaskError::Reboot(RebootMode::PowerOff))
            })],
        )
        .into_sequence(SequenceKind::Shutdown)
}

/// Reset: forget the node's state. STATE and EPHEMERAL are unmounted and their heads zeroed
/// (through the Disk trait), so the next boot formats them afresh; then reboot.
pub fn reset(node: &Node) -> Sequence<'_> {
    drain(node, PhaseListBuilder::new(), DrainReason::Reset)
        .append(
            "stage",
            [task(node, "announce", move |_| {
                node.set_stage(Stage::Resetting);
                Ok(())
            })],
        )
        .append(
            "unmountVolumes",
            [task(node, "unmount", |ctx| {
                // /etc first: its overlay keeps STATE busy.
                for target in [crate::boot::etc::ETC, EPHEMERAL_MOUNT, STATE_MOUNT] {
                    if slate_host::is_mount_point(Path::new(target))? {
                        slate_host::unmount(Path::new(target))?;
                        ctx.log(&format!("unmounted {target}"));
                    }
                }
                Ok(())
            })],
        )
        .append(
            "wipe",
            [
                task(node, "wipeState", |ctx| wipe_head(ctx, "STATE", None)),
                task(node, "wipeEphemeral", |ctx| {
                    // A tpm2 /var's key slots go first: a cryptographic erase.
                    erase_var(ctx, None)?;
                    wipe_head(ctx, "EPHEMERAL", None)
                }),
            ],
        )
        .append(
            "reboot",
            [task(node, "reboot", |_| {
                Err(TaskError::Reboot(RebootMode::Default))
            })],
        )
        .into_sequence(SequenceKind::Reset)
}

#[cfg(test)]
#[path = "sequences_tests.rs"]
mod tests;
