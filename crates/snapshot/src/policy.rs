//! Which snapshots to prune, which is the fallback, and which one a rollback boots
//! (docs/formats.md §12.6).

use crate::manifest::Difference;
use crate::{SnapshotError, SnapshotName};

/// Snapshots kept after an upgrade or commit (the seed's "at most three").
pub const KEEP_SNAPSHOTS: usize = 3;

/// The snapshots beyond `keep` to remove, never one in `protected` (the running root, the
/// fallback, the new snapshot). When the protected ones alone exceed `keep`, they stay and only
/// the others go.
///
/// What can no longer boot goes first: snapshots whose entry is bad (three failed tries), then
/// those with no entry, then the rest; oldest first within each. Pruning by age alone kept a
/// bad snapshot over an older good one, which is a fallback and the bad one never is.
pub fn prune(all: &[Listed], keep: usize, protected: &[&SnapshotName]) -> Vec<SnapshotName> {
    use slate_bootspec::BootState::Bad;
    let usefulness = |l: &Listed| match l.entry {
        Some(Bad) => 0,
        None => 1,
        Some(_) => 2,
    };
    let mut sorted: Vec<&Listed> = all.iter().collect();
    sorted.sort_by(|a, b| (usefulness(a), &a.name).cmp(&(usefulness(b), &b.name)));
    sorted.dedup_by(|a, b| a.name == b.name);
    let mut excess = sorted.len().saturating_sub(keep);
    let mut out = Vec::new();
    for l in sorted {
        if excess == 0 {
            break;
        }
        if !protected.contains(&&l.name) {
            out.push(l.name.clone());
            excess -= 1;
        }
    }
    out
}

/// A snapshot and the state of its boot entry, as the engine lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: SnapshotName,
    /// `None`: no boot entry on the ESP.
    pub entry: Option<slate_bootspec::BootState>,
}

/// The fallback of `running`: the newest other snapshot whose entry is good (blessed), else
/// the newest other with an entry that is not bad. It is what boots when `running` fails.
pub fn fallback<'a>(all: &'a [Listed], running: &SnapshotName) -> Option<&'a SnapshotName> {
    use slate_bootspec::BootState::{Bad, Good};
    let newest = |ok: &dyn Fn(&Listed) -> bool| {
        all.iter()
            .filter(|l| &l.name != running && ok(l))
            .map(|l| &l.name)
            .max()
    };
    newest(&|l| l.entry == Some(Good)).or_else(|| newest(&|l| l.entry.is_some_and(|s| s != Bad)))
}

/// `--verify-on-rollback`: how a rollback treats a target that does not match its manifest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyPolicy {
    /// Verify, report a mismatch loudly and roll back anyway: on the unattended failure path a
    /// refusal would turn one bad update into a boot loop.
    #[default]
    Warn,
    /// Try candidates newest first; the first that verifies wins (one with no manifest at
    /// all, predating manifests, is accepted with a note); none → refuse before any write.
    Strict,
    /// No verification.
    Off,
}

impl std::str::FromStr for VerifyPolicy {
    type Err = SnapshotError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "warn" => Ok(VerifyPolicy::Warn),
            "strict" => Ok(VerifyPolicy::Strict),
            "off" => Ok(VerifyPolicy::Off),
            _ => Err(SnapshotError::Invalid(format!(
                "verify-on-rollback {s:?}: expected warn, strict or off"
            ))),
        }
    }
}

/// The result of verifying one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    Verified,
    Mismatch(Vec<Difference>),
    /// No manifest was ever written for it.
    NoManifest,
    /// The manifest is unreadable or its HMAC is wrong.
    BadManifest(String),
}

/// The rollback target and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackChoice {
    pub target: SnapshotName,
    pub notes: Vec<String>,
}

