//! `commit`, `rollback`, `verify`, `generate-manifest`, `list` and `prune`.

use std::fs;

use slate_bootloader::grub::snapshots::{self as grub, Mark};
use slate_bootloader::sdboot::snapshots as sdboot;
use slate_bootspec::BootState;
use slate_snapshot::entry::DEFAULT_TRIES;
use slate_snapshot::manifest::{sha256, Difference, Manifest, Record};
use slate_snapshot::policy::{
    self, choose_rollback, Listed, Verification, VerifyPolicy, KEEP_SNAPSHOTS,
};
use slate_snapshot::SnapshotName;

use crate::boot::{remove_entry, Boot};
use crate::{io_err, tree, EngineError, Pool, Result};

/// Removes a snapshot in the order that never leaves a boot entry without its files: the ESP
/// entry and copies, or GRUB's menu entry (`with_esp`), the manifest, GRUB's record, the
/// subvolume. Never the running root.
pub(crate) fn remove_snapshot(pool: &Pool, snap: &SnapshotName, with_esp: bool) -> Result<()> {
    if pool.running.as_ref() == Some(snap) {
        return Err(EngineError::Invalid(format!(
            "{snap} is the running root; not removed"
        )));
    }
    if with_esp {
        remove_entry(pool, snap)?;
    }
    let manifest = pool.manifest_path(snap);
    match fs::remove_file(&manifest) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io_err("removing", &manifest)(e))
        }
        _ => {}
    }
    pool.unmark_boot(snap)?;
    if pool.path_of(snap).exists() {
        pool.detach_under(&pool.path_of(snap))?;
        slate_host::delete_subvolume(&pool.top, snap.as_str())?;
    }
    Ok(())
}

/// One snapshot in `list`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ListEntry {
    pub name: String,
    /// The entry file on the ESP, if any.
    pub entry: Option<String>,
    /// good, indeterminate, bad, or none.
    pub state: String,
    pub running: bool,
    pub fallback: bool,
    pub boots_next: bool,
    pub manifest: bool,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Listing {
    pub pool_uuid: String,
    pub running: String,
    pub next_boot: Option<String>,
    pub snapshots: Vec<ListEntry>,
    pub warnings: Vec<String>,
}

pub(crate) fn listed(pool: &Pool, boot: &Boot) -> Result<Vec<Listed>> {
    Ok(pool
        .snapshots()?
        .into_iter()
        .map(|name| Listed {
            entry: boot.state_of(&name),
            name,
        })
        .collect())
}

pub fn list(pool: &Pool) -> Result<Listing> {
    let boot = Boot::read(pool)?;
    let all = listed(pool, &boot)?;
    let next = boot.next();
    let fallback = fallback_of(pool, &all, next.as_ref());
    let snapshots = all
        .iter()
        .map(|l| ListEntry {
            name: l.name.to_string(),
            entry: boot.entry_label(&l.name),
            state: match l.entry {
                Some(BootState::Good) => "good",
                Some(BootState::Indeterminate) => "indeterminate",
                Some(BootState::Bad) => "bad",
                None => "none",
            }
            .into(),
            running: pool.running.as_ref() == Some(&l.name),
            fallback: fallback.as_ref() == Some(&l.name),
            boots_next: next.as_ref() == Some(&l.name),
            manifest: pool.manifest_path(&l.name).exists(),
        })
        .collect();
    Ok(Listing {
        pool_uuid: pool.uuid.clone(),
        running: pool.running_subvol.clone(),
        next_boot: boot.next_label(),
        snapshots,
        warnings: boot.warnings(),
    })
}

/// What boots when the entry that boots next fails: while that entry is on trial, the newest
/// good other one (the running root, after an upgrade); otherwise the running root's fallback.
fn fallback_of(pool: &Pool, all: &[Listed], next: Option<&SnapshotName>) -> Option<SnapshotName> {
    let on_trial = all
        .iter()
        .find(|l| Some(&l.name) == next && l.entry == Some(BootState::Indeterminate));
    match (on_trial, pool.running.as_ref()) {
        (Some(l), _) => policy::fallback(all, &l.name).cloned(),
        (None, Some(r)) => policy::fallback(all, r).cloned(),
        (None, None) => None,
    }
}

fn running(pool: &Pool) -> Result<&SnapshotName> {
    pool.running.as_ref().ok_or_else(|| {
        EngineError::Invalid(format!(
            "the running root {} is not a snapshot (root-YYYYMMDD-HHMMSS)",
            pool.running_subvol
        ))
    })
}

