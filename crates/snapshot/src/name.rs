//! Snapshot names: `root-YYYYMMDD-HHMMSS` in UTC (docs/formats.md §12.1). Fixed width, so the
//! byte order of names is their time order, and systemd-boot's version order of the entry IDs
//! built from them agrees (the digit runs compare as numbers).

use std::fmt;

use crate::SnapshotError;

/// Every snapshot's name starts with this; other subvolumes on the pool (`@home`) are not
/// snapshots and are never touched.
pub const PREFIX: &str = "root-";

/// A valid snapshot name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnapshotName(String);

impl SnapshotName {
    /// The name for an instant (seconds since the Unix epoch, UTC).
    pub fn at(epoch_secs: u64) -> SnapshotName {
        let (y, mo, d, h, mi, s) = civil(epoch_secs);
        SnapshotName(format!("{PREFIX}{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}"))
    }

    /// Parses `root-YYYYMMDD-HHMMSS` with a real calendar date and time.
    pub fn parse(s: &str) -> Result<SnapshotName, SnapshotError> {
        let bad = |reason: &str| SnapshotError::InvalidName {
            name: s.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = s
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("does not start with root-"))?;
        let b = rest.as_bytes();
        let shape =
            b.len() == 15 && b[8] == b'-' && b[..8].iter().chain(&b[9..]).all(u8::is_ascii_digit);
        if !shape {
            return Err(bad("expected root-YYYYMMDD-HHMMSS"));
        }
        let num = |r: std::ops::Range<usize>| rest[r].parse::<u32>().unwrap_or(u32::MAX);
        let (y, mo, d) = (num(0..4), num(4..6), num(6..8));
        let (h, mi, sec) = (num(9..11), num(11..13), num(13..15));
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let days = match mo {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return Err(bad("month out of range")),
        };
        if y < 1970 || d == 0 || d > days || h > 23 || mi > 59 || sec > 59 {
            return Err(bad("not a valid UTC date and time"));
        }
        Ok(SnapshotName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `YYYY-MM-DD HH:MM:SS`, for titles.
    pub fn display_time(&self) -> String {
        let r = &self.0[PREFIX.len()..];
        format!(
            "{}-{}-{} {}:{}:{}",
            &r[0..4],
            &r[4..6],
            &r[6..8],
            &r[9..11],
            &r[11..13],
            &r[13..15]
        )
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// (year, month, day, hour, minute, second) in UTC, by the days-from-civil inverse with
/// 400-year eras and March-based years (the leap day ends the year).
fn civil(epoch: u64) -> (i64, i64, i64, u64, u64, u64) {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let doe = shifted - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, secs / 3600, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_instants() {
        // 2026-06-28T09:30:00Z
        assert_eq!(
            SnapshotName::at(1_782_639_000).as_str(),
            "root-20260628-093000"
        );
        assert_eq!(SnapshotName::at(0).as_str(), "root-19700101-000000");
        assert_eq!(
            SnapshotName::at(951_782_400).as_str(),
            "root-20000229-000000"
        );
        let n = SnapshotName::parse("root-20260628-093000").unwrap();
        assert_eq!(n.display_time(), "2026-06-28 09:30:00");
    }

    #[test]
    fn refusals() {
        for bad in [
            "root-2026062-093000",
            "root-20260231-093000",
            "root-20260628-243000",
            "root-20260628_093000",
            "@home",
            "root-20260628-093000+3",
            "root-２0260628-093000",
            "root-20250229-000000",
        ] {
            assert!(SnapshotName::parse(bad).is_err(), "{bad}");
        }
        assert!(SnapshotName::parse("root-20240229-235959").is_ok());
    }
}
