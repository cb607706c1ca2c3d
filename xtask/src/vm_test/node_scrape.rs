//! A real Prometheus scraping the node in a VM (issue 42): Debian's `prometheus`, started here
//! on loopback, scrapes the node API's `/metrics` through QEMU's port forward with the demo CA
//! and a reader certificate, every second. The upgrade story asks it through its HTTP API what
//! the node counted — the answer must come from Prometheus' own samples, so the test waits
//! for a sample rather than sleeping.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use slate_testkit::prometheus::{https_get, promtool_check, Prometheus};

use super::Node;

/// How long a value may take to appear: a boot's stage Running to the node's first answer is
/// quick, but Prometheus marks the target up only at its next scrape after the reboot.
const WITHIN: Duration = Duration::from_secs(90);

pub(super) struct NodeScrape {
    prom: Prometheus,
    port: u16,
    pki: std::path::PathBuf,
}

impl NodeScrape {
    /// Prometheus scraping `node` every second, as the reader role, naming the node as its
    /// certificate does (the address is a loopback port forward).
    pub(super) fn start(node: &Node, work: &Path) -> Result<Self> {
        let pki = node.prepared.pki.clone();
        let scrape_configs = format!(
            "  - job_name: node\n    scheme: https\n    tls_config:\n      ca_file: {}\n      \
             cert_file: {}\n      key_file: {}\n      server_name: {}\n    static_configs:\n      \
             - targets: ['127.0.0.1:{}']\n",
            pki.join("ca.crt").display(),
            pki.join("reader.crt").display(),
            pki.join("reader.key").display(),
            node.name,
            node.port,
        );
        let dir = tempfile::tempdir_in(work)?;
        let prom = Prometheus::start(dir, Duration::from_secs(1), &scrape_configs)
            .map_err(|e| anyhow!("starting prometheus: {e}"))?;
        Ok(NodeScrape {
            prom,
            port: node.port,
            pki,
        })
    }

    /// The node's `/metrics` as the reader gets it, checked by `promtool check metrics`:
    /// the number of metric families in it.
    pub(super) fn promtool(&self) -> Result<usize> {
        let (status, text) = https_get(
            &format!("127.0.0.1:{}", self.port),
            &self.pki.join("ca.crt"),
            &self.pki.join("reader.crt"),
            &self.pki.join("reader.key"),
            "/metrics",
        )
        .map_err(|e| anyhow!("GET /metrics: {e}"))?;
        ensure!(status == 200, "GET /metrics answered {status}: {text}");
        promtool_check(&text).map_err(|e| anyhow!("{e}\n{text}"))?;
        Ok(text.lines().filter(|l| l.starts_with("# TYPE ")).count())
    }

    /// Waits until `promql` gives exactly one sample equal to `value`: `query = value`.
    pub(super) fn expect(&self, promql: &str, value: f64) -> Result<String> {
        let samples = self
            .prom
            .wait_for(promql, WITHIN, |s| s.len() == 1 && s[0].1 == value)
            .map_err(|e| anyhow!("{e}\nprometheus log: {}", self.log_tail()))
            .with_context(|| format!("Prometheus asked `{promql}` for {value}"))?;
        let answer = format!("`{promql}` = {}", samples[0].1);
        // As it comes: the story is long, and a later failure should not hide what passed.
        println!("upgrade_commit_and_revert: Prometheus: {answer}");
        Ok(answer)
    }

    /// One sample's value of `promql` now (e.g. a counter before an event).
    pub(super) fn value(&self, promql: &str) -> Result<f64> {
        let samples = self
            .prom
            .wait_for(promql, WITHIN, |s| s.len() == 1)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(samples[0].1)
    }

    fn log_tail(&self) -> String {
        let log = self.prom.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}
