//! The upgrade transaction's decision — commit the booted entry, revert to the recorded
//! fallback, or leave the loader alone — as a pure function of what machined observed
//! (Bottlerocket's signpost style). `transaction.rs` gathers the [`BootFacts`] (META's
//! `Upgrade` marker and the loader's default through the bootloader backend, the booted entry
//! from `slate.entry=` after a kexec, else `LoaderEntrySelected`, else GRUB's `slate.slot=`, the
//! health checks' verdict) and executes
//! the [`Decision`]; nothing here does I/O, so every case is a unit test.
//!
//! Entry names are those of both loaders: systemd-boot UKI file names or entry IDs
//! (`slate-2.0.0+2-1.efi`, `slate-1.0.0.efi`), GRUB slot labels (`A`, `B`).

use slate_bootspec::{BootState, EntryName, IdStyle};
use slate_metrics::node_counters as kept;

/// When machined decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Stage Running: the boot sequences passed and the health checks ran.
    Running { health: HealthOutcome },
    /// A fatal error: the node is on its way down.
    Fatal,
}

/// The health checks' verdict at stage Running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthOutcome {
    /// Every check passed, or the image configures none.
    Passed,
    /// A check failed; its report (``health check `file /x` failed: …``).
    Failed(String),
}

/// What the system disk's boot loader says, or why it could not be asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoaderFacts {
    /// No backend to ask: no META partition, the disk does not open, the layout is unknown.
    Unavailable(String),
    /// The backend opened, but its state could not be read.
    Unreadable(String),
    Read {
        /// META `Upgrade`: while an upgrade is uncommitted, the entry to fall back to
        /// (systemd-boot: the UKI file name as it was when the upgrade ran; GRUB: the slot).
        upgrade_marker: Option<String>,
        /// The entry the loader boots by default (systemd-boot: the selection model's pick,
        /// carrying its boot counter `+LEFT[-DONE]` while on trial; GRUB: the slot, never
        /// counted). `None`: it would boot nothing.
        default_entry: Option<String>,
    },
}

impl LoaderFacts {
    /// A snapshot root's loader, in the terms of an A/B disk's: the snapshot engine keeps the
    /// booted entry's state itself and there is no META marker, so an entry on trial stands
    /// for a pending upgrade whose marker names the engine's fallback (empty: none), and a
    /// state other than good carries a counter (`+0` where the loader's own name has none,
    /// as under GRUB, whose trials the engine records). No entry at all boots nothing.
    pub fn of_snapshot(entry: &str, state: Option<BootState>, fallback: Option<&str>) -> Self {
        let counted = || {
            if on_trial(entry) {
                entry.to_owned()
            } else {
                format!("{entry}+0")
            }
        };
        let (upgrade_marker, default_entry) = match state {
            None => (None, None),
            Some(BootState::Good) => (None, Some(entry.to_owned())),
            Some(BootState::Indeterminate) => (
                Some(fallback.unwrap_or_default().to_owned()),
                Some(counted()),
            ),
            Some(BootState::Bad) => (None, Some(counted())),
        };
        LoaderFacts::Read {
            upgrade_marker,
            default_entry,
        }
    }
}

/// Everything the decision depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFacts {
    pub phase: Phase,
    /// The entry that booted: `slate.entry=` on the kernel command line when machined's kexec
    /// started it, else `LoaderEntrySelected` (systemd-boot's entry ID), else the
    /// `slate.slot=` GRUB's menu entry puts on the kernel command line. `None`: unknown.
    pub booted_entry: Option<String>,
    pub loader: LoaderFacts,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Bless `entry` — systemd-boot: drop its boot counter (left alone it would count down to
    /// "bad" over later boots); GRUB: make it `saved_entry` — then delete the marker if set.
    Commit { entry: String, upgrade: Upgrade },
    /// The upgrade failed: mark `failed` bad (systemd-boot) or stop naming it (GRUB) so `to`
    /// boots next, then delete the marker.
    Revert { failed: String, to: String },
    /// The entry that failed is the recorded fallback itself: there is nothing older to go
    /// back to, so the backend's revert only keeps it the default and deletes the marker.
    KeepFallback { entry: String },
    /// The marker is set but empty (it names nothing to return to): the backend's revert
    /// only deletes it.
    DropEmptyMarker { failed: String },
    /// Nothing to write.
    Nothing(Idle),
    /// No decision can be taken: at Running the boot fails (it is not committed), on the
    /// fatal path the revert does.
    Refuse(Refusal),
}

/// What a commit ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    /// No marker: only a boot counter is dropped (the first boot after an install).
    NonePending,
    /// The booted entry is the new version and it is healthy: the upgrade from `fallback`
    /// succeeded.
    Succeeded { fallback: String },
    /// The booted entry is the fallback: the upgrade already failed before this boot (boot
    /// counting or GRUB's one-shot brought the old version back) and the commit closes it.
    AlreadyFailed { fallback: String },
    /// An empty marker, deleted with the commit.
    EmptyMarker,
}

/// What a revert adds to the node's kept outcome counters (`/metrics`): the version on trial
/// did not stay, and a failing boot went back.
pub const REVERT_COUNTED: &[(&str, &str)] =
    &[(kept::UPGRADES, "reverted"), (kept::ROLLBACKS, "reverted")];

