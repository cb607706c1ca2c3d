//! Which menu entry GRUB boots, given the environment block and the menu — pure.
//!
//! The model of the `grub.cfg` slate generates, which follows grub-mkconfig's `00_header` with
//! `GRUB_DEFAULT=saved` (docs/formats.md §4) plus a `fallback`:
//!
//! ```text
//! load_env                                  # a block GRUB cannot load sets nothing
//! if [ "${next_entry}" ]; then              # one shot:
//!   set default="${next_entry}"
//!   set next_entry= ; save_env next_entry   #   consumed before the entry starts
//!   set boot_once=true
//! else
//!   set default="${saved_entry}"
//! fi
//! set fallback="${saved_entry}"             # where GRUB goes when the entry fails in GRUB
//! ```
//!
//! Between `load_env` and the one-shot test, slate's `grub.cfg` checks that `saved_entry` is
//! exactly one of the menu's ids; when it is not (grubenv did not load, or lost the line),
//! it loads `saved_entry` alone from slate's second record, `grub/slate-default.env`
//! ([`grub_select_with_record`]; docs/formats.md §4.3).
//!
//! GRUB resolves `default` (and `fallback`) as a number (an index, `strtoul` base 0), else the
//! first entry whose title or `--id` equals it; a value that resolves to nothing (unset, empty,
//! unknown) means the first entry.

use crate::grubenv::GrubEnv;

/// One `menuentry` of the generated menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrubMenuEntry {
    pub title: String,
    /// `--id`.
    pub id: String,
}

/// Why an entry was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrubReason {
    /// `next_entry` was set and names this entry (it is consumed by this boot).
    NextEntry,
    /// `saved_entry` names this entry.
    SavedEntry,
    /// Nothing named an existing entry (or the block could not be loaded): the first entry.
    FirstEntry,
}

/// The outcome of one boot as GRUB would run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrubSelection {
    /// Index into the menu of the entry started.
    pub index: usize,
    pub reason: GrubReason,
    /// The entry `fallback` resolves to (`saved_entry`), started if this one fails inside GRUB
    /// (kernel or initrd missing or unloadable). `None` when it resolves to nothing.
    pub fallback: Option<usize>,
    /// The block GRUB leaves behind (`next_entry=` after a one-shot; `None` when nothing was
    /// saved: no one-shot, or an unloadable block).
    pub env_after: Option<GrubEnv>,
    /// `saved_entry` (the default and the fallback) came from slate's second record, because
    /// grubenv's named no menu id ([`grub_select_with_record`]).
    pub saved_from_record: bool,
}

/// GRUB's `get_entry_number`: a number in range, else a title or id, else nothing.
pub fn grub_entry_index(menu: &[GrubMenuEntry], reference: &str) -> Option<usize> {
    if reference.is_empty() {
        return None;
    }
    if let Some(n) = parse_ulong(reference) {
        return usize::try_from(n).ok().filter(|&n| n < menu.len());
    }
    menu.iter()
        .position(|e| e.title == reference || e.id == reference)
}

