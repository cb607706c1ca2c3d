//! The decision table: every case of an A/B disk and of a snapshot root.

use super::*;

const V1: &str = "slate-1.0.0.efi";
const V2_FIRST_TRY: &str = "slate-2.0.0+2-1.efi";
const V2_BLESSED: &str = "slate-2.0.0.efi";

fn running() -> Phase {
    Phase::Running {
        health: HealthOutcome::Passed,
    }
}

fn facts(
    phase: Phase,
    booted: Option<&str>,
    marker: Option<&str>,
    default: Option<&str>,
) -> BootFacts {
    BootFacts {
        phase,
        booted_entry: booted.map(str::to_owned),
        loader: LoaderFacts::Read {
            upgrade_marker: marker.map(str::to_owned),
            default_entry: default.map(str::to_owned),
        },
    }
}

fn commit(entry: &str, upgrade: Upgrade) -> Decision {
    Decision::Commit {
        entry: entry.to_owned(),
        upgrade,
    }
}

fn succeeded(fallback: &str) -> Upgrade {
    Upgrade::Succeeded {
        fallback: fallback.to_owned(),
    }
}

// Stage Running, systemd-boot.

#[test]
fn a_healthy_upgraded_entry_on_its_first_try_is_committed() {
    let f = facts(running(), Some(V2_FIRST_TRY), Some(V1), Some(V2_FIRST_TRY));
    assert_eq!(decide(&f), commit(V2_FIRST_TRY, succeeded(V1)));
}

#[test]
fn the_upgrade_is_committed_whatever_tries_are_left() {
    for default in ["slate-2.0.0+1-2.efi", "slate-2.0.0+0-3.efi", V2_BLESSED] {
        let f = facts(running(), Some(default), Some(V1), Some(default));
        assert_eq!(decide(&f), commit(default, succeeded(V1)), "{default}");
    }
}

#[test]
fn a_counted_default_without_a_marker_is_committed_the_first_boot_after_install() {
    let f = facts(running(), Some(V2_FIRST_TRY), None, Some(V2_FIRST_TRY));
    assert_eq!(decide(&f), commit(V2_FIRST_TRY, Upgrade::NonePending));
    // With no tries left the counter is still dropped.
    let f = facts(running(), Some(V1), None, Some("slate-1.0.0+0-3.efi"));
    assert_eq!(decide(&f), commit(V1, Upgrade::NonePending));
}

#[test]
fn a_blessed_default_without_a_marker_needs_nothing() {
    let f = facts(running(), Some(V1), None, Some(V1));
    assert_eq!(decide(&f), Decision::Nothing(Idle::AlreadyCommitted));
    // Which entry booted does not matter when nothing is pending.
    let f = facts(running(), Some(V2_FIRST_TRY), None, Some(V1));
    assert_eq!(decide(&f), Decision::Nothing(Idle::AlreadyCommitted));
}

#[test]
fn the_fallback_booting_means_the_upgrade_already_failed_and_is_closed() {
    // Boot counting spent v2's tries; the glob fell back to v1, which now boots.
    let f = facts(running(), Some(V1), Some(V1), Some(V1));
    assert_eq!(
        decide(&f),
        commit(
            V1,
            Upgrade::AlreadyFailed {
                fallback: V1.into()
            }
        )
    );
}

#[test]
fn booted_and_marker_are_compared_without_boot_counters_or_case() {
    // sd-boot 252's LoaderEntrySelected keeps the counter; META has the name at upgrade
    // time; IDs are lower-cased.
    for (booted, marker) in [
        ("slate-1.0.0+1-2.efi", "slate-1.0.0+2-1.efi"),
        ("slate-1.0.0.efi", "slate-1.0.0+2-1.efi"),
        ("slate-1.0.0.efi", "Slate-1.0.0.EFI"),
    ] {
        let f = facts(running(), Some(booted), Some(marker), Some(booted));
        assert_eq!(
            decide(&f),
            commit(
                booted,
                Upgrade::AlreadyFailed {
                    fallback: marker.into()
                }
            ),
            "{booted} vs {marker}"
        );
    }
    // Another version is another entry, counter or not.
    let f = facts(running(), Some("slate-1.0.1.efi"), Some(V1), Some(V1));
    assert_eq!(decide(&f), commit("slate-1.0.1.efi", succeeded(V1)));
}