impl Upgrade {
    /// What this commit adds to the node's kept outcome counters: the version on trial
    /// stayed, or the older one came back in its stead (boot counting's fallback).
    pub fn counted(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            Upgrade::Succeeded { .. } => &[(kept::UPGRADES, "committed")],
            Upgrade::AlreadyFailed { .. } => {
                &[(kept::UPGRADES, "reverted"), (kept::ROLLBACKS, "fallback")]
            }
            Upgrade::NonePending | Upgrade::EmptyMarker => &[],
        }
    }
}

/// Why nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// At Running: no marker, and the default entry carries no boot counter.
    AlreadyCommitted,
    /// On the fatal path: no upgrade is pending, so there is no other version to return to.
    NoUpgradePending,
}

/// Why no decision could be taken. Displayed as machined has always reported it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A health check failed: this boot is not committed.
    #[error("{0}")]
    Unhealthy(String),
    /// The loader could not be opened or read.
    #[error("{0}")]
    Loader(String),
    /// Neither `slate.entry=`, `LoaderEntrySelected` nor `slate.slot=` says which entry
    /// booted.
    #[error("the firmware did not say which entry booted (LoaderEntrySelected)")]
    BootedEntryUnknown,
    /// The loader's model boots no entry at all.
    #[error("the boot loader would boot nothing on this disk")]
    NothingBootable,
}

/// The decision for `facts`.
pub fn decide(facts: &BootFacts) -> Decision {
    match &facts.phase {
        Phase::Running { health } => at_running(health, facts),
        Phase::Fatal => at_fatal(facts),
    }
}

/// Commit only a healthy boot; commit when an upgrade is pending or the default entry is still
/// on trial, else there is nothing to write. When several facts are missing, the first
/// reported is the one machined always reported first: health, loader, booted entry, default.
fn at_running(health: &HealthOutcome, facts: &BootFacts) -> Decision {
    if let HealthOutcome::Failed(report) = health {
        return Decision::Refuse(Refusal::Unhealthy(report.clone()));
    }
    let (marker, default) = match &facts.loader {
        LoaderFacts::Unavailable(reason) | LoaderFacts::Unreadable(reason) => {
            return Decision::Refuse(Refusal::Loader(reason.clone()))
        }
        LoaderFacts::Read {
            upgrade_marker,
            default_entry,
        } => (upgrade_marker.as_deref(), default_entry.as_deref()),
    };
    let Some(booted) = facts.booted_entry.as_deref() else {
        return Decision::Refuse(Refusal::BootedEntryUnknown);
    };
    let Some(default) = default else {
        return Decision::Refuse(Refusal::NothingBootable);
    };
    let upgrade = match marker {
        None if !on_trial(default) => return Decision::Nothing(Idle::AlreadyCommitted),
        None => Upgrade::NonePending,
        Some("") => Upgrade::EmptyMarker,
        Some(fallback) if same_entry(booted, fallback) => Upgrade::AlreadyFailed {
            fallback: fallback.to_owned(),
        },
        Some(fallback) => Upgrade::Succeeded {
            fallback: fallback.to_owned(),
        },
    };
    Decision::Commit {
        entry: booted.to_owned(),
        upgrade,
    }
}

/// Revert only a pending upgrade. The order of complaints follows the backend's own: it is
/// opened before the booted entry is needed, and its state is read by the revert itself.
fn at_fatal(facts: &BootFacts) -> Decision {
    if let LoaderFacts::Unavailable(reason) = &facts.loader {
        return Decision::Refuse(Refusal::Loader(reason.clone()));
    }
    let Some(booted) = facts.booted_entry.as_deref() else {
        return Decision::Refuse(Refusal::BootedEntryUnknown);
    };
    let marker = match &facts.loader {
        LoaderFacts::Read { upgrade_marker, .. } => upgrade_marker.as_deref(),
        LoaderFacts::Unavailable(reason) | LoaderFacts::Unreadable(reason) => {
            return Decision::Refuse(Refusal::Loader(reason.clone()))
        }
    };
    match marker {
        None => Decision::Nothing(Idle::NoUpgradePending),
        Some("") => Decision::DropEmptyMarker {
            failed: booted.to_owned(),
        },
        Some(fallback) if same_entry(booted, fallback) => Decision::KeepFallback {
            entry: booted.to_owned(),
        },
        Some(fallback) => Decision::Revert {
            failed: booted.to_owned(),
            to: fallback.to_owned(),
        },
    }
}

/// Whether the entry carries a boot counter. A `+` in the name is the test machined has always
/// used: systemd-boot names put the counter after the only `+`, GRUB labels never have one.
fn on_trial(entry: &str) -> bool {
    entry.contains('+')
}

/// Whether two references name the same entry: the same GRUB slot or name, or the same
/// systemd-boot entry once boot counters are set aside. The counter moves as the entry is
/// tried (`+3` → `+2-1`) and systemd-boot 252's `LoaderEntrySelected` keeps it, while META
/// holds the file name from the time of the upgrade.
fn same_entry(a: &str, b: &str) -> bool {
    let id = |name: &str| EntryName::parse(name).ok().map(|n| n.id(IdStyle::Current));
    a.eq_ignore_ascii_case(b) || id(a).is_some_and(|a| Some(a) == id(b))
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod tests;