/// `grub_strtoul(s, &end, 0)` accepting only a whole-string number: `0x` hex, leading-`0`
/// octal, else decimal.
fn parse_ulong(s: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (hex, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// The entry GRUB starts with `env` (`None`: the block could not be loaded) and `menu`.
/// `None` only for an empty menu.
pub fn grub_select(env: Option<&GrubEnv>, menu: &[GrubMenuEntry]) -> Option<GrubSelection> {
    select(env, None, menu)
}

/// [`grub_select`] for slate's `grub.cfg`, which has a second record of the committed default:
/// when grubenv's `saved_entry` is not exactly the `--id` of a menu entry (the block did not
/// load, lost the line, or holds something else), `load_env --file … saved_entry` takes it
/// from `record` (`None`: absent or unloadable — then nothing changes). `saved_entry` feeds
/// `default` and `fallback` as before; the one-shot and what `save_env` writes back are
/// grubenv's alone.
pub fn grub_select_with_record(
    env: Option<&GrubEnv>,
    record: Option<&GrubEnv>,
    menu: &[GrubMenuEntry],
) -> Option<GrubSelection> {
    let names_an_id = |saved: Option<&str>| saved.is_some_and(|s| menu.iter().any(|e| e.id == s));
    if names_an_id(env.and_then(|e| e.get("saved_entry"))) {
        return select(env, None, menu);
    }
    match record.and_then(|r| r.get("saved_entry")) {
        Some(saved) => select(env, Some(saved), menu),
        None => select(env, None, menu),
    }
}

/// The selection with `saved_entry` overridden by `record_saved` (loaded from the record).
fn select(
    env: Option<&GrubEnv>,
    record_saved: Option<&str>,
    menu: &[GrubMenuEntry],
) -> Option<GrubSelection> {
    if menu.is_empty() {
        return None;
    }
    let saved = match record_saved {
        Some(s) => Some(s).filter(|s| !s.is_empty()),
        None => env.and_then(|e| e.get_nonempty("saved_entry")),
    };
    let fallback = saved.and_then(|s| grub_entry_index(menu, s));
    let next = env.and_then(|e| e.get_nonempty("next_entry"));
    let (default, one_shot) = match next {
        Some(next) => (Some(next), true),
        None => (saved, false),
    };
    let env_after = match env {
        Some(e) if one_shot => {
            let mut after = e.clone();
            // Setting an existing variable shorter always fits.
            after
                .set("next_entry", "")
                .expect("emptying a set variable fits");
            Some(after)
        }
        _ => None,
    };
    let (index, reason) = match default.and_then(|d| grub_entry_index(menu, d)) {
        Some(i) if one_shot => (i, GrubReason::NextEntry),
        Some(i) => (i, GrubReason::SavedEntry),
        None => (0, GrubReason::FirstEntry),
    };
    Some(GrubSelection {
        index,
        reason,
        fallback,
        env_after,
        saved_from_record: record_saved.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn menu() -> Vec<GrubMenuEntry> {
        ["A", "B"]
            .iter()
            .map(|id| GrubMenuEntry {
                title: format!("slate {id}"),
                id: (*id).into(),
            })
            .collect()
    }

    fn env(vars: &[(&str, &str)]) -> GrubEnv {
        let mut e = GrubEnv::new();
        for (n, v) in vars {
            e.set(n, v).unwrap();
        }
        e
    }

    #[test]
    fn next_entry_is_a_one_shot_then_saved_entry() {
        let m = menu();
        let e = env(&[("saved_entry", "A"), ("next_entry", "B")]);
        let s = grub_select(Some(&e), &m).unwrap();
        assert_eq!(
            (s.index, s.reason, s.fallback),
            (1, GrubReason::NextEntry, Some(0))
        );
        let after = s.env_after.unwrap();
        assert_eq!(after.get("next_entry"), Some(""));
        let s2 = grub_select(Some(&after), &m).unwrap();
        assert_eq!((s2.index, s2.reason), (0, GrubReason::SavedEntry));
        assert_eq!(s2.env_after, None);
    }

    #[test]
    fn references_by_index_title_and_id() {
        let m = menu();
        for (r, want) in [
            ("1", Some(1)),
            ("0x1", Some(1)),
            ("01", Some(1)),
            ("0", Some(0)),
            ("2", None),
            ("slate B", Some(1)),
            ("B", Some(1)),
            ("b", None),
            ("", None),
            ("1a", None),
        ] {
            assert_eq!(grub_entry_index(&m, r), want, "{r:?}");
        }
    }

    #[test]
    fn unknown_or_unloadable_means_the_first_entry() {
        let m = menu();
        let s = grub_select(None, &m).unwrap();
        assert_eq!(
            (s.index, s.reason, s.fallback),
            (0, GrubReason::FirstEntry, None)
        );
        let e = env(&[("saved_entry", "B"), ("next_entry", "Z")]);
        let s = grub_select(Some(&e), &m).unwrap();
        // 00_header sets default to the unknown one-shot: GRUB starts the first entry, and
        // the one-shot is consumed all the same.
        assert_eq!(
            (s.index, s.reason, s.fallback),
            (0, GrubReason::FirstEntry, Some(1))
        );
        assert!(s.env_after.is_some());
        let e = env(&[("saved_entry", "B"), ("next_entry", "")]);
        let s = grub_select(Some(&e), &m).unwrap();
        assert_eq!((s.index, s.reason), (1, GrubReason::SavedEntry));
        assert!(grub_select(Some(&e), &[]).is_none());
    }

    #[test]
    fn the_record_stands_in_when_grubenv_names_no_slot() {
        let m = menu();
        let record = env(&[("saved_entry", "B")]);
        // grubenv names a slot: the record is not read.
        let e = env(&[("saved_entry", "A")]);
        let s = grub_select_with_record(Some(&e), Some(&record), &m).unwrap();
        assert_eq!(
            (s.index, s.fallback, s.saved_from_record),
            (0, Some(0), false)
        );
        // Unloadable, lost the line, or a value that is no id (even one GRUB would resolve):
        // the record's saved_entry is the default and the fallback.
        for e in [
            None,
            Some(env(&[])),
            Some(env(&[("saved_entry", "1")])),
            Some(env(&[("saved_entry", "slate A")])),
        ] {
            let s = grub_select_with_record(e.as_ref(), Some(&record), &m).unwrap();
            assert_eq!(
                (s.index, s.reason, s.fallback, s.saved_from_record),
                (1, GrubReason::SavedEntry, Some(1), true),
                "{e:?}"
            );
        }
        // The one-shot is grubenv's: it still wins, and only it is written back.
        let e = env(&[("next_entry", "A")]);
        let s = grub_select_with_record(Some(&e), Some(&record), &m).unwrap();
        assert_eq!(
            (s.index, s.reason, s.fallback),
            (0, GrubReason::NextEntry, Some(1))
        );
        assert_eq!(s.env_after.unwrap().get("saved_entry"), None);
        // No record (or one without the line): GRUB's first entry, as before.
        let s = grub_select_with_record(None, None, &m).unwrap();
        assert_eq!(
            (s.index, s.reason, s.saved_from_record),
            (0, GrubReason::FirstEntry, false)
        );
        let s = grub_select_with_record(None, Some(&env(&[])), &m).unwrap();
        assert_eq!((s.index, s.reason), (0, GrubReason::FirstEntry));
    }
}