#[test]
fn an_empty_marker_is_dropped_with_the_commit() {
    let f = facts(running(), Some(V1), Some(""), Some(V1));
    assert_eq!(decide(&f), commit(V1, Upgrade::EmptyMarker));
}

#[test]
fn an_unhealthy_boot_is_never_committed() {
    let report = "health check `file /ready` failed: missing (3 attempts in 1.0s)";
    let unhealthy = Phase::Running {
        health: HealthOutcome::Failed(report.into()),
    };
    let expected = Decision::Refuse(Refusal::Unhealthy(report.into()));
    for (booted, marker, default) in [
        (Some(V2_FIRST_TRY), Some(V1), Some(V2_FIRST_TRY)),
        (Some(V1), None, Some(V1)),
        (None, None, None),
    ] {
        assert_eq!(
            decide(&facts(unhealthy.clone(), booted, marker, default)),
            expected
        );
    }
    // Health is reported before an unreadable loader.
    let f = BootFacts {
        phase: unhealthy,
        booted_entry: None,
        loader: LoaderFacts::Unavailable("no META partition".into()),
    };
    assert_eq!(decide(&f), expected);
    assert_eq!(Refusal::Unhealthy(report.into()).to_string(), report);
}

#[test]
fn an_unknown_booted_entry_refuses_the_commit() {
    let f = facts(running(), None, Some(V1), Some(V2_FIRST_TRY));
    assert_eq!(decide(&f), Decision::Refuse(Refusal::BootedEntryUnknown));
    // Even when nothing would be written: machined cannot tell.
    let f = facts(running(), None, None, Some(V1));
    assert_eq!(decide(&f), Decision::Refuse(Refusal::BootedEntryUnknown));
}

#[test]
fn a_loader_that_boots_nothing_refuses_the_commit() {
    let f = facts(running(), Some(V1), Some(V1), None);
    assert_eq!(decide(&f), Decision::Refuse(Refusal::NothingBootable));
    // The booted entry is checked first.
    let f = facts(running(), None, None, None);
    assert_eq!(decide(&f), Decision::Refuse(Refusal::BootedEntryUnknown));
}

#[test]
fn an_unreadable_loader_refuses_the_commit_before_anything_else() {
    for loader in [
        LoaderFacts::Unavailable("no partition labelled META".into()),
        LoaderFacts::Unreadable("EFI partition: not FAT".into()),
    ] {
        let (LoaderFacts::Unavailable(reason) | LoaderFacts::Unreadable(reason)) = &loader else {
            unreachable!()
        };
        let f = BootFacts {
            phase: running(),
            booted_entry: None,
            loader: loader.clone(),
        };
        assert_eq!(
            decide(&f),
            Decision::Refuse(Refusal::Loader(reason.clone()))
        );
    }
}

// Stage Running, GRUB (slots, no boot counters).

#[test]
fn grub_commits_the_new_slot_of_a_pending_upgrade() {
    let f = facts(running(), Some("B"), Some("A"), Some("B"));
    assert_eq!(decide(&f), commit("B", succeeded("A")));
}

#[test]
fn grub_closes_an_upgrade_whose_one_shot_fell_back() {
    let f = facts(running(), Some("A"), Some("A"), Some("A"));
    assert_eq!(
        decide(&f),
        commit(
            "A",
            Upgrade::AlreadyFailed {
                fallback: "A".into()
            }
        )
    );
}

#[test]
fn grub_without_a_marker_needs_nothing() {
    // Slot labels carry no counter: nothing is on trial.
    let f = facts(running(), Some("B"), None, Some("B"));
    assert_eq!(decide(&f), Decision::Nothing(Idle::AlreadyCommitted));
}

// The fatal path.

#[test]
fn a_failed_upgrade_is_reverted_to_the_marker() {
    let f = facts(
        Phase::Fatal,
        Some(V2_FIRST_TRY),
        Some(V1),
        Some(V2_FIRST_TRY),
    );
    assert_eq!(
        decide(&f),
        Decision::Revert {
            failed: V2_FIRST_TRY.into(),
            to: V1.into()
        }
    );
    let f = facts(Phase::Fatal, Some("B"), Some("A"), Some("B"));
    assert_eq!(
        decide(&f),
        Decision::Revert {
            failed: "B".into(),
            to: "A".into()
        }
    );
}

