//! Which entries an upgrade deletes from `EFI/Linux`, decided before anything is written
//! (docs/update-transaction.md, "Pruning"). Pure: entries and cluster counts in, indices out.
//!
//! 1. Older copies of the target version (an earlier attempt, perhaps marked bad) always go.
//! 2. Then down to `keep_versions` versions: the new one, the running one and the pending
//!    fallback always stay (and count, so with them alone at or over the limit every other
//!    version goes); the remaining places go to the newest versions not marked bad, then to the
//!    newest bad ones ([`prune_candidates`]: bad entries go first, then the oldest).
//! 3. Then, only if the new UKI still lacks room, more in the same order — never the running
//!    entry, never the fallback.
//!
//! If even that leaves too little room, the plan says how much pruning could reclaim, for the
//! refusal ([`no_room_message`]). Only the OS's own entries (`<name>-…`) are considered: another
//! OS's UKIs on a shared ESP are never deleted.

use slate_bootspec::{prune_candidates, Entry};

/// The outcome of [`plan`]: indices into its `entries`, in deletion order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Plan {
    Fits {
        prune: Vec<usize>,
    },
    /// Deleting everything that may go (`prunable`, `reclaimable` clusters) still leaves less
    /// than `needed`.
    NoRoom {
        prunable: Vec<usize>,
        reclaimable: u64,
    },
}

/// What the ESP holds, in clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Room {
    /// Free now (including anything the write itself reclaims, such as a stale temp file).
    pub free: u64,
    /// What the new UKI and its directory entry take.
    pub needed: u64,
}

/// The prune plan over the OS's `entries` (versions set), each occupying `clusters[i]`.
/// `replaced` are the older copies of the target version; `running` and `fallback` are
/// references as [`slate_bootspec::refers_to`] reads them.
pub(super) fn plan(
    entries: &[Entry],
    clusters: &[u64],
    replaced: &[usize],
    running: &str,
    fallback: Option<&str>,
    keep_versions: u32,
    room: Room,
) -> Plan {
    let rest: Vec<usize> = (0..entries.len())
        .filter(|i| !replaced.contains(i))
        .collect();
    let rest_entries: Vec<Entry> = rest.iter().map(|&i| entries[i].clone()).collect();
    let candidates = |keep: usize| prune_candidates(&rest_entries, running, fallback, keep);
    // Least valuable first; pruning to `keep` takes a prefix of this order.
    let order: Vec<usize> = candidates(0)
        .iter()
        .filter_map(|file| rest_entries.iter().position(|e| e.file_name() == file))
        .map(|i| rest[i])
        .collect();
    // The new version takes one of the places.
    let must = candidates(keep_versions.saturating_sub(1) as usize).len();
    let mut prune = replaced.to_vec();
    let mut have = room.free + replaced.iter().map(|&i| clusters[i]).sum::<u64>();
    for (n, &i) in order.iter().enumerate() {
        if n >= must && have >= room.needed {
            break;
        }
        prune.push(i);
        have += clusters[i];
    }
    if have >= room.needed {
        Plan::Fits { prune }
    } else {
        Plan::NoRoom {
            prunable: prune,
            reclaimable: have - room.free,
        }
    }
}

/// The facts of a refusal for lack of room, all in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NoRoom<'a> {
    pub file: &'a str,
    pub uki_len: u64,
    pub esp_len: u64,
    pub free: u64,
    pub reclaimable: u64,
    pub prunable: &'a [String],
    pub running: &'a str,
    pub fallback: Option<&'a str>,
}

