//! UAPI.10 version order, as systemd implements it (`strverscmp_improved()`, the function behind
//! `systemd-analyze compare-versions` and behind systemd-boot's entry sorting).
//!
//! Where the prose of the UAPI text and systemd's code differ, this follows the code, because the
//! code is what sorts boot entries. Two such corners, both checked against `systemd-analyze
//! compare-versions` of systemd 252 (Debian 12) by `tests/conformance.rs`:
//! - `~` is lower than the end of a string, so `'' > '~'`;
//! - a numeric run beats a missing one even when it is all zeros, so `0 > a` and `0a > a`
//!   (the prose "an empty prefix evaluates as 0" would make them `<`);
//! - `^` makes a string lower than one with a letter, digit or `.` there (`A > ^`); it is
//!   higher only than the end of a string or a `-` (the prose calls `^` "higher").

use std::cmp::Ordering;

/// Characters that take part in the comparison; everything else only separates segments.
fn is_version_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'~' | b'-' | b'^' | b'.')
}

/// `true` if `s` starts with `c`.
fn starts(s: &[u8], c: u8) -> bool {
    s.first() == Some(&c)
}

fn starts_with_digit(s: &[u8]) -> bool {
    s.first().is_some_and(u8::is_ascii_digit)
}

/// Length of the leading run of bytes satisfying `pred`.
fn run(s: &[u8], pred: impl Fn(&u8) -> bool) -> usize {
    s.iter().take_while(|c| pred(c)).count()
}

/// Handles one prefix character that both strings must share to stay equal (`~ - ^ .`):
/// when exactly one string has it, that string is lower; when both have it, both skip it.
fn prefix(a: &mut &[u8], b: &mut &[u8], c: u8) -> Option<Ordering> {
    match (starts(a, c), starts(b, c)) {
        (true, true) => {
            *a = &a[1..];
            *b = &b[1..];
            None
        }
        (false, false) => None,
        (a_has, _) => Some(if a_has {
            Ordering::Less
        } else {
            Ordering::Greater
        }),
    }
}

/// Compares two version strings by the UAPI Version Format Specification (UAPI.10).
///
/// `Greater` means `a` is newer. Check vectors (docs/formats.md §2): `122.1 < 123~rc1-1 < 123 < 123-a <
/// 123-a.1 < 123-1 < 123-1.1 < 123^post1 < 123.a-1 < 123.1-1 < 123a-1 < 124-1`; `'' < 0`,
/// `0. > 0`, `0 > ~`, `B < a`, `1_2_3 > 1.3.3`.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        // 1. Characters outside [A-Za-z0-9.~^-] are skipped.
        a = &a[a.iter().take_while(|c| !is_version_char(**c)).count()..];
        b = &b[b.iter().take_while(|c| !is_version_char(**c)).count()..];

        // 2. `~` sorts lower than anything, even than the end of the string.
        if let Some(order) = prefix(&mut a, &mut b, b'~') {
            return order;
        }

        // 3. Otherwise a string that has ended is lower (both ended: equal).
        if a.is_empty() || b.is_empty() {
            return (!a.is_empty()).cmp(&!b.is_empty());
        }

        // 4. `-` (release), `^` (patch) and `.` (point release), checked once per round in this
        //    order: a string having one where the other does not is lower. So `^` is above the
        //    end of a string (step 3) and above `-` (checked first), but below letters, digits
        //    and `.` (`123^post1 < 123.a`), whatever the UAPI prose says of `^`.
        for c in [b'-', b'^', b'.'] {
            if let Some(order) = prefix(&mut a, &mut b, c) {
                return order;
            }
        }

        // 5. Numeric runs: a present run beats a missing one, then the value decides
        //    (compared as digit strings, so there is no overflow).
        let (step_a, step_b);
        if starts_with_digit(a) || starts_with_digit(b) {
            let (len_a, len_b) = (run(a, u8::is_ascii_digit), run(b, u8::is_ascii_digit));
            let order = (len_a > 0).cmp(&(len_b > 0));
            if order.is_ne() {
                return order;
            }
            let (za, zb) = (run(a, |c| *c == b'0'), run(b, |c| *c == b'0'));
            let (digits_a, digits_b) = (&a[za..len_a], &b[zb..len_b]);
            let order = digits_a
                .len()
                .cmp(&digits_b.len())
                .then(digits_a.cmp(digits_b));
            if order.is_ne() {
                return order;
            }
            (step_a, step_b) = (len_a, len_b);
        } else {
            // 6. Letter runs: byte order (so every upper-case letter is below every
            //    lower-case one), and a run that goes on is higher.
            let (len_a, len_b) = (
                run(a, u8::is_ascii_alphabetic),
                run(b, u8::is_ascii_alphabetic),
            );
            let common = len_a.min(len_b);
            let order = a[..common].cmp(&b[..common]).then(len_a.cmp(&len_b));
            if order.is_ne() {
                return order;
            }
            (step_a, step_b) = (len_a, len_b);
        }
        a = &a[step_a..];
        b = &b[step_b..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering::*;

    #[test]
    fn leading_zeros_and_lengths() {
        assert_eq!(compare_versions("00123", "123"), Equal);
        assert_eq!(compare_versions("12345", "123"), Greater);
        assert_eq!(compare_versions("0", "00"), Equal);
        assert_eq!(compare_versions("0", "a"), Greater);
        assert_eq!(compare_versions("0a", "a"), Greater);
    }

    #[test]
    fn uapi_examples() {
        assert_eq!(compare_versions("11", "11"), Equal);
        assert_eq!(compare_versions("systemd-123", "systemd-123"), Equal);
        assert_eq!(compare_versions("bar-123", "foo-123"), Less);
        assert_eq!(compare_versions("123a", "123"), Greater);
        assert_eq!(compare_versions("123.a", "123"), Greater);
        assert_eq!(compare_versions("123.a", "123.b"), Less);
        assert_eq!(compare_versions("123a", "123.a"), Greater);
        assert_eq!(compare_versions("11α", "11β"), Equal);
        assert_eq!(compare_versions("A", "a"), Less);
        assert_eq!(compare_versions("1_", "1"), Equal);
        assert_eq!(compare_versions("_1", "1"), Equal);
        assert_eq!(compare_versions("1_", "1.2"), Less);
        assert_eq!(compare_versions("1+", "1"), Equal);
        assert_eq!(compare_versions("+1", "1"), Equal);
        assert_eq!(compare_versions("1+2+3", "1.3.3"), Greater);
        assert_eq!(compare_versions("0.0", "0"), Greater);
        assert_eq!(compare_versions("", "~"), Greater);
        assert_eq!(compare_versions("", "_"), Equal);
    }
}
