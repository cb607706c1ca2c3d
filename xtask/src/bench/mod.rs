//! Benchmarks (not tests): what every `xtask bench-*` shares. Each benchmark describes its two
//! sides — slate and a named baseline doing the same work by other means — and this module
//! measures them the same way, prints the median and spread of each, and prints the ratio
//! (slate median / baseline median) last. Ratios are what matter: these machines are shared
//! and absolute times mean little.
//!
//! How caches are warmed, for both sides alike: one untimed warm-up run of each side before the
//! measured runs (its figure is printed, marked "not counted"). Dropping the page cache was the
//! other choice; it would also slow every other job on a shared machine, and cold caches are
//! not what a node sees on its second upgrade. The measured runs then alternate slate,
//! baseline, slate, … so that a neighbour's burst of load falls on both sides rather than on
//! whichever happened to run then.

pub(crate) mod apply;
mod apply_bare;
pub(crate) mod boot;
pub(crate) mod delta;
mod delta_inputs;
pub(crate) mod fleetlock;
pub(crate) mod node_scrape;
pub(crate) mod operator;
pub(crate) mod operator_replica;
pub(crate) mod operator_scrape;
pub(crate) mod operator_where;
pub(crate) mod pull;
pub(crate) mod reboot;
pub(crate) mod rebuild;
pub(crate) mod rootfs;
pub(crate) mod services;
pub(crate) mod snapshot;
pub(crate) mod summary;
pub(crate) mod var;

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};

/// Measured runs of each side.
pub const RUNS: usize = 3;

/// The median, smallest and largest of a side's measured runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// `None` for no samples. An even count takes the mean of the middle two.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Some(Stats {
            median,
            min: sorted[0],
            max: sorted[n - 1],
        })
    }

    fn to_json(self) -> Value {
        json!({"median": self.median, "min": self.min, "max": self.max})
    }
}

/// slate's median over the baseline's; `None` where the baseline's is not above zero (no
/// meaningful ratio, and JSON has no infinity).
/// A ratio with two decimals, or four significant ones below 0.1 (a snapshot's bytes against a
/// full copy would read 0.00x).
pub fn ratio_text(r: f64) -> String {
    if r != 0.0 && r.abs() < 0.1 {
        format!("{r:.4}")
    } else {
        format!("{r:.2}")
    }
}

pub fn ratio(slate: Stats, baseline: Stats) -> Option<f64> {
    (baseline.median > 0.0).then(|| slate.median / baseline.median)
}

/// The `p`th percentile (nearest rank) of an ascending slice; `None` when it is empty.
pub fn percentile<T: Copy>(sorted: &[T], p: usize) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[(sorted.len() * p / 100).min(last)])
}

/// Milliseconds, for figures kept in a `Duration`.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `f` and returns what it returned and how long it took, in seconds: for a side whose
/// run has untimed preparation before the part that counts.
pub fn stopwatch<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let start = Instant::now();
    let value = f()?;
    Ok((value, start.elapsed().as_secs_f64()))
}

/// `len` incompressible, reproducible bytes (xorshift): payloads that no filesystem, cache or
/// transport can shortcut.
pub fn noise(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// One run's measurement, in the comparison's unit, and any other figures read off the same
/// run (an image's size, a latency percentile), each aggregated over the runs like the value.
#[derive(Debug, Clone)]
pub struct Sample {
    value: f64,
    figures: Vec<(&'static str, &'static str, f64)>,
}

impl Sample {
    pub fn new(value: f64) -> Sample {
        Sample {
            value,
            figures: Vec::new(),
        }
    }

    /// Another figure of this run: its name, its unit and its value.
    pub fn with(mut self, name: &'static str, unit: &'static str, value: f64) -> Sample {
        self.figures.push((name, unit, value));
        self
    }

    /// The other figures, in the order they were added.
    #[cfg(test)]
    pub fn figures(&self) -> impl Iterator<Item = (&'static str, &'static str, f64)> + '_ {
        self.figures.iter().copied()
    }
}

type Measure<'a> = Box<dyn FnMut(usize) -> Result<Sample> + 'a>;

/// One side of a comparison: a name for the output, and how to measure one run of it. The
/// closure gets the run's number (0 for the warm-up, then 1, 2, …) to keep files or ids of
/// different runs apart.
pub struct Side<'a> {
    name: String,
    measure: Measure<'a>,
}