#[test]
fn the_default_entry_does_not_matter_on_the_fatal_path() {
    let f = facts(Phase::Fatal, Some("B"), Some("A"), None);
    assert!(matches!(decide(&f), Decision::Revert { .. }));
    let f = facts(Phase::Fatal, Some(V1), None, Some(V2_FIRST_TRY));
    assert_eq!(decide(&f), Decision::Nothing(Idle::NoUpgradePending));
}

#[test]
fn without_a_marker_a_fatal_error_reverts_nothing() {
    for booted in [V1, V2_FIRST_TRY, "A"] {
        let f = facts(Phase::Fatal, Some(booted), None, Some(booted));
        assert_eq!(decide(&f), Decision::Nothing(Idle::NoUpgradePending));
    }
}

#[test]
fn a_failing_fallback_is_kept_the_upgrade_already_failed() {
    for (booted, marker) in [(V1, V1), ("slate-1.0.0+1-2.efi", V1), ("A", "A")] {
        let f = facts(Phase::Fatal, Some(booted), Some(marker), Some(booted));
        assert_eq!(
            decide(&f),
            Decision::KeepFallback {
                entry: booted.into()
            },
            "{booted} vs {marker}"
        );
    }
}

#[test]
fn an_empty_marker_is_only_dropped_on_the_fatal_path() {
    let f = facts(Phase::Fatal, Some("B"), Some(""), Some("B"));
    assert_eq!(decide(&f), Decision::DropEmptyMarker { failed: "B".into() });
}

#[test]
fn an_unknown_booted_entry_refuses_the_revert() {
    let f = facts(Phase::Fatal, None, Some(V1), Some(V2_FIRST_TRY));
    assert_eq!(decide(&f), Decision::Refuse(Refusal::BootedEntryUnknown));
    // Even with no marker: machined used to learn that only from the revert itself.
    let f = facts(Phase::Fatal, None, None, Some(V1));
    assert_eq!(decide(&f), Decision::Refuse(Refusal::BootedEntryUnknown));
}

#[test]
fn on_the_fatal_path_an_unopened_loader_comes_first_an_unread_one_after_the_booted_entry() {
    let f = BootFacts {
        phase: Phase::Fatal,
        booted_entry: None,
        loader: LoaderFacts::Unavailable("no partition labelled META".into()),
    };
    assert_eq!(
        decide(&f),
        Decision::Refuse(Refusal::Loader("no partition labelled META".into()))
    );
    let unread = LoaderFacts::Unreadable("GRUB environment block".into());
    let f = BootFacts {
        phase: Phase::Fatal,
        booted_entry: None,
        loader: unread.clone(),
    };
    assert_eq!(decide(&f), Decision::Refuse(Refusal::BootedEntryUnknown));
    let f = BootFacts {
        phase: Phase::Fatal,
        booted_entry: Some("B".into()),
        loader: unread,
    };
    assert_eq!(
        decide(&f),
        Decision::Refuse(Refusal::Loader("GRUB environment block".into()))
    );
}

#[test]
fn refusals_read_as_machined_has_always_reported_them() {
    assert_eq!(
        Refusal::BootedEntryUnknown.to_string(),
        "the firmware did not say which entry booted (LoaderEntrySelected)"
    );
    assert_eq!(
        Refusal::NothingBootable.to_string(),
        "the boot loader would boot nothing on this disk"
    );
    assert_eq!(
        Refusal::Loader("opening /dev/vda: gone".into()).to_string(),
        "opening /dev/vda: gone"
    );
}

#[test]
fn entries_compare_by_slot_or_by_id_without_counter() {
    assert!(same_entry("A", "A"));
    assert!(!same_entry("A", "B"));
    assert!(same_entry("slate-1.0.0+3.efi", "slate-1.0.0+0-3.efi"));
    assert!(!same_entry("slate-1.0.0.efi", "slate-1.0.1.efi"));
    assert!(!same_entry("slate-1.0.0.efi", "A"));
    assert!(on_trial("slate-1.0.0+3.efi"));
    assert!(!on_trial("slate-1.0.0.efi"));
    assert!(!on_trial("A"));
}

// A snapshot root: the same decisions from the snapshot engine's facts.

const SNAP: &str = "root-20261202-054323";
const SNAP_BEFORE: &str = "root-20261201-101010";

