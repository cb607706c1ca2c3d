//! `slate fleetlock serve | status | release`: a FleetLock v1 lock server (zincati's protocol,
//! airlock's semantics, `docs/formats.md §8`) and the admin's view of its store. The store is
//! a local directory (`--store DIR`, the default) or an etcd cluster (`--etcd URLS`: airlock's
//! keys, so that several servers on several machines share the semaphores). `serve` speaks
//! plain HTTP, or with `--tls-cert`/`--tls-key` TLS only, mutual with `--client-ca`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand};
use slate_fleetlock::{unlock, Change, GroupName, GroupSpec, Groups, SemaphoreStore, Service};
#[cfg(feature = "etcd")]
use slate_fleetlock_server::EtcdStore;
use slate_fleetlock_server::{Counted, FileStore, LockMetrics, Server, Tls};

use crate::args::OutputFormat;

/// Where the file store lives unless `--store` says otherwise.
const DEFAULT_STORE: &str = "/var/lib/slate/fleetlock";

#[derive(Debug, Subcommand)]
pub enum FleetlockCommand {
    /// Serve FleetLock v1 over HTTP (or HTTPS with --tls-cert): POST /v1/pre-reboot takes a
    /// reboot slot, POST /v1/steady-state gives it back. Holders never expire: a node that
    /// does not come back keeps its slot until it unlocks or an admin runs `slate fleetlock
    /// release`.
    Serve {
        /// Address to listen on (IP:PORT; port 0 picks a free one, printed on start).
        #[arg(long)]
        listen: SocketAddr,
        #[command(flatten)]
        at: StoreArgs,
        /// A group and its slots, repeatable; without any: default=1.
        #[arg(long = "group", value_name = "NAME=SLOTS")]
        groups: Vec<GroupSpec>,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// The groups in a store, their slots and holders.
    Status {
        #[command(flatten)]
        at: StoreArgs,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Free a stuck holder's slot (a node that failed its update and never came back).
    Release {
        #[command(flatten)]
        at: StoreArgs,
        #[arg(long)]
        group: GroupName,
        #[arg(long)]
        id: String,
        #[arg(long)]
        dry_run: bool,
    },
}

/// Where the semaphores are.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Directory of the file store, one JSON record per group (`serve` creates it).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
    store: PathBuf,
    /// Keep the semaphores in etcd instead: its client URLs, comma-separated
    /// (http://HOST:PORT,...). One key per group, airlock's
    /// (com.coreos.airlock/groups/GROUP/v1/semaphore).
    #[arg(
        long,
        value_name = "URLS",
        value_delimiter = ',',
        conflicts_with = "store"
    )]
    etcd: Vec<String>,
}

/// TLS on `serve`'s listener; without these flags it speaks plain HTTP.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// Speak TLS only, with this certificate chain (PEM, the server's own certificate first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, SEC1 or PKCS#1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: a client must present a certificate issued by this CA (PEM), or its
    /// handshake fails.
    #[arg(long, value_name = "FILE", requires = "tls_cert", requires = "tls_key")]
    client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// Reads and checks the files (clap has made sure cert and key come together).
    fn load(&self) -> Result<Option<Tls>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let tls = Tls::from_files(cert, key, self.client_ca.as_deref())
            .context("cannot set up TLS on the listener")?;
        Ok(Some(tls))
    }
}

/// An opened store. The etcd client is large (a few KiB of channels): boxed.
enum Opened {
    File(FileStore),
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdStore>),
}

impl StoreArgs {
    /// "DIR" or "etcd URL,URL".
    fn describe(&self) -> String {
        if self.etcd.is_empty() {
            self.store.display().to_string()
        } else {
            format!("etcd {}", self.etcd.join(","))
        }
    }