impl<'a> Side<'a> {
    /// A side whose closure measures one run: it times the part that counts (`stopwatch`,
    /// leaving its preparation out) or reads its figure elsewhere (a kernel timestamp).
    pub fn new(name: &str, measure: impl FnMut(usize) -> Result<Sample> + 'a) -> Side<'a> {
        Side {
            name: name.to_owned(),
            measure: Box::new(measure),
        }
    }

    /// A baseline that is computed, not run (a theoretical minimum): every run gives `value`.
    pub fn computed(name: &str, value: f64) -> Side<'a> {
        Side::new(name, move |_| Ok(Sample::new(value)))
    }
}

/// What one side gave over all runs.
#[derive(Debug, Clone)]
pub struct Measured {
    pub name: String,
    pub samples: Vec<f64>,
    /// The warm-up run's value, when there was one.
    pub warm_up: Option<f64>,
    /// (name, unit, one value per measured run), in the order the runs first gave them.
    figures: Vec<(&'static str, &'static str, Vec<f64>)>,
}

impl Measured {
    fn new(name: String) -> Measured {
        Measured {
            name,
            samples: Vec::new(),
            warm_up: None,
            figures: Vec::new(),
        }
    }

    fn record(&mut self, sample: Sample) {
        self.samples.push(sample.value);
        for (name, unit, value) in sample.figures {
            match self.figures.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, _, values)) => values.push(value),
                None => self.figures.push((name, unit, vec![value])),
            }
        }
    }

    pub fn stats(&self) -> Stats {
        // A Measured only leaves `Bench::run` with RUNS (at least one) samples.
        Stats::of(&self.samples).unwrap_or(Stats {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        })
    }

    /// The median of a figure the runs reported.
    pub fn figure(&self, name: &str) -> Option<f64> {
        let (_, _, values) = self.figures.iter().find(|(n, _, _)| *n == name)?;
        Stats::of(values).map(|s| s.median)
    }

    fn to_json(&self) -> Value {
        let mut side = self.stats().to_json();
        side["name"] = json!(self.name);
        side["samples"] = json!(self.samples);
        side["warm_up"] = json!(self.warm_up);
        side
    }
}

/// How one comparison is to be measured: its name, unit, and what the output says it is.
#[derive(Debug, Clone)]
pub struct Bench {
    name: String,
    unit: &'static str,
    about: Vec<String>,
    runs: usize,
    /// Why there is no warm-up run, for the rare benchmark that has none.
    no_warm_up: Option<String>,
}

impl Bench {
    pub fn new(name: &str, unit: &'static str) -> Bench {
        Bench {
            name: name.to_owned(),
            unit,
            about: Vec::new(),
            runs: RUNS,
            no_warm_up: None,
        }
    }

    /// Measured runs of each side instead of [`RUNS`] (a benchmark that takes minutes a run,
    /// told by hand).
    pub fn runs(mut self, runs: usize) -> Bench {
        self.runs = runs.max(1);
        self
    }

    /// A line printed under the name: what is measured, on what.
    pub fn about(mut self, line: impl Into<String>) -> Bench {
        self.about.push(line.into());
        self
    }

    /// No warm-up run, for the stated reason (printed, and kept in the summary).
    pub fn no_warm_up(mut self, why: &str) -> Bench {
        self.no_warm_up = Some(why.to_owned());
        self
    }

    fn warm_up_text(&self) -> String {
        match &self.no_warm_up {
            Some(why) => format!("no warm-up run: {why}"),
            None => "one untimed warm-up run of each side".to_owned(),
        }
    }

