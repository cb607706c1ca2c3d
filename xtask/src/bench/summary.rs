//! `xtask bench`: every benchmark, one after another, then one JSON summary of all their
//! comparisons in target/bench/ — `summary-<short commit>.json` and `latest.json` — so that a
//! later commit's run can be set beside this one's.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::bench::{format_value, Comparison};
use crate::util::{output, repo_root, write_atomic};

/// The simulated fleet `xtask bench` rolls out to: a run took about 3 minutes here (the
/// inventory fills in one to two heartbeat intervals, then the rollout, whose policy minimum is
/// 50 s at any size, took 100–120 s), where 10,000 nodes would take several times that.
pub const OPERATOR_NODES: usize = 2_000;

/// Every benchmark, by the name `xtask bench` takes, in the order it runs them.
const ALL: [&str; 11] = [
    "rootfs",
    "rebuild",
    "apply",
    "pull",
    "boot",
    "reboot",
    "services",
    "fleetlock",
    "operator",
    "snapshot",
    "node-scrape",
];

fn run_one(name: &str, operator_nodes: usize) -> Result<Vec<Comparison>> {
    match name {
        "rootfs" => crate::bench::rootfs::bench_rootfs(),
        "rebuild" => crate::bench::rebuild::bench_rebuild(None),
        "apply" => crate::bench::apply::bench_apply(),
        "pull" => crate::bench::pull::bench_pull(),
        "boot" => crate::bench::boot::bench_boot(),
        "reboot" => crate::bench::reboot::bench_reboot(),
        "services" => crate::bench::services::bench_services(),
        "node-scrape" => crate::bench::node_scrape::bench_node_scrape(),
        // The 1,000-id series: the 10,000-id ones add minutes and say the same.
        "fleetlock" => crate::bench::fleetlock::bench_fleetlock(true),
        "operator" => crate::bench::operator::bench_operator(operator_nodes, false, 3, true),
        "snapshot" => crate::bench::snapshot::bench_snapshot(None),
        _ => bail!("no benchmark {name}: one of {}", ALL.join(", ")),
    }
}

/// The commit the tree is at (short), and whether it has uncommitted changes.
fn commit() -> (String, bool) {
    let git = |args: &[&str]| output(Command::new("git").args(args).current_dir(repo_root()));
    let short = git(&["rev-parse", "--short", "HEAD"])
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_ok_and(|s| !s.trim().is_empty());
    (short, dirty)
}

/// The summary of one `xtask bench` run.
fn summary_json(
    commit: &str,
    dirty: bool,
    unix_time: u64,
    comparisons: &[Comparison],
    seconds: &[(&str, Duration)],
    failed: &[(&str, String)],
) -> Value {
    let benchmarks: Vec<Value> = comparisons.iter().map(Comparison::to_json).collect();
    let seconds: serde_json::Map<String, Value> = seconds
        .iter()
        .map(|(name, d)| ((*name).to_owned(), json!(d.as_secs_f64())))
        .collect();
    let failed: Vec<Value> = failed
        .iter()
        .map(|(name, error)| json!({"bench": name, "error": error}))
        .collect();
    json!({
        "commit": commit,
        "dirty": dirty,
        "unix_time": unix_time,
        "cpus": std::thread::available_parallelism().map_or(0, usize::from),
        // The in-process sides (rootfs, pull, FleetLock, operator) run slate's crates as xtask
        // was built: a dev build leaves most of them unoptimized. Compare like with like.
        "xtask_optimized": !cfg!(debug_assertions),
        "benchmarks": benchmarks,
        "seconds": seconds,
        "failed": failed,
    })
}

