//! The glob matcher systemd-boot applies to `default`, `LoaderEntryDefault` and
//! `LoaderEntryOneShot` (its `efi_fnmatch()`).
//!
//! Written here rather than taken from a crate because the semantics must be systemd-boot's
//! reduced fnmatch, not a shell's or a path glob's: `*`, `?`, `[...]` with ranges and `\` escapes,
//! but no `[!...]` negation (`!` is an ordinary member), no special meaning for `/` or a leading
//! `.`, a `-` that is first or last in a set is literal, ranges do not chain (`[a-c-f]` is
//! `[-acf]` plus `b`), and a malformed pattern (unterminated `[`, trailing `\`) matches nothing.
//! Glob crates (`glob`, `globset`, `wildmatch`) differ on several of these, and libc's `fnmatch`
//! would need FFI in a pure crate.
//!
//! Matching never backtracks: the pattern is split at `*` into fixed-length segments; the first
//! must match at the start, the last at the end, and each one in between at its leftmost
//! position after the previous (leftmost is always safe for fixed-length segments).

/// One pattern position; each consumes exactly one character of the haystack.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    Any,
    Set(Vec<(char, char)>),
    /// Malformed pattern: matches nothing.
    Never,
}

impl Token {
    fn matches(&self, c: char) -> bool {
        match self {
            Token::Literal(l) => *l == c,
            Token::Any => true,
            Token::Set(ranges) => ranges.iter().any(|(lo, hi)| *lo <= c && c <= *hi),
            Token::Never => false,
        }
    }
}

/// Reads a set after its `[`; returns the token and leaves `chars` after the closing `]`.
fn parse_set(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Token {
    let mut ranges = Vec::new();
    let mut first = true;
    let mut can_range = true;
    let mut previous: Option<char> = None;
    loop {
        let Some(c) = chars.next() else {
            return Token::Never;
        };
        let was_first = std::mem::replace(&mut first, false);
        if c == '\\' {
            let Some(escaped) = chars.next() else {
                return Token::Never;
            };
            ranges.push((escaped, escaped));
            previous = Some(escaped);
            can_range = true;
            continue;
        }
        if c == ']' && !was_first {
            return Token::Set(ranges);
        }
        if c == '-' && can_range && !was_first && chars.peek() != Some(&']') {
            let mut high = chars.next();
            if high == Some('\\') {
                high = chars.next();
            }
            let (Some(low), Some(high)) = (previous, high) else {
                return Token::Never;
            };
            ranges.push((low, high));
            can_range = false;
            continue;
        }
        ranges.push((c, c));
        previous = Some(c);
        can_range = true;
    }
}

/// Splits a pattern into `*`-separated segments of single-character tokens.
fn segments(pattern: &str) -> Vec<Vec<Token>> {
    let mut out = vec![Vec::new()];
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            '*' => {
                if out.last().is_some_and(|s| !s.is_empty()) || out.len() == 1 {
                    out.push(Vec::new());
                }
                continue;
            }
            '?' => Token::Any,
            '[' => parse_set(&mut chars),
            '\\' => chars.next().map_or(Token::Never, Token::Literal),
            c => Token::Literal(c),
        };
        if let Some(last) = out.last_mut() {
            last.push(token);
        }
    }
    out
}

fn matches_at(segment: &[Token], haystack: &[char]) -> bool {
    segment.len() <= haystack.len() && segment.iter().zip(haystack).all(|(t, c)| t.matches(*c))
}

/// `true` if `pattern` matches all of `haystack` under systemd-boot's `efi_fnmatch()` rules.
/// Case-sensitive: systemd-boot lower-cases both sides before calling it.
pub fn fnmatch(pattern: &str, haystack: &str) -> bool {
    let segs = segments(pattern);
    let hay: Vec<char> = haystack.chars().collect();
    let (first, rest) = match segs.split_first() {
        Some(split) => split,
        None => return hay.is_empty(),
    };
    let Some((last, middle)) = rest.split_last() else {
        // No `*`: the only segment must cover the whole haystack.
        return first.len() == hay.len() && matches_at(first, &hay);
    };
    if first.len() + last.len() > hay.len() || !matches_at(first, &hay) {
        return false;
    }
    let end = hay.len() - last.len();
    if !matches_at(last, &hay[end..]) {
        return false;
    }
    let mut pos = first.len();
    for seg in middle {
        let found = (pos..=end.saturating_sub(seg.len()))
            .take_while(|start| start + seg.len() <= end)
            .find(|start| matches_at(seg, &hay[*start..end]));
        match found {
            Some(start) => pos = start + seg.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::fnmatch;

    #[test]
    fn basics() {
        assert!(fnmatch("", ""));
        assert!(!fnmatch("", "a"));
        assert!(fnmatch("*", ""));
        assert!(fnmatch("**", "abc"));
        assert!(fnmatch("slate-*", "slate-1.2.3+2-1.efi"));
        assert!(!fnmatch("slate-*", "other-1.efi"));
        assert!(fnmatch("a?c", "abc"));
        assert!(!fnmatch("a?c", "ac"));
        assert!(fnmatch("*.efi", "x.efi"));
        assert!(!fnmatch("*.efi", ".ef"));
        assert!(fnmatch("a*b*c", "aXbYbZc"));
        assert!(!fnmatch("a*b*c", "aXcYb"));
        assert!(fnmatch("*ab*ab*", "abab"));
        assert!(!fnmatch("*ab*ab*", "aba"));
        assert!(!fnmatch("ab*ba", "aba"), "first and last may not overlap");
    }

    #[test]
    fn sets_and_escapes() {
        assert!(fnmatch("[abc]", "b"));
        assert!(fnmatch("[a-c]", "b"));
        assert!(!fnmatch("[a-c]", "d"));
        assert!(fnmatch("[!a]", "!"), "no negation in systemd-boot");
        assert!(!fnmatch("[!a]", "b"));
        assert!(fnmatch("[]]", "]"));
        assert!(
            fnmatch("[]-a]", "^"),
            "']' first is literal and may start a range"
        );
        assert!(fnmatch("[-a]", "-"));
        assert!(fnmatch("[a-]", "-"));
        assert!(fnmatch("[a-c-f]", "-"));
        assert!(fnmatch("[a-c-f]", "f"));
        assert!(!fnmatch("[a-c-f]", "e"), "ranges do not chain");
        assert!(fnmatch("[\\]]", "]"));
        assert!(fnmatch("[A-\\]]", "]"));
        assert!(!fnmatch("[a-\\]]", "]"), "reversed range is empty");
        assert!(fnmatch("\\*", "*"));
        assert!(!fnmatch("\\*", "a"));
        assert!(!fnmatch("a\\", "a"), "trailing escape matches nothing");
        assert!(!fnmatch("[abc", "a"), "unterminated set matches nothing");
        assert!(!fnmatch("*[abc", "xa"));
        assert!(!fnmatch("[a]", ""));
    }
}