    /// Measures slate against the baseline, and the `also` sides in the same rotation (further
    /// references, reported under the comparison's extras), printing each run as it ends;
    /// `Comparison::print` then gives the result.
    pub fn run(
        self,
        slate: Side<'_>,
        baseline: Side<'_>,
        also: Vec<Side<'_>>,
    ) -> Result<Comparison> {
        let mut sides: Vec<Side<'_>> = [slate, baseline].into_iter().chain(also).collect();
        let mut measured: Vec<Measured> = sides
            .iter()
            .map(|s| Measured::new(s.name.clone()))
            .collect();
        println!(
            "{} ({}, {} runs each; {})",
            self.name,
            self.unit,
            self.runs,
            self.warm_up_text()
        );
        for line in &self.about {
            println!("  {line}");
        }
        let first = if self.no_warm_up.is_some() { 1 } else { 0 };
        for run in first..=self.runs {
            let mut line = Vec::new();
            for (side, m) in sides.iter_mut().zip(&mut measured) {
                let sample = (side.measure)(run)
                    .map_err(|e| e.context(format!("{}: {}, run {run}", self.name, side.name)))?;
                line.push(format!(
                    "{} {}",
                    side.name,
                    format_value(sample.value, self.unit)
                ));
                if run == 0 {
                    m.warm_up = Some(sample.value);
                } else {
                    m.record(sample);
                }
            }
            let label = if run == 0 {
                "warm-up (not counted)".to_owned()
            } else {
                format!("run {run}/{}", self.runs)
            };
            println!("  {label}: {}", line.join(", "));
        }
        let also = measured.split_off(2);
        let [slate, baseline]: [Measured; 2] = measured.try_into().expect("slate and baseline");
        Ok(Comparison {
            bench: self,
            slate,
            baseline,
            also,
            extra: Vec::new(),
        })
    }
}

/// A measured comparison: printed by `print` (the ratio last), summarised by `to_json`.
#[derive(Debug, Clone)]
pub struct Comparison {
    bench: Bench,
    pub slate: Measured,
    pub baseline: Measured,
    also: Vec<Measured>,
    /// Figures the benchmark adds beyond the runs' own: key, value, and the line printed.
    extra: Vec<(String, Value, String)>,
}

impl Comparison {
    pub fn name(&self) -> &str {
        &self.bench.name
    }

    pub fn unit(&self) -> &'static str {
        self.bench.unit
    }

    pub fn ratio(&self) -> Option<f64> {
        ratio(self.slate.stats(), self.baseline.stats())
    }

    /// The further references measured beside the baseline, in `Bench::run`'s order.
    pub fn also(&self) -> &[Measured] {
        &self.also
    }

    /// A figure about the comparison as a whole (over all runs), kept under `key` in the
    /// summary's extras and printed as `line` before the ratio.
    pub fn extra(&mut self, key: &str, value: Value, line: impl Into<String>) {
        self.extra.push((key.to_owned(), value, line.into()));
    }

    /// The medians and spreads, the other figures, and the ratio as the last line.
    pub fn print(&self) {
        let unit = self.bench.unit;
        let width = [&self.slate, &self.baseline]
            .into_iter()
            .chain(&self.also)
            .map(|m| m.name.len())
            .max()
            .unwrap_or(0);
        let roles = [("slate", &self.slate), ("baseline", &self.baseline)];
        for (role, m) in roles
            .into_iter()
            .chain(self.also.iter().map(|m| ("also", m)))
        {
            println!(
                "  {role:<8} {:<width$}  {}",
                m.name,
                format_stats(m.stats(), unit)
            );
        }
        // Figures are labelled by role, or by name for the further references.
        let labelled = roles
            .into_iter()
            .chain(self.also.iter().map(|m| (m.name.as_str(), m)));
        for (label, m) in labelled {
            for (name, fig_unit, values) in &m.figures {
                if let Some(stats) = Stats::of(values) {
                    let name = name.replace('_', " ");
                    println!("  {label} {name}: {}", format_stats(stats, fig_unit));
                }
            }
        }
        for m in &self.also {
            if let Some(r) = ratio(self.slate.stats(), m.stats()) {
                println!("  slate / {}: {r:.2}x", m.name);
            }
            if let Some(r) = ratio(m.stats(), self.baseline.stats()) {
                println!("  {} / {}: {r:.2}x", m.name, self.baseline.name);
            }
        }
        for (_, _, line) in &self.extra {
            println!("  {line}");
        }
        println!("  {}", self.ratio_line());
    }

    fn ratio_line(&self) -> String {
        let (s, b) = (self.slate.stats(), self.baseline.stats());
        let Some(r) = self.ratio() else {
            return format!("ratio: none (the baseline's median is {})", b.median);
        };
        let difference = s.median - b.median;
        let sign = if difference < 0.0 { "-" } else { "+" };
        format!(
            "ratio (slate / {}): {}x ({sign}{} by the medians)",
            self.baseline.name,
            ratio_text(r),
            format_value(difference.abs(), self.bench.unit)
        )
    }

    /// One entry of the `xtask bench` summary.
    pub fn to_json(&self) -> Value {
        let mut extra = serde_json::Map::new();
        for (role, m) in [("slate", &self.slate), ("baseline", &self.baseline)] {
            for (name, unit, values) in &m.figures {
                extra.insert(format!("{role}_{name}"), figure_json(unit, values));
            }
        }
        for m in &self.also {
            let mut side = m.to_json();
            side["ratio"] = json!(ratio(self.slate.stats(), m.stats()));
            side["ratio_to_baseline"] = json!(ratio(m.stats(), self.baseline.stats()));
            for (name, unit, values) in &m.figures {
                side[*name] = figure_json(unit, values);
            }
            extra.insert(m.name.clone(), side);
        }
        for (key, value, _) in &self.extra {
            extra.insert(key.clone(), value.clone());
        }
        json!({
            "name": self.bench.name,
            "unit": self.bench.unit,
            "runs": self.bench.runs,
            "warm_up": self.bench.warm_up_text(),
            "slate": self.slate.to_json(),
            "baseline": self.baseline.to_json(),
            "ratio": self.ratio(),
            "extra": extra,
        })
    }
}

