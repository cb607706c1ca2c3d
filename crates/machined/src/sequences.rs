//! machined's sequences as phase lists, and their tasks. Ordering lives only in phase
//! boundaries: tasks of one phase run concurrently.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use slate_api::Stage;
use slate_host::BlockPartition;
use slate_meta::tag_name;
use slate_sequencer::{
    PhaseListBuilder, RebootMode, Sequence, SequenceKind, TaskContext, TaskError,
};

use super::node::Node;
use crate::task::{failed, task};
use crate::volumes::{mount_volume, wait_for_partition, wipe_head};

pub const STATE_MOUNT: &str = "/system/state";
pub const EPHEMERAL_MOUNT: &str = "/var";

/// What Initialize learns for the later sequences.
#[derive(Debug, Default)]
pub struct Facts {
    /// The disk holding META: slate is installed there.
    pub system_disk: Mutex<Option<PathBuf>>,
    /// A staged upgrade taken out of META (consumed: the tags are already gone).
    pub staged: Mutex<Option<super::upgrade::Staged>>,
    /// The armed watchdog: fed while the node waits in maintenance mode.
    pub watchdog: Option<std::sync::Arc<slate_host::Watchdog>>,
    /// The network was brought up with DHCP for maintenance mode already.
    pub network_up: std::sync::atomic::AtomicBool,
    /// This boot is an upgrade by replacement's first: its data partitions start afresh.
    pub replace: Mutex<Option<slate_meta::replace::ReplaceOnBoot>>,
}

