//! Garden-Linux-style update policy over the entries on an ESP (seed 004): the newest version
//! that is not bad is the one to boot, and pruning never touches the running version (nor a
//! designated fallback).

use std::cmp::Ordering;

use crate::name::{BootState, EntryName, IdStyle};
use crate::select::{insertion_sort, Entry};
use crate::version::compare_versions;

/// Which of two entries is the newer version: `version` by UAPI.10 order (absent = empty),
/// then the counter-less ID. `Greater` means `a` is newer.
fn newness(a: &Entry, b: &Entry) -> Ordering {
    let version = |e: &Entry| e.version.clone().unwrap_or_default();
    compare_versions(&version(a), &version(b))
        .then_with(|| compare_versions(&a.id(IdStyle::Current), &b.id(IdStyle::Current)))
}

/// Index of the newest entry that is not bad (good or still being tried), the one
/// Garden Linux's rule says must boot. Ties go to the earlier index. `None` if all are bad.
pub fn newest_not_bad(entries: &[Entry]) -> Option<usize> {
    (0..entries.len())
        .filter(|&i| entries[i].state() != BootState::Bad)
        .reduce(|best, i| match newness(&entries[i], &entries[best]) {
            Ordering::Greater => i,
            _ => best,
        })
}

/// `true` if `reference` names `entry`: a file name (with or without a counter, in any case,
/// optionally with a `\` or `/` directory part such as `LoaderBootCountPath`), or an entry ID in
/// either [`IdStyle`]. Counter renames by systemd-boot thus do not hide the running entry.
pub fn refers_to(entry: &Entry, reference: &str) -> bool {
    let base = reference.rsplit(['\\', '/']).next().unwrap_or(reference);
    let lower = base.to_ascii_lowercase();
    let current = entry.id(IdStyle::Current);
    lower == current
        || lower == entry.id(IdStyle::Sd252)
        || EntryName::parse(base).is_ok_and(|n| n.id(IdStyle::Current) == current)
}

/// File names to delete to leave at most `keep` entries, least valuable first: bad entries,
/// then the oldest versions. The entries `running` and `fallback` refer to (see [`refers_to`])
/// are never returned, and count towards `keep`; if they alone exceed it, every other entry is
/// returned.
pub fn prune_candidates(
    entries: &[Entry],
    running: &str,
    fallback: Option<&str>,
    keep: usize,
) -> Vec<String> {
    let protected = |e: &Entry| refers_to(e, running) || fallback.is_some_and(|f| refers_to(e, f));
    let mut others: Vec<usize> = (0..entries.len())
        .filter(|&i| !protected(&entries[i]))
        .collect();
    let kept_anyway = entries.len() - others.len();
    let bad = |i: usize| entries[i].state() == BootState::Bad;
    // Most valuable first; the tail is what goes.
    insertion_sort(&mut others, |a, b| {
        bad(a)
            .cmp(&bad(b))
            .then_with(|| newness(&entries[b], &entries[a]))
            .then(a.cmp(&b))
    });
    let slots = keep.saturating_sub(kept_anyway).min(others.len());
    others[slots..]
        .iter()
        .rev()
        .map(|&i| entries[i].file_name().to_owned())
        .collect()
}