fn figure_json(unit: &str, values: &[f64]) -> Value {
    let mut figure = Stats::of(values).map_or(json!({}), Stats::to_json);
    figure["unit"] = json!(unit);
    figure
}

/// After a benchmark of several comparisons: every ratio once more, so that they come last.
pub fn print_ratios(comparisons: &[Comparison]) {
    if comparisons.len() < 2 {
        return;
    }
    println!("ratios (slate median / baseline median):");
    let width = comparisons
        .iter()
        .map(|c| c.name().len())
        .max()
        .unwrap_or(0);
    for c in comparisons {
        match c.ratio() {
            Some(r) => println!(
                "  {:<width$}  {}x vs {}",
                c.name(),
                ratio_text(r),
                c.baseline.name
            ),
            None => println!("  {:<width$}  none", c.name()),
        }
    }
}

/// A value for reading: seconds under one as milliseconds, whole numbers as they are, anything
/// else to four significant digits.
pub fn format_value(value: f64, unit: &str) -> String {
    if unit == "s" && value.abs() < 1.0 && value != 0.0 {
        return format_value(value * 1e3, "ms");
    }
    let number = if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        // Digits after the point that leave four significant ones (none past the thousands).
        let magnitude = value.abs().log10().floor();
        let decimals = if magnitude.is_finite() {
            (3.0 - magnitude).clamp(0.0, 6.0)
        } else {
            0.0
        };
        format!("{value:.*}", decimals as usize)
    };
    match unit {
        "" => number,
        _ if unit.starts_with('/') => format!("{number}{unit}"),
        _ => format!("{number} {unit}"),
    }
}