/// "the new UKI slate-3+3.efi (30.0 MiB) does not fit the EFI partition (40.0 MiB): 15.1 MiB
/// free, 12.0 MiB reclaimable by pruning slate-1.efi; the running entry slate-2.efi is kept".
pub(super) fn no_room_message(f: &NoRoom<'_>) -> String {
    let pruning = if f.prunable.is_empty() {
        "nothing else may be pruned".to_owned()
    } else {
        format!(
            "{} reclaimable by pruning {}",
            size(f.reclaimable),
            f.prunable.join(", ")
        )
    };
    let kept = match f.fallback.filter(|&fb| fb != f.running) {
        Some(fallback) => format!(
            "the running entry {} and the fallback {fallback} are kept",
            f.running
        ),
        None => format!("the running entry {} is kept", f.running),
    };
    format!(
        "the new UKI {} ({}) does not fit the EFI partition ({}): {} free, {pruning}; {kept}",
        f.file,
        size(f.uki_len),
        size(f.esp_len),
        size(f.free)
    )
}

/// Bytes for people: MiB or KiB with one decimal, or bytes.
pub(super) fn size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    match bytes {
        b if b >= MIB => format!("{:.1} MiB", b as f64 / MIB as f64),
        b if b >= KIB => format!("{:.1} KiB", b as f64 / KIB as f64),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_bootspec::EntryName;

    fn entries(files: &[&str]) -> Vec<Entry> {
        files
            .iter()
            .map(|f| {
                let mut e = Entry::new(EntryName::parse(f).unwrap());
                let stem = e.name.stem().to_owned();
                e.version = stem.strip_prefix("slate-").map(str::to_owned);
                e
            })
            .collect()
    }

    /// The file names `plan` prunes (or could prune, with the reclaimable clusters).
    fn run(
        files: &[&str],
        replaced: &[usize],
        running: &str,
        fallback: Option<&str>,
        keep: u32,
        room: Room,
    ) -> Result<Vec<String>, (Vec<String>, u64)> {
        let e = entries(files);
        let clusters: Vec<u64> = (0..files.len()).map(|_| 10).collect();
        let names = |v: Vec<usize>| v.iter().map(|&i| files[i].to_owned()).collect();
        match plan(&e, &clusters, replaced, running, fallback, keep, room) {
            Plan::Fits { prune } => Ok(names(prune)),
            Plan::NoRoom {
                prunable,
                reclaimable,
            } => Err((names(prunable), reclaimable)),
        }
    }

    const PLENTY: Room = Room {
        free: 1000,
        needed: 11,
    };

    #[test]
    fn two_versions_keep_the_running_one_only() {
        let files = ["slate-1.efi", "slate-2.efi", "slate-3.efi"];
        assert_eq!(
            run(&files, &[], "slate-3.efi", None, 2, PLENTY).unwrap(),
            ["slate-1.efi", "slate-2.efi"]
        );
        // Running the older one after a revert: the newer one goes (the new version replaces it).
        assert_eq!(
            run(&files, &[], "slate-2.efi", None, 2, PLENTY).unwrap(),
            ["slate-1.efi", "slate-3.efi"]
        );
        // Already within the limit: nothing to do.
        assert_eq!(
            run(&files[..1], &[], "slate-1.efi", None, 2, PLENTY).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn three_versions_prune_bad_entries_before_good_ones() {
        let files = [
            "slate-1.efi",
            "slate-2.efi",
            "slate-3+0-3.efi",
            "slate-4.efi",
            "slate-5+0-1.efi",
        ];
        // Running 4, N = 3: one more place, for the newest good version (2). The bad ones go
        // first (oldest bad first), then the oldest good one.
        assert_eq!(
            run(&files, &[], "slate-4.efi", None, 3, PLENTY).unwrap(),
            ["slate-3+0-3.efi", "slate-5+0-1.efi", "slate-1.efi"]
        );
        // Only bad ones besides the running entry: the newest bad one fills the place.
        let files = ["slate-1+0-3.efi", "slate-2+0-3.efi", "slate-3.efi"];
        assert_eq!(
            run(&files, &[], "slate-3.efi", None, 3, PLENTY).unwrap(),
            ["slate-1+0-3.efi"]
        );
    }

    #[test]
    fn running_and_fallback_are_never_pruned_even_over_the_limit() {
        let files = [
            "slate-1.efi",
            "slate-2.efi",
            "slate-3+2-1.efi",
            "slate-4.efi",
        ];
        // Running 3 (mid-trial, named by its pre-rename name), fallback 1: with the new version
        // that is already 3 of N = 2; everything else goes.
        assert_eq!(
            run(&files, &[], "slate-3+3.efi", Some("slate-1.efi"), 2, PLENTY).unwrap(),
            ["slate-2.efi", "slate-4.efi"]
        );
        // Even when room is short, running and fallback stay: the refusal lists the rest.
        let short = Room {
            free: 5,
            needed: 40,
        };
        let (prunable, reclaimable) =
            run(&files, &[], "slate-3+3.efi", Some("slate-1.efi"), 16, short).unwrap_err();
        assert_eq!(prunable, ["slate-2.efi", "slate-4.efi"]);
        assert_eq!(reclaimable, 20);
    }

    #[test]
    fn room_prunes_further_oldest_first() {
        let files = ["slate-1.efi", "slate-2.efi", "slate-3.efi", "slate-4.efi"];
        // N = 4 keeps all three others… unless room is short: 5 free, 21 needed → two go.
        let room = Room {
            free: 5,
            needed: 21,
        };
        assert_eq!(
            run(&files, &[], "slate-4.efi", None, 4, PLENTY).unwrap(),
            ["slate-1.efi"]
        );
        assert_eq!(
            run(&files, &[], "slate-4.efi", None, 16, PLENTY).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            run(&files, &[], "slate-4.efi", None, 16, room).unwrap(),
            ["slate-1.efi", "slate-2.efi"]
        );
        // An older copy of the target version always goes, and its room counts first.
        let files = ["slate-1.efi", "slate-2.efi", "slate-3+0-3.efi"];
        let room = Room {
            free: 5,
            needed: 15,
        };
        assert_eq!(
            run(&files, &[2], "slate-2.efi", None, 3, room).unwrap(),
            ["slate-3+0-3.efi"]
        );
        assert_eq!(
            run(&files, &[2], "slate-2.efi", None, 2, PLENTY).unwrap(),
            ["slate-3+0-3.efi", "slate-1.efi"]
        );
    }

    #[test]
    fn the_refusal_carries_the_numbers() {
        let files = ["slate-1.efi", "slate-2.efi"];
        let room = Room {
            free: 30,
            needed: 41,
        };
        let (prunable, reclaimable) = run(&files, &[], "slate-2.efi", None, 2, room).unwrap_err();
        assert_eq!(
            (prunable.as_slice(), reclaimable),
            (&["slate-1.efi".to_owned()][..], 10)
        );
        let message = no_room_message(&NoRoom {
            file: "slate-3+3.efi",
            uki_len: 12_800_000,
            esp_len: 40 << 20,
            free: 9_542_042,
            reclaimable: 2 << 20,
            prunable: &prunable,
            running: "slate-2.efi",
            fallback: Some("slate-1.0.efi"),
        });
        assert_eq!(
            message,
            "the new UKI slate-3+3.efi (12.2 MiB) does not fit the EFI partition (40.0 MiB): \
             9.1 MiB free, 2.0 MiB reclaimable by pruning slate-1.efi; the running entry \
             slate-2.efi and the fallback slate-1.0.efi are kept"
        );
        let message = no_room_message(&NoRoom {
            file: "slate-3+3.efi",
            uki_len: 50 << 20,
            esp_len: 40 << 20,
            free: 1536,
            reclaimable: 0,
            prunable: &[],
            running: "slate-2.efi",
            fallback: Some("slate-2.efi"),
        });
        assert_eq!(
            message,
            "the new UKI slate-3+3.efi (50.0 MiB) does not fit the EFI partition (40.0 MiB): \
             1.5 KiB free, nothing else may be pruned; the running entry slate-2.efi is kept"
        );
        assert_eq!(size(512), "512 bytes");
    }
}