fn snapshot_facts(phase: Phase, state: Option<BootState>, fallback: Option<&str>) -> BootFacts {
    BootFacts {
        phase,
        booted_entry: Some(SNAP.to_owned()),
        loader: LoaderFacts::of_snapshot(SNAP, state, fallback),
    }
}

#[test]
fn a_snapshot_on_trial_is_committed_when_healthy_and_reverted_when_fatal() {
    let f = snapshot_facts(running(), Some(BootState::Indeterminate), Some(SNAP_BEFORE));
    assert_eq!(decide(&f), commit(SNAP, succeeded(SNAP_BEFORE)));
    let f = snapshot_facts(
        Phase::Fatal,
        Some(BootState::Indeterminate),
        Some(SNAP_BEFORE),
    );
    assert_eq!(
        decide(&f),
        Decision::Revert {
            failed: SNAP.into(),
            to: SNAP_BEFORE.into()
        }
    );
    // No fallback: the engine's rollback is still asked, and says why it cannot.
    let f = snapshot_facts(Phase::Fatal, Some(BootState::Indeterminate), None);
    assert_eq!(
        decide(&f),
        Decision::DropEmptyMarker {
            failed: SNAP.into()
        }
    );
}

#[test]
fn a_good_snapshot_is_committed_already_and_never_reverted() {
    let f = snapshot_facts(running(), Some(BootState::Good), Some(SNAP_BEFORE));
    assert_eq!(decide(&f), Decision::Nothing(Idle::AlreadyCommitted));
    let f = snapshot_facts(Phase::Fatal, Some(BootState::Good), Some(SNAP_BEFORE));
    assert_eq!(decide(&f), Decision::Nothing(Idle::NoUpgradePending));
}

#[test]
fn a_bad_snapshot_that_booted_healthy_is_blessed_but_a_fatal_one_is_left_alone() {
    let f = snapshot_facts(running(), Some(BootState::Bad), None);
    assert_eq!(decide(&f), commit(SNAP, Upgrade::NonePending));
    let f = snapshot_facts(Phase::Fatal, Some(BootState::Bad), None);
    assert_eq!(decide(&f), Decision::Nothing(Idle::NoUpgradePending));
}

#[test]
fn an_unhealthy_snapshot_is_not_committed_and_one_without_an_entry_boots_nothing() {
    let unhealthy = Phase::Running {
        health: HealthOutcome::Failed("health check `file /x` failed".into()),
    };
    let f = snapshot_facts(unhealthy, Some(BootState::Indeterminate), Some(SNAP_BEFORE));
    assert_eq!(
        decide(&f),
        Decision::Refuse(Refusal::Unhealthy("health check `file /x` failed".into()))
    );
    let f = snapshot_facts(running(), None, None);
    assert_eq!(decide(&f), Decision::Refuse(Refusal::NothingBootable));
    let f = snapshot_facts(Phase::Fatal, None, None);
    assert_eq!(decide(&f), Decision::Nothing(Idle::NoUpgradePending));
}

#[test]
fn a_counted_systemd_boot_snapshot_entry_keeps_its_own_counter() {
    let entry = format!("{SNAP}+2-1.conf");
    assert_eq!(
        LoaderFacts::of_snapshot(&entry, Some(BootState::Indeterminate), Some(SNAP_BEFORE)),
        LoaderFacts::Read {
            upgrade_marker: Some(SNAP_BEFORE.into()),
            default_entry: Some(entry.clone()),
        }
    );
}

/// What a commit and a revert add to the kept outcome counters (`/metrics`).
#[test]
fn a_commit_and_a_revert_say_what_they_count() {
    let fallback = || "slate-1.0.0.efi".to_owned();
    assert_eq!(
        Upgrade::Succeeded {
            fallback: fallback()
        }
        .counted(),
        &[("upgrades", "committed")]
    );
    assert_eq!(
        Upgrade::AlreadyFailed {
            fallback: fallback()
        }
        .counted(),
        &[("upgrades", "reverted"), ("rollbacks", "fallback")]
    );
    assert!(Upgrade::NonePending.counted().is_empty());
    assert!(Upgrade::EmptyMarker.counted().is_empty());
    assert_eq!(
        REVERT_COUNTED,
        &[("upgrades", "reverted"), ("rollbacks", "reverted")]
    );
}
