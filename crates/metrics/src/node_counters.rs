//! The node's outcome counters as they outlive a boot (docs/formats.md §16): upgrades, rollbacks
//! and boots by outcome, kept by machined in `metrics/counters` on STATE so that Prometheus
//! sees counters that only grow across reboots. A value here; machined reads and writes it.
//!
//! The text is one header line and one line per counter, `<family> <outcome> <count>`, sorted
//! and without repeats, so that a parsed record formats back to the same bytes. Families and
//! outcomes this version does not know are kept and written back: a node rolled back to an
//! older slate must not drop (and so reset) what a newer one counted.

use std::collections::BTreeMap;

/// The first line of every record; a later format would change the number.
pub const HEADER: &str = "slate-node-counters 1";
/// The most counters a record holds (slate itself uses about a dozen).
pub const MAX_COUNTERS: usize = 128;
/// The longest family or outcome name.
pub const MAX_NAME: usize = 32;
/// The largest record: the header and [`MAX_COUNTERS`] lines of the longest names and counts.
pub const MAX_RECORD_BYTES: usize = HEADER.len() + 1 + MAX_COUNTERS * (2 * MAX_NAME + 2 + 20 + 1);

/// Upgrades by outcome.
pub const UPGRADES: &str = "upgrades";
/// Returns to an older version by outcome.
pub const ROLLBACKS: &str = "rollbacks";
/// Boots by how they ended: settled at Running, or on the fatal path.
pub const BOOTS: &str = "boots";

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountersError {
    #[error("the record is {0} bytes, more than the {MAX_RECORD_BYTES} a counters record may be")]
    TooLong(usize),
    #[error("the record is not UTF-8 text")]
    NotText,
    #[error("the record does not start with `{HEADER}` and a line feed")]
    Header,
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("more than {MAX_COUNTERS} counters")]
    TooMany,
}

/// Counters by (family, outcome).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounters {
    counts: BTreeMap<(String, String), u64>,
}

