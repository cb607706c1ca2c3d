//! Prometheus metrics for slate's daemons (machined's API, `slate fleetlock serve`, `slate
//! operator run`): what every `/metrics` shares, so that the three answer alike.
//!
//! - The encoding is the `prometheus` crate's classic text exposition (version 0.0.4), the
//!   format `promtool check metrics` reads (ARCHITECTURE.md says why not OpenMetrics).
//! - A daemon keeps its counters and histograms in a long-lived [`Registry`] and computes its
//!   gauges at each scrape into a fresh one ([`Scrape`]): a gauge is then what the daemon knows
//!   at that moment, and a label value that no longer exists (a group, a version) goes away.
//! - [`check_scrape`] refuses what a scrape is not: another method, any query parameter.
//!
//! Names follow Prometheus' conventions: the `slate_` prefix, base units (`_seconds`,
//! `_bytes`), `_total` on counters, `_info` on gauges whose labels are the value. No label
//! takes values from an unbounded set (no node ids on the node's own metrics).

pub mod node_counters;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
pub use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Where every slate daemon serves its metrics.
pub const PATH: &str = "/metrics";

/// The text exposition's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The buckets of request and tick latencies, in seconds: 0.5 ms to 10 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why a request to [`PATH`] is not a scrape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    /// 405, with `Allow: GET`.
    #[error("{PATH} takes GET only, not {0}")]
    Method(String),
    /// 400: a scrape names nothing, so any parameter is a mistake the caller should hear of.
    #[error("{PATH} takes no query parameters; got {0:?}")]
    Query(String),
}

impl ScrapeError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            ScrapeError::Method(_) => 405,
            ScrapeError::Query(_) => 400,
        }
    }
}

/// The longest piece of a client's method or query repeated in an error.
const SHOWN: usize = 64;

fn shown(text: &str) -> String {
    text.chars()
        .take(SHOWN)
        .flat_map(char::escape_default)
        .collect()
}

/// Whether a request to [`PATH`] is a scrape: `GET` without a query string (an empty one,
/// `?`, is taken as none).
pub fn check_scrape(method: &str, query: Option<&str>) -> Result<(), ScrapeError> {
    if method != "GET" {
        return Err(ScrapeError::Method(shown(method)));
    }
    match query {
        Some(q) if !q.is_empty() => Err(ScrapeError::Query(shown(q))),
        _ => Ok(()),
    }
}

/// Registers `collector`, whose name and labels are constants of the caller: a clash is a
/// bug in slate, found by every test that scrapes.
pub fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("slate's metric names are distinct constants");
    collector
}

/// An integer counter registered in `registry`.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        registry,
        IntCounter::with_opts(Opts::new(name, help)).expect("a valid metric name"),
    )
}

/// Integer counters by `labels`, registered in `registry`.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric name"),
    )
}

/// Counters of seconds (or any other non-integer amount) by `labels`, registered in
/// `registry`.
pub fn seconds_counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> CounterVec {
    register(
        registry,
        CounterVec::new(Opts::new(name, help), labels).expect("a valid metric name"),
    )
}

/// A histogram with `buckets`, by `labels`, registered in `registry`.
pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        registry,
        HistogramVec::new(opts, labels).expect("a valid metric name"),
    )
}

/// A histogram with `buckets`, registered in `registry`.
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        registry,
        Histogram::with_opts(opts).expect("a valid metric name"),
    )
}

/// The gauges of one scrape: made, set and encoded in one go.
#[derive(Debug, Default)]
pub struct Scrape {
    registry: Registry,
}

impl Scrape {
    pub fn new() -> Self {
        Self::default()
    }

    /// A gauge without labels, set to `value`.
    pub fn gauge(&self, name: &str, help: &str, value: f64) {
        let gauge = register(
            &self.registry,
            Gauge::with_opts(Opts::new(name, help)).expect("a valid metric name"),
        );
        gauge.set(value);
    }

