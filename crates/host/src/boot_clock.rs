//! The boot's own clock: time since the kernel started (the monotonic clock, which the
//! console's `[    4.123456]` timestamps count too), and the milestones slate's init leaves
//! for machined in `/run` (a tmpfs that moves into the new root with the switch).

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

/// Where init records its milestones, one `<name>\t<microseconds since boot>` per line.
pub const INIT_MILESTONES: &str = "/run/slate/init-milestones";

/// Time since the kernel started.
pub fn since_boot() -> Duration {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Appends `name` at the current time to `file` (best effort: a boot is not failed for its
/// breakdown).
pub fn record_milestone(file: &Path, name: &str) {
    record_milestone_at(file, name, since_boot());
}

/// Appends `name` at `at` (time since boot) to `file`, best effort.
pub fn record_milestone_at(file: &Path, name: &str, at: Duration) {
    let line = format!("{name}\t{}\n", at.as_micros());
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(line.as_bytes()));
}

/// The milestones in `text` (as [`record_milestone`] writes them), in order; malformed lines
/// are skipped.
pub fn parse_milestones(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let (name, micros) = line.split_once('\t')?;
            Some((name.to_owned(), micros.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milestones_round_trip_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub/milestones");
        record_milestone(&file, "init started");
        record_milestone(&file, "root mounted");
        let got = parse_milestones(&std::fs::read_to_string(&file).unwrap());
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].0.as_str(), got[1].0.as_str()),
            ("init started", "root mounted")
        );
        assert!(got[0].1 <= got[1].1 && got[1].1 > 0);
        assert_eq!(
            parse_milestones("x\ty\nok\t12\nbroken\n"),
            [("ok".to_owned(), 12)]
        );
    }
}