/// Writes `summary` as target/bench/summary-<short>.json and latest.json; the first's path.
fn write_summary(short: &str, summary: &Value) -> Result<PathBuf> {
    let text = serde_json::to_string_pretty(summary)? + "\n";
    let dir = repo_root().join("target/bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("summary-{short}.json"));
    write_atomic(&path, &text)?;
    write_atomic(&dir.join("latest.json"), &text)?;
    Ok(path)
}

/// One line a comparison: the medians and the ratio, as the last thing printed.
fn print_table(comparisons: &[Comparison]) {
    let width = comparisons
        .iter()
        .map(|c| c.name().len())
        .max()
        .unwrap_or(0);
    println!(
        "{:<width$}  {:>10}  {:>10}  {:>7}  baseline",
        "benchmark", "slate", "baseline", "ratio"
    );
    for c in comparisons {
        let unit = c.unit();
        println!(
            "{:<width$}  {:>10}  {:>10}  {:>7}  {}",
            c.name(),
            format_value(c.slate.stats().median, unit),
            format_value(c.baseline.stats().median, unit),
            c.ratio()
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x")),
            c.baseline.name
        );
    }
}

/// Runs the benchmarks named in `only` (all when it is empty) and writes the summary.
pub fn bench_all(only: &[String], operator_nodes: usize) -> Result<()> {
    for name in only {
        ensure!(
            ALL.contains(&name.as_str()),
            "no benchmark {name}: one of {}",
            ALL.join(", ")
        );
    }
    let (short, dirty) = commit();
    let unix_time = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (mut comparisons, mut seconds, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for name in ALL
        .into_iter()
        .filter(|n| only.is_empty() || only.iter().any(|o| o == n))
    {
        println!("== bench-{name}");
        let start = Instant::now();
        // One benchmark's failure (a missing tool, a VM that did not boot) is recorded and
        // the others still run: the summary says what is missing.
        match run_one(name, operator_nodes) {
            Ok(done) => comparisons.extend(done),
            Err(e) => {
                println!("bench-{name} failed: {e:#}");
                failed.push((name, format!("{e:#}")));
            }
        }
        seconds.push((name, start.elapsed()));
        println!("== bench-{name}: {:.0} s\n", start.elapsed().as_secs_f64());
    }

    let summary = summary_json(&short, dirty, unix_time, &comparisons, &seconds, &failed);
    let path = write_summary(&short, &summary)?;
    let note = if dirty {
        "; the tree had uncommitted changes"
    } else {
        ""
    };
    println!("summary: {} (and latest.json){note}", path.display());
    print_table(&comparisons);
    ensure!(
        failed.is_empty(),
        "{} benchmark(s) failed: {}",
        failed.len(),
        failed
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Bench, Side};

    #[test]
    fn summary_shape() {
        let c = Bench::new("toy", "s")
            .run(
                Side::computed("slate", 2.0),
                Side::computed("cp", 1.0),
                vec![],
            )
            .unwrap();
        let v = summary_json(
            "abc1234",
            true,
            1_700_000_000,
            &[c],
            &[("toy", Duration::from_secs(3))],
            &[("boot", "no QEMU".to_owned())],
        );
        assert_eq!(v["commit"], "abc1234");
        assert_eq!(v["dirty"], true);
        assert_eq!(v["unix_time"], 1_700_000_000);
        let b = &v["benchmarks"][0];
        for key in [
            "name", "unit", "runs", "warm_up", "slate", "baseline", "ratio", "extra",
        ] {
            assert!(b.get(key).is_some(), "{key} missing from {b}");
        }
        for key in ["name", "median", "min", "max"] {
            assert!(
                b["slate"].get(key).is_some() && b["baseline"].get(key).is_some(),
                "{key}"
            );
        }
        assert_eq!(b["ratio"], 2.0);
        assert_eq!(v["seconds"]["toy"], 3.0);
        assert_eq!(v["failed"][0], json!({"bench": "boot", "error": "no QEMU"}));
    }

    #[test]
    fn unknown_names_are_refused_before_anything_runs() {
        let err = bench_all(&["rootfs".to_owned(), "nonsense".to_owned()], 100).unwrap_err();
        assert!(err.to_string().contains("no benchmark nonsense"), "{err}");
    }
}