impl Facts {
    fn system_disk(&self) -> Option<PathBuf> {
        self.system_disk
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

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
                snapshot_root_facts(ctx, node, facts)
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
    let part = match wait_for_partition(ctx, crate::system_disk::META_LABEL, None) {
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
    for line in super::records::load(node, |tag| store.get(tag)) {
        ctx.log(&line);
    }
    match super::upgrade::consume_staged(&mut store) {
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
    match super::replace::at_boot(replace, &node.version) {
        super::replace::AtBoot::Nothing => {}
        super::replace::AtBoot::Replace(record) => {
            ctx.log(&format!(
                "this is the first boot of the replacement by {}: STATE and EPHEMERAL start \
                 afresh",
                record.version
            ));
            *facts.replace.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
        }
        super::replace::AtBoot::Drop(why) => {
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

/// A snapshot root is installed on the pool's disk; what an upgrade interrupted by a power cut
/// left there is removed now, before anything else can stumble on it.
fn snapshot_root_facts(ctx: &TaskContext<'_>, node: &Node, facts: &Facts) -> Result<(), TaskError> {
    let Some(root) = &node.snapshot_root else {
        return Ok(());
    };
    ctx.log(&format!(
        "the root is Btrfs snapshot {} on {} (disk {}): no META, the snapshot engine settles \
         the boot",
        root.snapshot,
        root.device.display(),
        root.disk.display()
    ));
    crate::snapshot_root::clean_up(ctx, root)?;
    *facts.system_disk.lock().unwrap_or_else(|p| p.into_inner()) = Some(root.disk.clone());
    Ok(())
}

fn open_meta(part: &BlockPartition) -> Result<crate::system_disk::SystemMeta, TaskError> {
    crate::system_disk::open_meta_on(part, true).map_err(|e| failed(format!("reading META: {e}")))
}

pub fn install<'a>(node: &'a Node, facts: &'a Facts) -> Sequence<'a> {
    let installed = facts.system_disk().is_some();
    let staged = facts
        .staged
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let builder = match staged.map(|s| super::upgrade::staged_plan(&s)) {
        Some(Ok(plan)) => {
            node.journal.info(format_args!(
                "running the staged upgrade to {}",
                plan.version
            ));
            super::upgrade::staged_phases(node, plan, PhaseListBuilder::new())
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
    let replace = facts
        .replace
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    PhaseListBuilder::new()
        .append_when(
            replace.is_some(),
            "replace",
            super::replace::wipe_tasks(node, disk.clone()),
        )
        .append_when(
            snapshot_root.is_some(),
            "volumes",
            [
                task(node, "mountState", move |ctx| {
                    snapshot_root.map_or(Ok(()), |root| {
                        let state = crate::snapshot_root::STATE_SUBVOLUME;
                        crate::snapshot_root::mount_subvolume(
                            ctx,
                            root,
                            state,
                            Path::new(STATE_MOUNT),
                        )
                    })
                }),
                task(node, "mountHome", move |ctx| {
                    snapshot_root.map_or(Ok(()), |root| {
                        let home = crate::snapshot_root::HOME_SUBVOLUME;
                        crate::snapshot_root::mount_subvolume(ctx, root, home, Path::new("/home"))
                    })
                }),
            ],
        )
        .append_when(
            snapshot_root.is_none(),
            "volumes",
            [
                task(node, "mountState", move |ctx| {
                    mount_volume(ctx, "STATE", disk.as_deref(), Path::new(STATE_MOUNT))
                }),
                task(node, "mountEphemeral", move |ctx| {
                    mount_volume(
                        ctx,
                        "EPHEMERAL",
                        disk2.as_deref(),
                        Path::new(EPHEMERAL_MOUNT),
                    )
                }),
            ],
        )
        .append_when(
            replace.is_some(),
            "restore",
            super::replace::restore_tasks(node, replace.clone()),
        )
        .append(
            "config",
            [task(node, "machineConfig", move |ctx| {
                crate::boot_config::machine_config(ctx, node, facts)
            })],
        )
        // A snapshot root's /etc is its own, writable and snapshotted with it.
        .append_when(
            snapshot_root.is_none(),
            "etc",
            [task(node, "etcOverlay", move |ctx| {
                crate::etc::overlay_task(ctx, node, &crate::etc::etc_keep_list(node))
            })],
        )
        .append(
            "configure",
            [task(node, "applyConfig", move |ctx| {
                crate::boot_config::configure(ctx, node)
            })],
        )
        .append(
            "setup",
            [task(node, "setupHooks", move |ctx| {
                crate::etc::setup_hooks_task(ctx, node)
            })],
        )
        .append(
            "network",
            [task(node, "network", move |ctx| {
                crate::network::network(ctx, node, facts)
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
        .into_sequence(SequenceKind::Boot)
}

pub fn reboot(node: &Node, mode: RebootMode) -> Sequence<'_> {
    PhaseListBuilder::new()
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
    PhaseListBuilder::new()
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
    PhaseListBuilder::new()
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
                for target in [crate::etc::ETC, EPHEMERAL_MOUNT, STATE_MOUNT] {
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
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use slate_sequencer::{error_chain, CancelToken, NullLogger, SequenceError};

    use super::super::upgrade::{Staged, StagedOptions};
    use super::*;

    /// Each phase's name and its tasks' names, in order.
    fn shape(sequence: &Sequence<'_>) -> Vec<(String, Vec<String>)> {
        sequence
            .phases()
            .iter()
            .map(|p| {
                let tasks = p.tasks().iter().map(|t| t.name().to_owned()).collect();
                (p.name().to_owned(), tasks)
            })
            .collect()
    }

    fn phase(name: &str, tasks: &[&str]) -> (String, Vec<String>) {
        (
            name.to_owned(),
            tasks.iter().map(|t| (*t).to_owned()).collect(),
        )
    }

    fn installed() -> Facts {
        let facts = Facts::default();
        *facts.system_disk.lock().unwrap() = Some(PathBuf::from("/dev/vda"));
        facts
    }

    fn run(sequence: Sequence<'_>) -> Result<(), SequenceError> {
        sequence.run(&CancelToken::new(), &NullLogger)
    }

    #[test]
    fn initialize_checks_mounts_efivars_reads_meta_then_config() {
        let (node, _requests) = Node::for_tests("");
        let facts = Facts::default();
        let sequence = initialize(&node, &facts);
        assert_eq!(sequence.kind(), SequenceKind::Initialize);
        assert_eq!(
            shape(&sequence),
            [
                phase("systemRequirements", &["checkRequirements"]),
                phase("earlyServices", &["mountEfivars"]),
                phase("meta", &["loadMeta"]),
                phase("config", &["loadConfig"]),
            ]
        );
    }

    #[test]
    fn install_refuses_a_node_without_a_slate_disk() {
        let (node, _requests) = Node::for_tests("");
        let facts = Facts::default();
        let sequence = install(&node, &facts);
        assert_eq!(shape(&sequence), [phase("install", &["install"])]);
        let err = run(sequence).unwrap_err();
        assert!(
            error_chain(&err).ends_with(
                "no disk carries a slate installation (no META partition); \
                 install with `slate installer` first"
            ),
            "{err}"
        );
    }

    #[test]
    fn install_has_nothing_to_do_on_an_installed_node() {
        let (node, _requests) = Node::for_tests("");
        let facts = installed();
        let sequence = install(&node, &facts);
        assert_eq!(sequence.kind(), SequenceKind::Install);
        assert!(shape(&sequence).is_empty());
        run(sequence).unwrap();
    }

    fn staged(image: &str) -> Staged {
        Staged {
            image: image.into(),
            options: StagedOptions {
                version: "4.0.0".into(),
                tries: 3,
                allow_downgrade: false,
            },
        }
    }

    #[test]
    fn a_staged_upgrade_runs_in_install_once_then_is_gone() {
        let (node, _requests) = Node::for_tests("");
        let facts = installed();
        let image = format!("bundle:sha256:{}", "a".repeat(64));
        *facts.staged.lock().unwrap() = Some(staged(&image));
        let sequence = install(&node, &facts);
        let phases = shape(&sequence);
        assert_eq!(
            phases.first(),
            Some(&phase("stagedVolumes", &["mountEphemeral"]))
        );
        assert_eq!(phases.last(), Some(&phase("reboot", &["reboot"])));
        // Taken out of the facts: a second Install would not run it again.
        assert!(facts.staged.lock().unwrap().is_none());
        assert!(shape(&install(&node, &facts)).is_empty());
    }

    #[test]
    fn a_staged_upgrade_that_cannot_run_is_dropped_and_the_boot_goes_on() {
        let (node, _requests) = Node::for_tests("");
        let facts = installed();
        *facts.staged.lock().unwrap() = Some(staged("registry.example/slate:4.0.0"));
        let sequence = install(&node, &facts);
        assert!(shape(&sequence).is_empty());
        let lines = node.journal.read_from(0, None).0;
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("error: the staged upgrade cannot run: ")
                    && l.ends_with("; booting on")),
            "{lines:?}"
        );
    }

    #[test]
    fn boot_mounts_volumes_reads_the_config_sets_up_etc_then_network_then_the_api() {
        let (node, _requests) = Node::for_tests("");
        let facts = installed();
        let sequence = boot(&node, &facts, |_| Ok("127.0.0.1:50000".parse().unwrap()));
        assert_eq!(sequence.kind(), SequenceKind::Boot);
        assert_eq!(
            shape(&sequence),
            [
                phase("volumes", &["mountState", "mountEphemeral"]),
                phase("config", &["machineConfig"]),
                phase("etc", &["etcOverlay"]),
                phase("configure", &["applyConfig"]),
                phase("setup", &["setupHooks"]),
                phase("network", &["network"]),
                phase("api", &["startApi"]),
            ]
        );
        // The first boot of a replacement: data partitions wiped before they are mounted (and
        // so formatted), the configuration restored before it is read.
        *facts.replace.lock().unwrap() =
            Some(slate_meta::replace::ReplaceOnBoot::new("2.0.0", "version = 1\n").unwrap());
        let sequence = boot(&node, &facts, |_| Ok("127.0.0.1:50000".parse().unwrap()));
        let phases = shape(&sequence);
        assert_eq!(
            phases[..4],
            [
                phase("replace", &["wipeState", "wipeEphemeral"]),
                phase("volumes", &["mountState", "mountEphemeral"]),
                phase("restore", &["restoreConfig"]),
                phase("config", &["machineConfig"]),
            ]
        );
    }

    #[test]
    fn reboot_asks_for_the_requested_mode() {
        let (node, _requests) = Node::for_tests("");
        for mode in [RebootMode::Default, RebootMode::Powercycle] {
            let sequence = reboot(&node, mode);
            assert_eq!(shape(&sequence), [phase("reboot", &["reboot"])]);
            assert!(matches!(run(sequence), Err(SequenceError::Reboot { mode: m }) if m == mode));
            assert_eq!(node.stage(), Stage::Rebooting);
        }
    }

    #[test]
    fn shutdown_powers_off() {
        let (node, _requests) = Node::for_tests("");
        let sequence = shutdown(&node);
        assert_eq!(sequence.kind(), SequenceKind::Shutdown);
        assert_eq!(shape(&sequence), [phase("shutdown", &["powerOff"])]);
        assert!(matches!(
            run(sequence),
            Err(SequenceError::Reboot {
                mode: RebootMode::PowerOff
            })
        ));
        assert_eq!(node.stage(), Stage::ShuttingDown);
    }

    #[test]
    fn reset_unmounts_before_wiping_and_reboots_last() {
        let (node, _requests) = Node::for_tests("");
        let sequence = reset(&node);
        assert_eq!(sequence.kind(), SequenceKind::Reset);
        assert_eq!(
            shape(&sequence),
            [
                phase("stage", &["announce"]),
                phase("unmountVolumes", &["unmount"]),
                phase("wipe", &["wipeState", "wipeEphemeral"]),
                phase("reboot", &["reboot"]),
            ]
        );
    }

    #[test]
    fn a_task_named_by_fail_task_fails_without_running() {
        let (node, _requests) = Node::for_tests("slate.debug.fail-task=mountState");
        let ran = AtomicBool::new(false);
        let sequence = PhaseListBuilder::new()
            .append(
                "volumes",
                [task(&node, "mountState", |_| {
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                })],
            )
            .into_sequence(SequenceKind::Boot);
        assert_eq!(
            error_chain(&run(sequence).unwrap_err()),
            "boot sequence: phase volumes: task mountState failed: \
             fault injected by slate.debug.fail-task=mountState"
        );
        assert!(!ran.load(Ordering::SeqCst));
        // Any other task runs its body.
        let sequence = PhaseListBuilder::new()
            .append(
                "volumes",
                [task(&node, "mountEphemeral", |_| Err(failed("own")))],
            )
            .into_sequence(SequenceKind::Boot);
        assert!(error_chain(&run(sequence).unwrap_err()).ends_with("failed: own"));
    }
}