/// Prunes to [`KEEP_SNAPSHOTS`], never the running root, its fallback, or what boots next.
pub fn prune(pool: &Pool, dry_run: bool) -> Result<Vec<String>> {
    let boot = Boot::read(pool)?;
    let all = listed(pool, &boot)?;
    let next = boot.next();
    let fallback = fallback_of(pool, &all, next.as_ref());
    let running_fallback = pool
        .running
        .as_ref()
        .and_then(|r| policy::fallback(&all, r))
        .cloned();
    let protected: Vec<&SnapshotName> = [
        pool.running.as_ref(),
        fallback.as_ref(),
        running_fallback.as_ref(),
        next.as_ref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    // GRUB: the saved default too (while a one-shot is pending, `next` is the new snapshot).
    let saved = match &boot {
        Boot::Grub { scan, .. } => scan.saved().map(|e| e.snapshot.clone()),
        Boot::SystemdBoot(_) => None,
    };
    let protected: Vec<&SnapshotName> = protected.into_iter().chain(saved.as_ref()).collect();
    let chosen = policy::prune(&all, KEEP_SNAPSHOTS, &protected);
    if !dry_run {
        for s in &chosen {
            remove_snapshot(pool, s, true)?;
        }
    }
    Ok(chosen.iter().map(ToString::to_string).collect())
}

/// What `commit` did (or would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommitOutcome {
    /// The entry's rename (from, to); `None` when it was good already (or on GRUB).
    pub renamed: Option<(String, String)>,
    /// GRUB: grubenv's `saved_entry` (from, to); `None` when it named the snapshot already
    /// (or on systemd-boot).
    pub saved_entry: Option<(String, String)>,
    pub pruned: Vec<String>,
}

/// Step 8: the booted (running) snapshot's entry loses its counter (systemd-boot) or becomes
/// grubenv's `saved_entry` (GRUB), then prune.
pub fn commit(pool: &Pool, dry_run: bool) -> Result<CommitOutcome> {
    let snap = running(pool)?.clone();
    if let Boot::Grub { scan, .. } = Boot::read(pool)? {
        if scan.entry_of(&snap).is_none() {
            return Err(EngineError::Invalid(format!(
                "{snap} has no GRUB menu entry to make the default"
            )));
        }
        let before = scan.saved().map(|e| e.snapshot.to_string());
        if dry_run {
            let change = (before.as_deref() != Some(snap.as_str()))
                .then(|| (before.unwrap_or_default(), snap.to_string()));
            return Ok(CommitOutcome {
                renamed: None,
                saved_entry: change,
                pruned: prune(pool, true)?,
            });
        }
        // grubenv first (what boots), then the record (what the engine reports): a cut
        // between leaves the snapshot the default and on trial in the record, which the next
        // commit clears.
        let saved_entry = grub::commit(&mut pool.open_esp()?, &snap)?;
        pool.unmark_boot(&snap)?;
        return Ok(CommitOutcome {
            renamed: None,
            saved_entry,
            pruned: prune(pool, false)?,
        });
    }
    let scan = sdboot::scan(&pool.open_esp_read_only()?)?;
    let found = scan
        .entry_of(&snap)
        .ok_or_else(|| EngineError::Invalid(format!("{snap} has no boot entry to bless")))?;
    if dry_run {
        let to = found
            .name
            .blessed()
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let rename = (to != found.name)
            .then(|| (found.name.file_name().to_owned(), to.file_name().to_owned()));
        return Ok(CommitOutcome {
            renamed: rename,
            saved_entry: None,
            pruned: prune(pool, true)?,
        });
    }
    let renamed = sdboot::bless(&mut pool.open_esp()?, &snap)?;
    Ok(CommitOutcome {
        renamed,
        saved_entry: None,
        pruned: prune(pool, false)?,
    })
}

/// The manifest a snapshot has now: its /usr and /boot, and its ESP copies.
fn current_manifest(pool: &Pool, snap: &SnapshotName) -> Result<Manifest> {
    let mut m = Manifest::new(snap.clone());
    tree::walk_into(&pool.path_of(snap), &mut m)?;
    for (path, bytes) in sdboot::snapshot_files(&pool.open_esp_read_only()?, snap)? {
        m.insert(
            path.as_bytes(),
            Record::Esp {
                size: bytes.len() as u64,
                sha256: sha256(&bytes),
            },
        )?;
    }
    Ok(m)
}

/// Verifies one snapshot against its manifest (HMAC first).
pub fn verify_one(pool: &Pool, snap: &SnapshotName) -> Result<Verification> {
    let path = pool.manifest_path(snap);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Verification::NoManifest),
        Err(e) => return Err(io_err("reading", &path)(e)),
    };
    let Some(key) = pool.key(false)? else {
        return Ok(Verification::BadManifest(
            "no manifest key on the pool".into(),
        ));
    };
    let recorded = match Manifest::verify(&bytes, &key) {
        Ok(m) if &m.snapshot == snap => m,
        Ok(m) => {
            return Ok(Verification::BadManifest(format!(
                "the manifest names {}",
                m.snapshot
            )))
        }
        Err(e) => return Ok(Verification::BadManifest(e.to_string())),
    };
    let diffs: Vec<Difference> = recorded.compare(&current_manifest(pool, snap)?);
    Ok(if diffs.is_empty() {
        Verification::Verified
    } else {
        Verification::Mismatch(diffs)
    })
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyOutcome {
    pub snapshot: String,
    /// verified, mismatch, no-manifest, bad-manifest.
    pub result: String,
    pub running: bool,
    pub detail: Vec<String>,
}

