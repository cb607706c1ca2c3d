//! `slate operator run` (a replica of the rollout operator) and `slate fleet …` (its API:
//! status, plan, pause/resume/abort, policies, adding a node by hand). Both need the `etcd`
//! feature: the node's static binary is neither.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand};
use serde_json::Value;
use slate_api::{Client, Role};
use slate_operator::{
    ControlRequest, EtcdState, FleetStatus, LeaderConfig, Operator, PolicyText, RegistryReleases,
};
use slate_rollout::{NodeReport, PlanRow, PolicySet};
use slate_transport::{Options, Reference};

use crate::args::{read_text, NodeTarget, OutputFormat, MAX_SMALL_FILE_BYTES};

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Run one replica: serve the operator API, and lead the rollouts when elected (run two
    /// or three on different machines; all state is in etcd).
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// etcd client URLs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// Where the operator API listens.
    #[arg(long)]
    listen: SocketAddr,
    /// A `slate gen certs` directory: client-ca.crt (admins, operators, readers), ca.crt (the
    /// fleet CA: nodes' heartbeats and API), the operator's serving service.crt/service.key
    /// and operator.crt/.key (nodes are called with it).
    #[arg(long)]
    certs: PathBuf,
    /// The release repository, REGISTRY/REPO (its `releases` index names the versions).
    #[arg(long)]
    image: String,
    /// The same repository as the nodes reach it, when that differs (another address or
    /// name); nodes are told `NODE_IMAGE:VERSION@DIGEST`.
    #[arg(long)]
    node_image: Option<String>,
    /// Talk to the registry over plain HTTP.
    #[arg(long)]
    insecure_registry: bool,
    /// This replica's name (shown as the leader); the listen address by default.
    #[arg(long)]
    name: Option<String>,
    /// The etcd key prefix of the operator's state.
    #[arg(long, default_value = "/slate/operator/")]
    prefix: String,
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    tick: Duration,
    /// A node silent this long is not upgraded and fails its soak.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    stale_after: Duration,
    /// The leadership lease: a dead leader is replaced within about this long.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    lease: Duration,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    release_refresh: Duration,
    /// The leader deletes events older than this from etcd (checked once a minute).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    event_retention: Duration,
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Every node: version, target, step, wave, last error; the rollouts and recent events.
    Status {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// The dry run: which node in which wave, and not before when.
    Plan {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Stop starting nodes (those upgrading finish).
    Pause(ControlArgs),
    /// Go on after a pause (the failures so far are accepted; a yanked target moves on).
    Resume(ControlArgs),
    /// End the rollout for good.
    Abort(ControlArgs),
    /// The rollout policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// The rollout log, oldest first: starts, commits, failures, pauses, resumes, waves (kept
    /// for `operator run --event-retention`).
    Events {
        /// The last N events.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        limit: u32,
        /// Only this group's.
        #[arg(long)]
        group: Option<String>,
        /// Only this node's.
        #[arg(long)]
        node_id: Option<String>,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Add a node to the inventory by hand (nodes with update strategy `operator` register
    /// themselves).
    AddNode(AddNodeArgs),
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// One group (every group with an active rollout by default).
    #[arg(long)]
    group: Option<String>,
    #[arg(long)]
    reason: Option<String>,
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check a policy file and store it (all of it replaces the policies in force).
    Set {
        file: PathBuf,
        #[arg(long)]
        dry_run: bool,
    },
    Show,
}

#[derive(Debug, Args)]
pub struct AddNodeArgs {
    #[arg(long)]
    id: String,
    #[arg(long)]
    group: String,
    /// The node API, HOST:PORT.
    #[arg(long)]
    endpoint: String,
    /// Its running version.
    #[arg(long)]
    version: String,
    #[arg(long, default_value = "stable")]
    channel: String,
    /// KEY=VALUE, repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    #[arg(long)]
    dry_run: bool,
}

fn parse_label(text: &str) -> std::result::Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

pub fn run_operator(cmd: OperatorCommand) -> Result<()> {
    let OperatorCommand::Run(args) = cmd;
    let state = EtcdState::connect(&args.etcd, &args.prefix)
        .with_context(|| format!("connecting to etcd at {}", args.etcd.join(",")))?;
    let repository =
        Reference::parse(&args.image).with_context(|| format!("--image {:?}", args.image))?;
    let options = Options {
        insecure: args.insecure_registry,
        ..Options::default()
    };
    let name = args.name.unwrap_or_else(|| args.listen.to_string());
    let log: slate_operator::Log = Arc::new(move |line: &str| eprintln!("operator: {line}"));
    let op = Operator {
        state: Arc::new(state),
        leader: LeaderConfig {
            name,
            repository: args
                .node_image
                .clone()
                .unwrap_or_else(|| args.image.clone()),
            tick: args.tick,
            stale_after: args.stale_after,
            lease_ttl: args.lease,
            release_refresh: args.release_refresh,
            parallel_orders: 16,
            event_retention: args.event_retention,
        },
        listen: args.listen,
        certs: args.certs,
        releases: Arc::new(RegistryReleases {
            repository,
            options,
        }),
        log,
        observer: None,
    };
    static STOP: AtomicBool = AtomicBool::new(false);
    slate_operator::run(op, &STOP).map_err(anyhow::Error::msg)
}

fn operator_client(target: &NodeTarget, role: Role) -> Result<Client> {
    let addr = std::env::var("SLATE_OPERATOR")
        .ok()
        .or_else(|| target.node.clone())
        .context("no operator given: pass --node HOST:PORT or set SLATE_OPERATOR")?;
    Client::from_dir(&addr, &target.certs, role)
        .with_context(|| format!("setting up the client for the operator at {addr}"))
}

pub fn run_fleet(target: &NodeTarget, cmd: FleetCommand) -> Result<()> {
    let role = target.role.into();
    let client = || operator_client(target, role);
    match cmd {
        FleetCommand::Status { output } => {
            let status: FleetStatus = client()?.call("GET", "/v1/fleet/status", None::<&()>)?;
            match output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&status)?),
                OutputFormat::Text => print_status(&status),
            }
        }
        FleetCommand::Plan { output } => {
            let rows: Vec<PlanRow> = client()?.call("GET", "/v1/fleet/plan", None::<&()>)?;
            match output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                OutputFormat::Text => print_plan(&rows),
            }
        }
        FleetCommand::Events {
            limit,
            group,
            node_id,
            output,
        } => {
            let mut events: Vec<slate_rollout::Event> = client()?.call(
                "GET",
                &format!("/v1/fleet/events?limit={limit}"),
                None::<&()>,
            )?;
            // Among the last N: the operator keeps the log in time order, not by group.
            events.retain(|e| {
                group.as_ref().is_none_or(|g| &e.group == g)
                    && node_id.as_ref().is_none_or(|n| e.node.as_ref() == Some(n))
            });
            match output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&events)?),
                OutputFormat::Text => {
                    for e in &events {
                        let at = humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + Duration::from_secs(e.at),
                        );
                        println!("{at} {}", slate_operator::leader::describe(e));
                    }
                }
            }
        }
        FleetCommand::Pause(a) => control(client, "pause", a)?,
        FleetCommand::Resume(a) => control(client, "resume", a)?,
        FleetCommand::Abort(a) => control(client, "abort", a)?,
        FleetCommand::Policy(PolicyCommand::Show) => {
            let p: PolicyText = client()?.call("GET", "/v1/fleet/policy", None::<&()>)?;
            print!("{}", p.text);
        }
        FleetCommand::Policy(PolicyCommand::Set { file, dry_run }) => {
            let text = read_text(&file, MAX_SMALL_FILE_BYTES, "the policy file")?;
            let set = PolicySet::parse(&text).with_context(|| format!("{}", file.display()))?;
            if dry_run {
                println!(
                    "{}: {} policies, valid (dry run: not stored)",
                    file.display(),
                    set.policies.len()
                );
                return Ok(());
            }
            let _: Value =
                client()?.call("POST", "/v1/fleet/policy", Some(&PolicyText { text }))?;
            println!("{} policies stored", set.policies.len());
        }
        FleetCommand::AddNode(a) => {
            let report = NodeReport {
                id: a.id,
                group: a.group,
                labels: a.labels.into_iter().collect(),
                endpoint: a.endpoint,
                version: a.version,
                channel: a.channel,
                committed: true,
                healthy: true,
                busy: false,
                last_failure: None,
                sent_at_ms: slate_operator::leader::now_ms(),
            };
            slate_operator::service::check_report(&report).map_err(anyhow::Error::msg)?;
            if a.dry_run {
                println!("{} is valid (dry run: not added)", report.id);
                return Ok(());
            }
            let _: Value = client()?.call("POST", "/v1/fleet/nodes", Some(&report))?;
            println!("{} added to group {}", report.id, report.group);
        }
    }
    Ok(())
}