    /// `create`: a server creates a missing store directory; the admin commands want an
    /// existing one, so that a mistyped path is an error rather than an empty store.
    fn open(&self, create: bool) -> Result<Opened> {
        if !self.etcd.is_empty() {
            #[cfg(feature = "etcd")]
            return Ok(Opened::Etcd(Box::new(EtcdStore::connect(&self.etcd)?)));
            #[cfg(not(feature = "etcd"))]
            anyhow::bail!(
                "this slate was built without the etcd store (the node's static binary); use \
                 the host build"
            );
        }
        let store = if create {
            FileStore::create(&self.store)?
        } else {
            FileStore::open(&self.store)?
        };
        // A server would fail every lock of that group: it refuses to start instead.
        if let (true, Some(stray)) = (create, store.strays().first()) {
            anyhow::bail!(
                "the group record {} is a directory, not a regular file: move it out of the \
                 store before serving",
                stray.display()
            );
        }
        for stray in store.strays() {
            eprintln!(
                "warning: skipping {}: a directory, not a group record (move it out of the \
                 store)",
                stray.display()
            );
        }
        Ok(Opened::File(store))
    }
}

impl Opened {
    fn store(&self) -> &dyn SemaphoreStore {
        match self {
            Opened::File(s) => s,
            #[cfg(feature = "etcd")]
            Opened::Etcd(s) => s.as_ref(),
        }
    }
}

pub fn run(cmd: FleetlockCommand) -> Result<()> {
    match cmd {
        FleetlockCommand::Serve {
            listen,
            at,
            groups,
            tls,
        } => serve(listen, &at, groups, &tls),
        FleetlockCommand::Status { at, output } => status(&at, output),
        FleetlockCommand::Release {
            at,
            group,
            id,
            dry_run,
        } => release(&at, &group, &id, dry_run),
    }
}

fn serve(listen: SocketAddr, at: &StoreArgs, specs: Vec<GroupSpec>, tls: &TlsArgs) -> Result<()> {
    let groups = Groups::new(specs)?;
    // Before the store: a bad certificate should not leave a new store directory behind.
    let tls = tls.load()?;
    match at.open(true)? {
        Opened::File(store) => serve_with(listen, at, groups, tls, store),
        #[cfg(feature = "etcd")]
        Opened::Etcd(store) => serve_with(listen, at, groups, tls, *store),
    }
}

fn serve_with<S: SemaphoreStore + 'static>(
    listen: SocketAddr,
    at: &StoreArgs,
    groups: Groups,
    tls: Option<Tls>,
    store: S,
) -> Result<()> {
    let shown: Vec<String> = groups.iter().map(|(g, n)| format!("{g}={n}")).collect();
    // The store counts its errors and lost swaps into the server's metrics (`/metrics`).
    let metrics = Arc::new(LockMetrics::new());
    let service = Arc::new(Service::new(groups, Counted::new(store, metrics.clone())));
    for line in service.drift()? {
        eprintln!("fleetlock: warning: {line}");
    }
    let (scheme, security) = match &tls {
        None => ("http", ""),
        Some(tls) if tls.mutual() => ("https", "mutual TLS, "),
        Some(_) => ("https", "TLS, "),
    };
    let mut server = Server::bind(listen)?.with_metrics(metrics);
    if let Some(tls) = tls {
        server = server.with_tls(tls);
    }
    // Tests and scripts read this line for the port when listening on port 0.
    let mut out = std::io::stdout().lock();
    let kind = if at.etcd.is_empty() { "store " } else { "" };
    writeln!(
        out,
        "fleetlock: listening on {scheme}://{} ({security}{kind}{}, groups {})",
        server.local_addr(),
        at.describe(),
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

fn status(at: &StoreArgs, output: OutputFormat) -> Result<()> {
    let opened = at.open(false)?;
    let store = opened.store();
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
            at.describe()
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

fn release(at: &StoreArgs, group: &GroupName, id: &str, dry_run: bool) -> Result<()> {
    let opened = at.open(false)?;
    let store = opened.store();
    let Some((_, sem)) = store.load(group)? else {
        let known: Vec<String> = store.groups()?.iter().map(|g| g.to_string()).collect();
        bail!(
            "group {group} has no semaphore in {} (groups: {})",
            at.describe(),
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
        unlock(store, group, id).with_context(|| format!("releasing {id} from group {group}"))?;
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