fn format_stats(s: Stats, unit: &str) -> String {
    if s.min == s.max {
        return format!("{} (every run)", format_value(s.median, unit));
    }
    format!(
        "median {}, spread {} – {}",
        format_value(s.median, unit),
        format_value(s.min, unit),
        format_value(s.max, unit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let even = Stats::of(&[4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((even.median, even.min, even.max), (3.0, 1.0, 10.0));
        let one = Stats::of(&[0.5]).unwrap();
        assert_eq!((one.median, one.min, one.max), (0.5, 0.5, 0.5));
        assert_eq!(Stats::of(&[]), None);
    }

    #[test]
    fn ratio_of_medians() {
        let slate = Stats::of(&[2.0, 9.0, 3.0]).unwrap();
        let base = Stats::of(&[1.0, 1.5, 100.0]).unwrap();
        assert_eq!(ratio(slate, base), Some(2.0));
        let zero = Stats::of(&[0.0, 0.0, 0.0]).unwrap();
        assert_eq!(ratio(slate, zero), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), Some(51));
        assert_eq!(percentile(&v, 99), Some(100));
        assert_eq!(percentile(&v, 100), Some(100));
        assert_eq!(percentile::<u32>(&[], 50), None);
    }

    #[test]
    fn values_read_well() {
        assert_eq!(format_value(0.7412, "s"), "741.2 ms");
        assert_eq!(format_value(2.7312, "s"), "2.731 s");
        assert_eq!(format_value(12.34567, "s"), "12.35 s");
        assert_eq!(format_value(1234.0, "B"), "1234 B");
        assert_eq!(format_value(278.284, "/s"), "278.3/s");
        assert_eq!(format_value(0.0, ""), "0");
        assert_eq!(format_value(3.456789, ""), "3.457");
        assert_eq!(
            format_stats(Stats::of(&[5.5]).unwrap(), "s"),
            "5.500 s (every run)"
        );
    }

    /// Two sides whose runs give fixed values: warm-up first, then alternating, numbered.
    #[test]
    fn runs_alternate_after_one_warm_up_each() {
        let order = std::cell::RefCell::new(Vec::new());
        let slate = Side::new("fast", |run| {
            order.borrow_mut().push(("slate", run));
            Ok(Sample::new([9.0, 2.0, 4.0, 3.0][run]).with("size", "B", 100.0 + run as f64))
        });
        let baseline = Side::new("slow", |run| {
            order.borrow_mut().push(("baseline", run));
            Ok(Sample::new([8.0, 1.0, 2.0, 1.5][run]))
        });
        let c = Bench::new("toy", "s").run(slate, baseline, vec![]).unwrap();
        let expected: Vec<_> = (0..=RUNS)
            .flat_map(|r| [("slate", r), ("baseline", r)])
            .collect();
        assert_eq!(*order.borrow(), expected);
        assert_eq!(c.slate.warm_up, Some(9.0));
        assert_eq!(c.slate.samples, [2.0, 4.0, 3.0]);
        assert_eq!(c.ratio(), Some(2.0));
    }

    #[test]
    fn no_warm_up_when_told() {
        let mut runs = Vec::new();
        let slate = Side::new("s", |run| {
            runs.push(run);
            Ok(Sample::new(1.0))
        });
        let c = Bench::new("toy", "s")
            .no_warm_up("nothing to warm")
            .run(slate, Side::computed("minimum", 0.5), vec![])
            .unwrap();
        assert_eq!(runs, [1, 2, 3]);
        assert_eq!(c.baseline.warm_up, None);
        assert_eq!(c.to_json()["warm_up"], "no warm-up run: nothing to warm");
    }

    /// The summary entry has every field `xtask bench` promises, with the figures under extra.
    #[test]
    fn summary_entry_shape() {
        let mut n = 0.0;
        let slate = Side::new("slate build", |_| {
            n += 1.0;
            Ok(Sample::new(n).with("size", "B", 4096.0))
        });
        let other = Side::computed("one core", 4.0);
        let mut c = Bench::new("rootfs demo", "s")
            .run(slate, Side::computed("mksquashfs", 1.0), vec![other])
            .unwrap();
        c.extra("note", json!({"p50": 1.5}), "note: p50 1.5");
        let v = c.to_json();
        assert_eq!(v["name"], "rootfs demo");
        assert_eq!(v["unit"], "s");
        assert_eq!(v["runs"], RUNS);
        // Run 0 (1.0) was the warm-up; the measured runs gave 2, 3 and 4.
        assert_eq!(v["slate"]["name"], "slate build");
        assert_eq!(v["slate"]["median"], 3.0);
        assert_eq!(v["slate"]["min"], 2.0);
        assert_eq!(v["slate"]["max"], 4.0);
        assert_eq!(v["slate"]["warm_up"], 1.0);
        assert_eq!(v["slate"]["samples"], json!([2.0, 3.0, 4.0]));
        assert_eq!(v["baseline"]["name"], "mksquashfs");
        assert_eq!(v["baseline"]["median"], 1.0);
        assert_eq!(v["ratio"], 3.0);
        assert_eq!(
            v["extra"]["slate_size"],
            json!({"median": 4096.0, "min": 4096.0, "max": 4096.0, "unit": "B"})
        );
        assert_eq!(v["extra"]["one core"]["ratio"], 0.75);
        assert_eq!(v["extra"]["note"]["p50"], 1.5);
    }
}