fn control(client: impl Fn() -> Result<Client>, action: &str, a: ControlArgs) -> Result<()> {
    if a.dry_run {
        println!(
            "would {action} {} (dry run)",
            a.group.as_deref().unwrap_or("every active rollout")
        );
        return Ok(());
    }
    let req = ControlRequest {
        group: a.group,
        reason: a.reason,
    };
    let answer: Value = client()?.call("POST", &format!("/v1/fleet/{action}"), Some(&req))?;
    let groups = answer["groups"].as_array().map(Vec::len).unwrap_or(0);
    if groups == 0 {
        bail!("no active rollout to {action}");
    }
    println!("{action}: {}", answer["groups"]);
    Ok(())
}

fn print_status(s: &FleetStatus) {
    println!("leader: {}", s.leader.as_deref().unwrap_or("none"));
    for r in &s.rollouts {
        let why = match &r.state {
            slate_rollout::RolloutState::Paused { reason, .. }
            | slate_rollout::RolloutState::Aborted { reason, .. } => format!(" ({reason})"),
            _ => String::new(),
        };
        println!(
            "rollout {}#{} → {}: {}{why}",
            r.group,
            r.id,
            r.target,
            r.state.name()
        );
    }
    println!(
        "{:<24} {:<12} {:<10} {:<10} {:<10} {:<5} LAST ERROR",
        "NODE", "GROUP", "VERSION", "TARGET", "STATE", "WAVE"
    );
    for n in &s.nodes {
        println!(
            "{:<24} {:<12} {:<10} {:<10} {:<10} {:<5} {}",
            n.node,
            n.group,
            n.version,
            n.target.as_deref().unwrap_or("-"),
            n.state,
            n.wave.map_or("-".into(), |w| w.to_string()),
            n.last_error.as_deref().unwrap_or("")
        );
    }
    for e in &s.events {
        println!("event {}", slate_operator::leader::describe(e));
    }
}

fn print_plan(rows: &[PlanRow]) {
    println!(
        "{:<24} {:<12} {:<10} {:<5} {:<12} {:<20} REASON",
        "NODE", "GROUP", "TARGET", "WAVE", "STATE", "NOT BEFORE"
    );
    for r in rows {
        let not_before = r.not_before.map_or("-".into(), |t| {
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t))
                .to_string()
        });
        println!(
            "{:<24} {:<12} {:<10} {:<5} {:<12} {:<20} {}",
            r.node,
            r.group,
            r.target.as_deref().unwrap_or("-"),
            r.wave.map_or("-".into(), |w| w.to_string()),
            r.state,
            not_before,
            r.reason.as_deref().unwrap_or("")
        );
    }
}