/// `verify [SNAPSHOT]`: that one, or every snapshot but the running root (a live root changes
/// by design; its mismatch is advisory).
pub fn verify(pool: &Pool, which: Option<&SnapshotName>) -> Result<Vec<VerifyOutcome>> {
    let targets: Vec<SnapshotName> = match which {
        Some(s) => {
            if !pool.path_of(s).exists() {
                return Err(EngineError::Invalid(format!("no snapshot {s}")));
            }
            vec![s.clone()]
        }
        None => pool
            .snapshots()?
            .into_iter()
            .filter(|s| pool.running.as_ref() != Some(s))
            .collect(),
    };
    targets
        .into_iter()
        .map(|s| {
            let v = verify_one(pool, &s)?;
            let (result, detail) = match v {
                Verification::Verified => ("verified", vec![]),
                Verification::NoManifest => ("no-manifest", vec![]),
                Verification::Mismatch(d) => {
                    ("mismatch", d.iter().map(ToString::to_string).collect())
                }
                Verification::BadManifest(e) => ("bad-manifest", vec![e]),
            };
            Ok(VerifyOutcome {
                running: pool.running.as_ref() == Some(&s),
                snapshot: s.to_string(),
                result: result.into(),
                detail,
            })
        })
        .collect()
}

/// `generate-manifest SNAPSHOT`: re-stamps it as it is now (after an intended change).
pub fn generate_manifest(pool: &Pool, snap: &SnapshotName, dry_run: bool) -> Result<usize> {
    if !pool.path_of(snap).exists() {
        return Err(EngineError::Invalid(format!("no snapshot {snap}")));
    }
    let m = current_manifest(pool, snap)?;
    if !dry_run {
        pool.write_manifest(&m)?;
    }
    Ok(m.records.len())
}

/// `rollback`: the previous snapshot (older than the running one, with an entry) boots next on
/// trial, chosen and verified per `policy` before any write; the running one is marked bad.
/// What `rollback` did (or would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RollbackOutcome {
    pub target: String,
    /// What verification found, per candidate tried.
    pub notes: Vec<String>,
    /// The target's entry on trial (`root-…+3.conf`).
    pub to_entry: String,
    /// The running snapshot's entry marked bad (`root-…+0.conf`).
    pub from_entry: String,
}

pub fn rollback(pool: &Pool, policy: VerifyPolicy, dry_run: bool) -> Result<RollbackOutcome> {
    let current = running(pool)?.clone();
    let boot = Boot::read(pool)?;
    let mut candidates: Vec<SnapshotName> = pool
        .snapshots()?
        .into_iter()
        .filter(|s| s < &current && boot.has_entry(s))
        .collect();
    candidates.reverse();
    let mut failure = None;
    let choice = choose_rollback(&candidates, policy, |s| {
        verify_one(pool, s).unwrap_or_else(|e| {
            failure.get_or_insert(e.to_string());
            Verification::BadManifest("could not be verified".into())
        })
    })?;
    let mut notes = choice.notes;
    if let Some(f) = failure {
        notes.push(format!("verification error: {f}"));
    }
    let target = choice.target;
    if boot.is_grub() {
        let outcome = RollbackOutcome {
            target: target.to_string(),
            notes,
            to_entry: format!("grubenv saved_entry={target}"),
            // GRUB has no bad mark: the engine's record is what marks it.
            from_entry: format!(".slate/grub/{current}"),
        };
        if !dry_run {
            // The record first: a cut after it leaves `current` the default, and booting, with
            // a bad record that its next commit removes.
            pool.mark_boot(&current, Mark::Bad)?;
            grub::rollback(&mut pool.open_esp()?, &target)?;
        }
        return Ok(outcome);
    }
    if dry_run {
        let (to_entry, from_entry) = (
            format!("{target}+{DEFAULT_TRIES}.conf"),
            format!("{current}+0.conf"),
        );
        return Ok(RollbackOutcome {
            target: target.to_string(),
            notes,
            to_entry,
            from_entry,
        });
    }
    let (to_entry, from_entry) =
        sdboot::rollback(&mut pool.open_esp()?, &target, &current, DEFAULT_TRIES)?;
    Ok(RollbackOutcome {
        target: target.to_string(),
        notes,
        to_entry,
        from_entry,
    })
}
