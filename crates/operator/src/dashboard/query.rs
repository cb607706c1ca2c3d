//! The dashboard's query parameters, read strictly: a page takes only the parameters it names,
//! each once, percent-decoded to UTF-8, within a length; anything else is refused with a
//! message naming it, so a mistyped or hostile URL is answered, not guessed at.

use std::collections::BTreeMap;

/// The longest query string a page reads (hyper already bounds the whole request head).
pub const MAX_QUERY: usize = 2048;
/// The longest value of one parameter, decoded.
pub const MAX_VALUE: usize = 256;

/// Why a query was refused (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the query string is {0} bytes; a page takes at most {MAX_QUERY}")]
    TooLong(usize),
    #[error("unknown parameter {name:?}; this page takes {known}")]
    Unknown { name: String, known: String },
    #[error("parameter {0:?} is given more than once")]
    Repeated(String),
    #[error("parameter {0:?} is not valid percent-encoded UTF-8")]
    Encoding(String),
    #[error("parameter {name:?} is over {MAX_VALUE} bytes")]
    ValueTooLong { name: String },
    #[error("parameter {name:?}: {why}")]
    Invalid { name: String, why: String },
}

/// The parameters of one request, by name.
#[derive(Debug, Default)]
pub struct Query {
    values: BTreeMap<String, String>,
}

impl Query {
    /// Parses `raw` (without `?`), taking only parameters named in `known`.
    pub fn parse(raw: Option<&str>, known: &[&str]) -> Result<Query, QueryError> {
        let raw = raw.unwrap_or("");
        if raw.len() > MAX_QUERY {
            return Err(QueryError::TooLong(raw.len()));
        }
        let mut values = BTreeMap::new();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(name).ok_or_else(|| QueryError::Encoding(shown(name)))?;
            if !known.contains(&name.as_str()) {
                return Err(QueryError::Unknown {
                    name: shown(&name),
                    known: if known.is_empty() {
                        "no parameters".into()
                    } else {
                        known.join(", ")
                    },
                });
            }
            let value = decode(value).ok_or_else(|| QueryError::Encoding(name.clone()))?;
            if value.len() > MAX_VALUE {
                return Err(QueryError::ValueTooLong { name });
            }
            if values.insert(name.clone(), value).is_some() {
                return Err(QueryError::Repeated(name));
            }
        }
        Ok(Query { values })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// A count: digits only, at least 1. A value above `max` is clamped to it, and the
    /// second value says so (the page tells the reader).
    pub fn count(&self, name: &str, default: usize, max: usize) -> Result<Clamped, QueryError> {
        let Some(text) = self.get(name) else {
            return Ok(Clamped {
                value: default,
                asked: None,
            });
        };
        let invalid = |why: &str| QueryError::Invalid {
            name: name.into(),
            why: why.into(),
        };
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("not a whole number of 1 or more"));
        }
        // Digits only: a parse error is an overflow, which is above any bound.
        let asked = text.parse::<u128>().unwrap_or(u128::MAX);
        if asked == 0 {
            return Err(invalid("not a whole number of 1 or more"));
        }
        if asked > max as u128 {
            return Ok(Clamped {
                value: max,
                asked: Some(text.chars().take(40).collect()),
            });
        }
        Ok(Clamped {
            value: asked as usize,
            asked: None,
        })
    }
}

/// A count as used, and what was asked when it was more than the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clamped {
    pub value: usize,
    pub asked: Option<String>,
}

/// A name as the operator stores them (node ids, groups): 1-128 of `[A-Za-z0-9-_.]`, the
/// check every heartbeat passed; anything else cannot be a stored name.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A client's text as an error message shows it: its first 64 characters, debug-quoted by
/// the caller.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; the bytes
/// must be UTF-8.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_parameters_decode_and_others_are_refused() {
        let q = Query::parse(Some("id=n%2D1&events=5"), &["id", "events"]).unwrap();
        assert_eq!(q.get("id"), Some("n-1"));
        assert_eq!(q.count("events", 50, 100).unwrap().value, 5);
        for (raw, want) in [
            ("x=1", "unknown parameter \"x\""),
            ("id=a&id=b", "more than once"),
            ("id=%ff", "percent-encoded UTF-8"),
            ("id=%4", "percent-encoded UTF-8"),
            ("id=%zz", "percent-encoded UTF-8"),
        ] {
            let e = Query::parse(Some(raw), &["id"]).unwrap_err().to_string();
            assert!(e.contains(want), "{raw}: {e}");
        }
        let long = "id=".to_owned() + &"a".repeat(MAX_QUERY);
        assert!(matches!(
            Query::parse(Some(&long), &["id"]),
            Err(QueryError::TooLong(_))
        ));
        let long = "id=".to_owned() + &"a".repeat(MAX_VALUE + 1);
        assert!(matches!(
            Query::parse(Some(&long), &["id"]),
            Err(QueryError::ValueTooLong { .. })
        ));
    }

    #[test]
    fn counts_are_bounded_and_say_so() {
        let q = |raw: &str| Query::parse(Some(raw), &["n"]).unwrap();
        assert_eq!(q("").count("n", 7, 100).unwrap().value, 7);
        let huge = q("n=99999999999999999999999999999999999999999999");
        let c = huge.count("n", 7, 100).unwrap();
        assert_eq!(c.value, 100);
        assert!(c.asked.is_some());
        for bad in ["n=0", "n=-1", "n=1e9", "n=", "n=%201"] {
            assert!(q(bad).count("n", 7, 100).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_what_a_heartbeat_may_carry() {
        assert!(is_name("node-1.a_b"));
        for bad in ["", "../x", "a/b", "<b>", &"a".repeat(129)] {
            assert!(!is_name(bad), "{bad}");
        }
    }
}
