//! `slate fleetlock serve | status | release`: a FleetLock v1 lock server (zincati's protocol,
//! airlock's semantics, `docs/formats.md §8`) over a local file store, and the admin's view of
//! that store.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use clap::Subcommand;
use slate_fleetlock::{unlock, Change, GroupName, GroupSpec, Groups, SemaphoreStore, Service};
use slate_fleetlock_server::{FileStore, Server};

use crate::args::OutputFormat;

/// Where the file store lives unless `--store` says otherwise.
const DEFAULT_STORE: &str = "/var/lib/slate/fleetlock";

#[derive(Debug, Subcommand)]
pub enum FleetlockCommand {
    /// Serve FleetLock v1 over HTTP: POST /v1/pre-reboot takes a reboot slot, POST
    /// /v1/steady-state gives it back. Holders never expire: a node that does not come back
    /// keeps its slot until it unlocks or an admin runs `slate fleetlock release`.
    Serve {
        /// Address to listen on (IP:PORT; port 0 picks a free one, printed on start).
        #[arg(long)]
        listen: SocketAddr,
        /// Directory of the file store (one JSON record per group), created if missing.
        #[arg(long, default_value = DEFAULT_STORE)]
        store: PathBuf,
        /// A group and its slots, repeatable; without any: default=1.
        #[arg(long = "group", value_name = "NAME=SLOTS")]
        groups: Vec<GroupSpec>,
    },
    /// The groups in a store, their slots and holders.
    Status {
        #[arg(long, default_value = DEFAULT_STORE)]
        store: PathBuf,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Free a stuck holder's slot (a node that failed its update and never came back).
    Release {
        #[arg(long, default_value = DEFAULT_STORE)]
        store: PathBuf,
        #[arg(long)]
        group: GroupName,
        #[arg(long)]
        id: String,
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn run(cmd: FleetlockCommand) -> Result<()> {
    match cmd {
        FleetlockCommand::Serve {
            listen,
            store,
            groups,
        } => serve(listen, &store, groups),
        FleetlockCommand::Status { store, output } => status(&store, output),
        FleetlockCommand::Release {
            store,
            group,
            id,
            dry_run,
        } => release(&store, &group, &id, dry_run),
    }
}

fn open(dir: &Path) -> Result<FileStore> {
    Ok(FileStore::open(dir)?)
}

fn serve(listen: SocketAddr, dir: &Path, specs: Vec<GroupSpec>) -> Result<()> {
    let groups = Groups::new(specs)?;
    let store = FileStore::create(dir)?;
    let shown: Vec<String> = groups.iter().map(|(g, n)| format!("{g}={n}")).collect();
    let service = Arc::new(Service::new(groups, store));
    for line in service.drift()? {
        eprintln!("fleetlock: warning: {line}");
    }
    let server = Server::bind(listen)?;
    // Tests and scripts read this line for the port when listening on port 0.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "fleetlock: listening on http://{} (store {}, groups {})",
        server.local_addr(),
        dir.display(),
        shown.join(" ")
    )?;
    out.flush()?;
    drop(out);
    server.run(service, Arc::new(|line: &str| eprintln!("{line}")))?;
    Ok(())
}

#[derive(serde::Serialize)]
struct StatusView {
    groups: Vec<GroupView>,
}

#[derive(serde::Serialize)]
struct GroupView {
    group: String,
    total_slots: u64,
    holders: Vec<String>,
    version: u64,
}

fn status(dir: &Path, output: OutputFormat) -> Result<()> {
    let store = open(dir)?;
    let mut views = StatusView { groups: Vec::new() };
    for group in store.groups()? {
        // A record removed between listing and reading is simply gone.
        if let Some((version, sem)) = store.load(&group)? {
            views.groups.push(GroupView {
                group: group.to_string(),
                total_slots: sem.total_slots(),
                holders: sem.holders().to_vec(),
                version: version.0,
            });
        }
    }
    let mut out = std::io::stdout().lock();
    match output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &views)?;
            writeln!(out)?;
        }
        OutputFormat::Text if views.groups.is_empty() => writeln!(
            out,
            "no groups in {} yet (a group is stored at its first lock)",
            dir.display()
        )?,
        OutputFormat::Text => {
            let width = views
                .groups
                .iter()
                .map(|v| v.group.len())
                .max()
                .unwrap_or(0)
                .max(5);
            writeln!(out, "{:width$}  {:>7}  HOLDERS", "GROUP", "HELD")?;
            for v in &views.groups {
                let held = format!("{}/{}", v.holders.len(), v.total_slots);
                let holders = if v.holders.is_empty() {
                    "-".to_owned()
                } else {
                    v.holders.join(" ")
                };
                writeln!(out, "{:width$}  {held:>7}  {holders}", v.group)?;
            }
        }
    }
    Ok(())
}

fn release(dir: &Path, group: &GroupName, id: &str, dry_run: bool) -> Result<()> {
    let store = open(dir)?;
    let Some((_, sem)) = store.load(group)? else {
        let known: Vec<String> = store.groups()?.iter().map(|g| g.to_string()).collect();
        bail!(
            "group {group} has no semaphore in {} (groups: {})",
            dir.display(),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        );
    };
    // An admin's typo should not pass for success: naming a non-holder is an error here,
    // unlike the protocol's unlock.
    if !sem.holds(id) {
        bail!(
            "{id:?} holds no slot in group {group} (holders: {})",
            if sem.holders().is_empty() {
                "none".to_owned()
            } else {
                sem.holders().join(", ")
            }
        );
    }
    if dry_run {
        println!(
            "would release {id} from group {group} ({}/{} slots held)",
            sem.holders().len(),
            sem.total_slots()
        );
        return Ok(());
    }
    let applied =
        unlock(&store, group, id).with_context(|| format!("releasing {id} from group {group}"))?;
    let (held, total) = applied
        .semaphore
        .as_ref()
        .map_or((0, 0), |s| (s.holders().len(), s.total_slots()));
    match applied.change {
        Change::Unlocked => {
            println!("released {id} from group {group} ({held}/{total} slots held)")
        }
        // It unlocked itself between our read and our swap.
        _ => println!("{id} no longer holds a slot in group {group}; nothing changed"),
    }
    Ok(())
}