/// A family or outcome: `[a-z0-9_]`, 1 to [`MAX_NAME`] bytes.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl NodeCounters {
    /// Reads a record (see the module's text); anything else is refused whole, with the line.
    pub fn parse(bytes: &[u8]) -> Result<Self, CountersError> {
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(CountersError::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| CountersError::NotText)?;
        let body = text
            .strip_prefix(HEADER)
            .and_then(|t| t.strip_prefix('\n'))
            .ok_or(CountersError::Header)?;
        let mut counts = BTreeMap::new();
        let mut previous: Option<(String, String)> = None;
        for (i, line) in body.split_inclusive('\n').enumerate() {
            let number = i + 2;
            let err = |reason: &str| CountersError::Line {
                line: number,
                reason: reason.to_owned(),
            };
            let line = line
                .strip_suffix('\n')
                .ok_or_else(|| err("the last line has no line feed"))?;
            let mut fields = line.split(' ');
            let (Some(family), Some(outcome), Some(count), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(err(
                    "not `<family> <outcome> <count>` separated by single spaces",
                ));
            };
            if !valid_name(family) || !valid_name(outcome) {
                return Err(err(&format!("names are 1 to {MAX_NAME} of a-z, 0-9 and _")));
            }
            let canonical = count.bytes().all(|b| b.is_ascii_digit())
                && !count.is_empty()
                && (count == "0" || !count.starts_with('0'));
            let count: u64 = count.parse().ok().filter(|_| canonical).ok_or_else(|| {
                err("the count is not a decimal number below 2^64 without leading zeros")
            })?;
            let key = (family.to_owned(), outcome.to_owned());
            if previous.as_ref().is_some_and(|p| *p >= key) {
                return Err(err(
                    "counters are sorted by family, then outcome, each once",
                ));
            }
            if counts.len() == MAX_COUNTERS {
                return Err(CountersError::TooMany);
            }
            previous = Some(key.clone());
            counts.insert(key, count);
        }
        Ok(NodeCounters { counts })
    }

    /// The record's bytes; [`NodeCounters::parse`] reads them back as they were.
    pub fn format(&self) -> Vec<u8> {
        let mut text = format!("{HEADER}\n");
        for ((family, outcome), count) in &self.counts {
            text.push_str(&format!("{family} {outcome} {count}\n"));
        }
        text.into_bytes()
    }

    /// One more of `outcome` in `family`. False (and nothing counted) for a name that is not
    /// valid or a new counter past [`MAX_COUNTERS`]; a count stops at `u64::MAX`.
    pub fn add(&mut self, family: &str, outcome: &str, n: u64) -> bool {
        if !valid_name(family) || !valid_name(outcome) {
            return false;
        }
        let key = (family.to_owned(), outcome.to_owned());
        if !self.counts.contains_key(&key) && self.counts.len() >= MAX_COUNTERS {
            return false;
        }
        let count = self.counts.entry(key).or_default();
        *count = count.saturating_add(n);
        true
    }

    /// Adds every counter of `other` (what a boot counted before its record was read).
    pub fn merge(&mut self, other: &NodeCounters) {
        for ((family, outcome), n) in &other.counts {
            self.add(family, outcome, *n);
        }
    }

    pub fn get(&self, family: &str, outcome: &str) -> u64 {
        self.counts
            .get(&(family.to_owned(), outcome.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// `family`'s counters: each of `known` (0 when never counted), then any other outcome
    /// the record holds, in name order.
    pub fn family(&self, family: &str, known: &[&str]) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = known
            .iter()
            .map(|o| ((*o).to_owned(), self.get(family, o)))
            .collect();
        for ((f, outcome), n) in &self.counts {
            if f == family && !known.contains(&outcome.as_str()) {
                out.push((outcome.clone(), *n));
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/formats.md §16's vector.
    const VECTOR: &str = "slate-node-counters 1\nboots committed 7\nrollbacks reverted 1\n\
                          upgrades committed 2\nupgrades installed 3\n";

    #[test]
    fn the_documented_vector_reads_and_formats_back() {
        let c = NodeCounters::parse(VECTOR.as_bytes()).unwrap();
        assert_eq!(c.get(BOOTS, "committed"), 7);
        assert_eq!(c.get(ROLLBACKS, "reverted"), 1);
        assert_eq!(c.get(UPGRADES, "installed"), 3);
        assert_eq!(c.get(UPGRADES, "failed"), 0);
        assert_eq!(c.format(), VECTOR.as_bytes());
        assert_eq!(
            c.family(UPGRADES, &["installed", "failed"]),
            vec![
                ("installed".to_owned(), 3),
                ("failed".to_owned(), 0),
                ("committed".to_owned(), 2)
            ]
        );
    }

    #[test]
    fn counting_and_merging_add_up() {
        let mut c = NodeCounters::default();
        assert!(c.add(UPGRADES, "committed", 1));
        assert!(c.add(UPGRADES, "committed", 1));
        assert!(!c.add(UPGRADES, "Committed", 1));
        assert!(!c.add("", "x", 1));
        let mut before = NodeCounters::default();
        before.add(ROLLBACKS, "reverted", 1);
        before.add(UPGRADES, "committed", u64::MAX);
        c.merge(&before);
        assert_eq!(c.get(UPGRADES, "committed"), u64::MAX);
        assert_eq!(c.get(ROLLBACKS, "reverted"), 1);
        assert_eq!(NodeCounters::parse(&c.format()).unwrap(), c);
    }

    #[test]
    fn a_newer_slate_s_counters_are_kept() {
        let text = format!("{HEADER}\nfuture_family x 4\nupgrades newer_outcome 9\n");
        let c = NodeCounters::parse(text.as_bytes()).unwrap();
        assert_eq!(c.format(), text.as_bytes());
        assert_eq!(
            c.family(UPGRADES, &["committed"]),
            vec![("committed".to_owned(), 0), ("newer_outcome".to_owned(), 9)]
        );
    }

    #[test]
    fn bad_records_are_refused_with_the_line() {
        let refused = |text: &str| {
            NodeCounters::parse(text.as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert!(refused("").contains("does not start with"));
        assert!(refused("slate-node-counters 2\n").contains("does not start with"));
        let line = |body: &str| refused(&format!("{HEADER}\n{body}"));
        assert_eq!(
            line("upgrades committed 1"),
            "line 2: the last line has no line feed"
        );
        assert!(line("upgrades committed\n").starts_with("line 2: not `<family>"));
        assert!(line("upgrades  committed 1\n").starts_with("line 2: not"));
        assert!(line("upgrades committed 01\n").contains("leading zeros"));
        assert!(line("upgrades committed -1\n").contains("decimal"));
        assert!(line("upgrades committed 18446744073709551616\n").contains("2^64"));
        assert!(line("Upgrades committed 1\n").contains("a-z"));
        assert!(line("upgrades b 1\nupgrades a 1\n").starts_with("line 3: counters are sorted"));
        assert!(line("upgrades a 1\nupgrades a 2\n").starts_with("line 3:"));
        assert!(refused("slate-node-counters 1\nupgrades a 1\r\n").contains("line 2"));
        let many: String = (0..=MAX_COUNTERS)
            .map(|i| format!("f o{i:04} 1\n"))
            .collect();
        assert!(line(&many).contains("more than"));
        assert!(refused(&"x".repeat(MAX_RECORD_BYTES + 1)).contains("bytes"));
        assert_eq!(
            NodeCounters::parse(&[0xff]).unwrap_err(),
            CountersError::NotText
        );
    }
}