/// Candidates: snapshots older than `running` with a boot entry, newest first. `verify` is
/// called only as the policy needs it (never under `off`; once under `warn`).
pub fn choose_rollback(
    candidates: &[SnapshotName],
    policy: VerifyPolicy,
    mut verify: impl FnMut(&SnapshotName) -> Verification,
) -> Result<RollbackChoice, SnapshotError> {
    let Some(first) = candidates.first() else {
        return Err(SnapshotError::NoRollbackTarget(
            "no older snapshot with a boot entry".into(),
        ));
    };
    let describe = |name: &SnapshotName, v: &Verification| match v {
        Verification::Verified => format!("{name}: verified against its manifest"),
        Verification::NoManifest => format!("{name}: no manifest (predates manifests); accepted"),
        Verification::Mismatch(d) => format!(
            "{name}: {} difference(s) from its manifest, e.g. {}",
            d.len(),
            d.first().map(ToString::to_string).unwrap_or_default()
        ),
        Verification::BadManifest(e) => format!("{name}: manifest refused: {e}"),
    };
    match policy {
        VerifyPolicy::Off => Ok(RollbackChoice {
            target: first.clone(),
            notes: vec![format!("{first}: not verified (verify-on-rollback off)")],
        }),
        VerifyPolicy::Warn => {
            let v = verify(first);
            let mut note = describe(first, &v);
            if matches!(v, Verification::Mismatch(_) | Verification::BadManifest(_)) {
                note = format!("SLATE-VERIFY-WARN {note}; rolling back anyway (policy warn)");
            }
            Ok(RollbackChoice {
                target: first.clone(),
                notes: vec![note],
            })
        }
        VerifyPolicy::Strict => {
            let mut notes = Vec::new();
            for c in candidates {
                let v = verify(c);
                notes.push(describe(c, &v));
                if matches!(v, Verification::Verified | Verification::NoManifest) {
                    return Ok(RollbackChoice {
                        target: c.clone(),
                        notes,
                    });
                }
            }
            Err(SnapshotError::NoRollbackTarget(format!(
                "no candidate verifies (policy strict): {}",
                notes.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use slate_bootspec::BootState;

    use super::*;

    fn n(i: u32) -> SnapshotName {
        SnapshotName::parse(&format!("root-2026010{i}-000000")).unwrap()
    }

    fn listed(i: u32, entry: Option<BootState>) -> Listed {
        Listed { name: n(i), entry }
    }

    #[test]
    fn prune_keeps_protected_and_newest() {
        let all: Vec<Listed> = (1..=5).map(|i| listed(i, Some(BootState::Good))).collect();
        assert_eq!(prune(&all, 3, &[&n(5), &n(4)]), [n(1), n(2)]);
        assert_eq!(prune(&all, 3, &[&n(1), &n(5)]), [n(2), n(3)]);
        assert_eq!(prune(&all[..2], 3, &[]), Vec::<SnapshotName>::new());
        assert_eq!(prune(&all, 1, &[&n(1), &n(2)]), [n(3), n(4), n(5)]);
    }

    /// The VM scenario's end state: v2 good (the fallback), v4 and v5 bad, v6 running. By age
    /// alone the good v2's older sibling went and bad v5 stayed.
    #[test]
    fn prune_removes_what_cannot_boot_first() {
        use BootState::{Bad, Good, Indeterminate};
        let all = [
            listed(1, Some(Good)),
            listed(2, Some(Good)),
            listed(4, Some(Bad)),
            listed(5, Some(Bad)),
            listed(6, Some(Indeterminate)),
        ];
        assert_eq!(prune(&all, 3, &[&n(6), &n(2)]), [n(4), n(5)]);
        // An entry-less snapshot (a half-registered one, or its entry removed) goes after the
        // bad ones and before any that can boot.
        let all = [
            listed(1, Some(Good)),
            listed(2, None),
            listed(3, Some(Bad)),
            listed(4, Some(Good)),
        ];
        assert_eq!(prune(&all, 2, &[&n(4)]), [n(3), n(2)]);
        assert_eq!(prune(&all, 1, &[&n(4)]), [n(3), n(2), n(1)]);
    }

    #[test]
    fn fallback_prefers_good() {
        let all = [
            Listed {
                name: n(1),
                entry: Some(BootState::Good),
            },
            Listed {
                name: n(2),
                entry: Some(BootState::Bad),
            },
            Listed {
                name: n(3),
                entry: Some(BootState::Indeterminate),
            },
            Listed {
                name: n(4),
                entry: None,
            },
        ];
        assert_eq!(fallback(&all, &n(4)), Some(&n(1)));
        assert_eq!(fallback(&all[1..], &n(4)), Some(&n(3)));
    }

    #[test]
    fn rollback_policies() {
        let c = [n(3), n(2), n(1)];
        let v = |s: &SnapshotName| match s.as_str() {
            "root-20260103-000000" => Verification::Mismatch(vec![Difference::Changed {
                path: "/usr/x".into(),
            }]),
            "root-20260102-000000" => Verification::BadManifest("HMAC".into()),
            _ => Verification::Verified,
        };
        let warn = choose_rollback(&c, VerifyPolicy::Warn, v).unwrap();
        assert_eq!(warn.target, n(3));
        assert!(
            warn.notes[0].starts_with("SLATE-VERIFY-WARN"),
            "{:?}",
            warn.notes
        );
        assert_eq!(
            choose_rollback(&c, VerifyPolicy::Strict, v).unwrap().target,
            n(1)
        );
        assert!(choose_rollback(&c[..2], VerifyPolicy::Strict, v).is_err());
        let off = choose_rollback(&c, VerifyPolicy::Off, |_| panic!("not verified")).unwrap();
        assert_eq!(off.target, n(3));
        assert!(choose_rollback(&[], VerifyPolicy::Off, v).is_err());
    }
}