    /// Gauges by `labels`, to be set by the caller.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        register(
            &self.registry,
            GaugeVec::new(Opts::new(name, help), labels).expect("a valid metric name"),
        )
    }

    /// A counter without labels that the daemon keeps elsewhere (an atomic of its own).
    pub fn counter(&self, name: &str, help: &str, value: u64) {
        let counter = register(
            &self.registry,
            IntCounter::with_opts(Opts::new(name, help)).expect("a valid metric name"),
        );
        counter.inc_by(value);
    }

    /// A counter without labels whose value is not a whole number (CPU seconds).
    pub fn float_counter(&self, name: &str, help: &str, value: f64) {
        let counter = register(
            &self.registry,
            prometheus::Counter::with_opts(Opts::new(name, help)).expect("a valid metric name"),
        );
        counter.inc_by(value.max(0.0));
    }

    /// Counters by `labels` that the daemon keeps elsewhere, to be set by the caller.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        register(
            &self.registry,
            IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric name"),
        )
    }

    /// This scrape's gauges with the long-lived `registries`, as the text exposition.
    pub fn encode(self, registries: &[&Registry]) -> String {
        let mut families = self.registry.gather();
        for r in registries {
            families.extend(r.gather());
        }
        encode(families)
    }
}

/// The text exposition of `families`, sorted by name (a family the text format repeats would
/// be refused by Prometheus). A family without metrics is left out: the encoder refuses one
/// (and would stop there), and Prometheus has nothing to read in it.
pub fn encode(mut families: Vec<MetricFamily>) -> String {
    families.retain(|f| !f.get_metric().is_empty());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    // Writing into a Vec cannot fail, and every family left has metrics.
    let _ = TextEncoder::new().encode(&families, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Prometheus label values are any UTF-8; a value taken from outside (a version, a group) is
/// cut to this many characters so that one strange value cannot bloat every scrape.
pub const MAX_LABEL_VALUE: usize = 128;

/// `value`, cut to [`MAX_LABEL_VALUE`] characters.
pub fn label(value: &str) -> String {
    value.chars().take(MAX_LABEL_VALUE).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_is_a_get_without_a_query() {
        assert_eq!(check_scrape("GET", None), Ok(()));
        assert_eq!(check_scrape("GET", Some("")), Ok(()));
        let e = check_scrape("POST", None).unwrap_err();
        assert_eq!(e.status(), 405);
        assert_eq!(e.to_string(), "/metrics takes GET only, not POST");
        let e = check_scrape("GET", Some("name[]=slate_x")).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("name[]=slate_x"), "{e}");
        let long = "x\n".repeat(10_000);
        let e = check_scrape("GET", Some(&long)).unwrap_err();
        assert!(e.to_string().len() < 300, "the client's text is cut");
        assert!(!e.to_string().contains('\n'), "and escaped");
    }

    #[test]
    fn families_are_encoded_once_each_in_name_order() {
        let kept = Registry::new();
        let requests = counter_vec(&kept, "slate_b_total", "Requests.", &["result"]);
        requests.with_label_values(&["ok"]).inc_by(3);
        let scrape = Scrape::new();
        scrape
            .gauge_vec("slate_a", "A gauge.", &["group"])
            .with_label_values(&["web"])
            .set(2.0);
        scrape.gauge("slate_c", "Another.", 1.5);
        let text = scrape.encode(&[&kept]);
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        assert_eq!(
            names,
            ["slate_a gauge", "slate_b_total counter", "slate_c gauge"]
        );
        assert!(text.contains("slate_a{group=\"web\"} 2\n"), "{text}");
        assert!(text.contains("slate_b_total{result=\"ok\"} 3\n"), "{text}");
    }

    #[test]
    fn a_family_without_metrics_does_not_stop_the_others() {
        let kept = Registry::new();
        counter_vec(&kept, "slate_never_total", "Never counted.", &["why"]);
        counter(&kept, "slate_z_total", "Counted.").inc();
        let mut families = kept.gather();
        families.push(MetricFamily::default());
        let text = encode(families);
        assert!(text.contains("slate_z_total 1\n"), "{text}");
        assert!(!text.contains("slate_never_total"), "{text}");
    }

    #[test]
    fn label_values_from_outside_are_cut() {
        assert_eq!(label("1.2.0"), "1.2.0");
        assert_eq!(label(&"v".repeat(1000)).len(), MAX_LABEL_VALUE);
    }
}
