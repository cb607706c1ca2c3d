//! The sequences' shapes and what their tasks do without a machine.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use slate_sequencer::{error_chain, CancelToken, NullLogger, SequenceError};

use super::*;
use crate::boot::upgrade::{Staged, StagedOptions};

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

/// A Btrfs snapshot root: no META (Initialize opens the pool instead), `@state` and
/// `@home` mounted, and no /etc overlay (the snapshot's /etc is its own).
#[test]
fn a_snapshot_root_boots_without_meta_volumes_or_etc_overlay() {
    let (node, _requests) = Node::for_tests("");
    let root = crate::base::snapshot_root::SnapshotRoot {
        snapshot: slate_snapshot::SnapshotName::parse("root-20261202-054323").unwrap(),
        device: "/dev/vda2".into(),
        disk: "/dev/vda".into(),
    };
    let node = node.with_boot_facts(Host::Pid1, None, Some(root));
    let facts = installed();
    assert_eq!(
        shape(&initialize(&node, &facts)),
        [
            phase("systemRequirements", &["checkRequirements"]),
            phase("earlyServices", &["mountEfivars"]),
            phase("snapshotRoot", &["openSnapshotRoot"]),
            phase("config", &["loadConfig"]),
        ]
    );
    let sequence = boot(&node, &facts, |_| Ok("127.0.0.1:50000".parse().unwrap()));
    assert_eq!(
        shape(&sequence),
        [
            phase("volumes", &["mountState", "mountHome"]),
            phase("config", &["machineConfig", "randomSeed"]),
            phase("configure", &["applyConfig"]),
            phase("setup", &["setupHooks"]),
            phase("network", &["network"]),
            phase("api", &["startApi"]),
            phase("services", &["startServices"]),
        ]
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
            phase("volumes", &["mountState"]),
            phase("config", &["machineConfig", "randomSeed"]),
            phase("var", &["mountEphemeral"]),
            phase("etc", &["etcOverlay"]),
            phase("configure", &["applyConfig"]),
            phase("setup", &["setupHooks"]),
            phase("network", &["network"]),
            phase("api", &["startApi"]),
            phase("services", &["startServices"]),
        ]
    );
    // The first boot of a replacement: data partitions wiped before they are mounted (and
    // so formatted), the configuration restored before it is read.
    *facts.replace.lock().unwrap() =
        Some(slate_meta::replace::ReplaceOnBoot::new("2.0.0", "version = 1\n").unwrap());
    let sequence = boot(&node, &facts, |_| Ok("127.0.0.1:50000".parse().unwrap()));
    let phases = shape(&sequence);
    assert_eq!(
        phases[..5],
        [
            phase("replace", &["wipeState", "wipeEphemeral"]),
            phase("volumes", &["mountState"]),
            phase("restore", &["restoreConfig"]),
            phase("config", &["machineConfig", "randomSeed"]),
            phase("var", &["mountEphemeral"]),
        ]
    );
}

#[test]
fn reboot_asks_for_the_requested_mode() {
    let (node, _requests) = Node::for_tests("");
    for mode in [RebootMode::Default, RebootMode::Powercycle] {
        let sequence = reboot(&node, mode);
        assert_eq!(
            shape(&sequence),
            [phase("drain", &["drainNode"]), phase("reboot", &["reboot"])]
        );
        assert!(matches!(run(sequence), Err(SequenceError::Reboot { mode: m }) if m == mode));
        assert_eq!(node.stage(), Stage::Rebooting);
    }
}

#[test]
fn shutdown_powers_off() {
    let (node, _requests) = Node::for_tests("");
    let sequence = shutdown(&node);
    assert_eq!(sequence.kind(), SequenceKind::Shutdown);
    assert_eq!(
        shape(&sequence),
        [
            phase("drain", &["drainNode"]),
            phase("shutdown", &["powerOff"])
        ]
    );
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
            phase("drain", &["drainNode"]),
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
