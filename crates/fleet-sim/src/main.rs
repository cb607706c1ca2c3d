//! `slate-fleet-sim`: thousands of simulated nodes, each serving the real node API on its own
//! `127.0.0.1` port, heartbeating to the rollout operator. Prints a status line per second.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use slate_api::{Client, ClientError};
use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, GroupSpec, Identities, Reporter};
use slate_rollout::NodeReport;

/// Simulated slate nodes for testing and benchmarking the rollout operator.
#[derive(Debug, Parser)]
#[command(name = "slate-fleet-sim")]
struct Args {
    /// A `slate gen certs` directory: each node serves a certificate naming it, issued from
    /// the fleet CA (ca.crt, ca.key), and reports with a client certificate naming it.
    #[arg(long, value_name = "DIR")]
    certs: PathBuf,
    /// A group of nodes: NAME:COUNT, optionally with labels NAME:COUNT:zone=a,role=etcd.
    /// Node ids are NAME-00000, NAME-00001, …
    #[arg(long = "group", value_name = "NAME:COUNT[:K=V,...]", required = true)]
    groups: Vec<String>,
    /// The version every node starts on.
    #[arg(long, value_name = "V")]
    version: String,
    /// The release channel the nodes follow.
    #[arg(long, default_value = "stable")]
    channel: String,
    /// The operator's API (repeatable: heartbeats go round-robin and fail over). Without it,
    /// heartbeats are dropped (counted as sent).
    #[arg(long = "operator", value_name = "HOST:PORT")]
    operators: Vec<String>,
    /// Interval of each node's periodic heartbeat (spread evenly over the fleet).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
    /// From an accepted upgrade to the node's reboot.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    upgrade_time: Duration,
    /// How long a rebooting node's API refuses connections.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    reboot_time: Duration,
    /// Random extra time, up to this, added to each upgrade and reboot.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    jitter: Duration,
    /// A version whose upgrades always revert (repeatable).
    #[arg(long = "fail-version", value_name = "V")]
    fail_versions: Vec<String>,
    /// The chance that an upgrade to any other version reverts.
    #[arg(long, default_value_t = 0.0)]
    fail_probability: f64,
    /// Seeds every node's random draws (with its id): same seed, same run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the ground-truth event log here as JSON lines.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// Threads sending heartbeats.
    #[arg(long, default_value_t = 8)]
    reporter_threads: usize,
    /// Stop after this long (default: run until killed; the events file is flushed per line).
    #[arg(long, value_parser = humantime::parse_duration)]
    run_for: Option<Duration>,
}

fn parse_group(arg: &str, version: &str, channel: &str) -> anyhow::Result<GroupSpec> {
    let mut parts = arg.splitn(3, ':');
    let name = parts.next().unwrap_or_default();
    let count = parts
        .next()
        .with_context(|| format!("--group {arg}: expected NAME:COUNT"))?;
    let count: usize = count
        .parse()
        .with_context(|| format!("--group {arg}: bad count {count:?}"))?;
    let mut labels = BTreeMap::new();
    for pair in parts
        .next()
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let Some((k, v)) = pair.split_once('=') else {
            bail!("--group {arg}: label {pair:?} is not KEY=VALUE");
        };
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(GroupSpec {
        name: name.to_owned(),
        count,
        labels,
        channel: channel.to_owned(),
        version: version.to_owned(),
    })
}

/// Posts heartbeats to the operator replicas with the `operator` role certificate, keeping
/// idle clients for reuse (building one parses the certificates and starts a small runtime).
struct OperatorReporter {
    operators: Vec<String>,
    /// Each node reports with a certificate naming it (the operator takes nothing else).
    identities: Identities,
    next: AtomicUsize,
}

impl OperatorReporter {
    fn new(operators: Vec<String>, certs: &std::path::Path) -> anyhow::Result<Self> {
        Ok(OperatorReporter {
            operators,
            identities: Identities::from_dir(certs).context("the node identities")?,
            next: AtomicUsize::new(0),
        })
    }

    fn post(&self, i: usize, report: &NodeReport) -> Result<(), String> {
        let client = self
            .identities
            .heartbeat_client(&report.id, &self.operators[i])?;
        post_heartbeat(&client, report).map_err(|e| e.to_string())
    }
}

fn post_heartbeat(client: &Client, report: &NodeReport) -> Result<(), ClientError> {
    client
        .call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(report))
        .map(drop)
}

impl Reporter for OperatorReporter {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        let n = self.operators.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut errors = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            match self.post(i, report) {
                Ok(()) => return Ok(()),
                Err(e) => errors.push(format!("{}: {e}", self.operators[i])),
            }
        }
        Err(errors.join("; "))
    }
}

struct Discard;

impl Reporter for Discard {
    fn report(&self, _: &NodeReport) -> Result<(), String> {
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let groups = args
        .groups
        .iter()
        .map(|g| parse_group(g, &args.version, &args.channel))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let spec = FleetSpec {
        groups,
        heartbeat_interval: args.heartbeat,
        behaviour: Behaviour {
            fail_versions: args.fail_versions.iter().cloned().collect(),
            fail_probability: args.fail_probability,
            upgrade_time: args.upgrade_time,
            reboot_time: args.reboot_time,
            jitter: args.jitter,
        },
        seed: args.seed,
        events_file: args.events.clone(),
        reporter_threads: args.reporter_threads,
        ..FleetSpec::new(&args.certs)
    };
    let reporter: Arc<dyn Reporter> = if args.operators.is_empty() {
        eprintln!("slate-fleet-sim: no --operator: heartbeats are dropped");
        Arc::new(Discard)
    } else {
        Arc::new(OperatorReporter::new(args.operators.clone(), &args.certs)?)
    };
    let mut fleet = Fleet::start(spec, reporter).context("starting the fleet")?;
    println!(
        "slate-fleet-sim: {} nodes listening (started in {:.1?}); first: {} at {}",
        fleet.len(),
        fleet.start_time(),
        fleet.node_ids().first().map(String::as_str).unwrap_or("-"),
        fleet
            .node_ids()
            .first()
            .and_then(|id| fleet.node_endpoint(id))
            .unwrap_or_default(),
    );
    let begun = Instant::now();
    let mut reported_errors = 0;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let (in_flight, events) = fleet.totals();
        let stats = fleet.report_stats();
        let versions = fleet
            .versions()
            .iter()
            .map(|(v, n)| format!("{v}={n}"))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "[{:>5}s] {versions} | in flight {in_flight} | events {events} | reports sent {} failed {}",
            begun.elapsed().as_secs(),
            stats.sent,
            stats.failed,
        );
        let errors = fleet.api_errors();
        for e in &errors[reported_errors.min(errors.len())..] {
            eprintln!("slate-fleet-sim: {e}");
        }
        reported_errors = errors.len();
        if args.run_for.is_some_and(|d| begun.elapsed() >= d) {
            break;
        }
    }
    fleet.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed_and_groups_parse() {
        Args::command().debug_assert();
        let g = parse_group("edge:300:zone=a,tier=web", "1.0.0", "beta").unwrap();
        assert_eq!((g.name.as_str(), g.count), ("edge", 300));
        assert_eq!(g.labels.get("tier").map(String::as_str), Some("web"));
        assert_eq!(g.channel, "beta");
        assert!(parse_group("core:50", "1", "s").unwrap().labels.is_empty());
        assert!(parse_group("core", "1", "s").is_err());
        assert!(parse_group("core:x", "1", "s").is_err());
        assert!(parse_group("core:1:zone", "1", "s").is_err());
    }
}
