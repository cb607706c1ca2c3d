//! FleetLock over etcd benchmark (not a test): a three-member etcd cluster on loopback
//! (`slate_testkit::etcd`), a FleetLock server in this process over an `EtcdStore`, and
//! lock + unlock round trips over HTTP with distinct ids; sequential (1,000 and 10,000 ids),
//! with 16 concurrent clients, and with 16 concurrent clients spread over 3 servers (each with
//! its own store, as separate processes would have) whose swaps race each other. The baseline,
//! measured in the same run against the same cluster: one raw etcd compare-and-swap
//! transaction on one key (`If(ModRevision = last) Then(Put)`, etcd-client), the least a swap
//! can cost. A FleetLock lock or unlock is that transaction and an HTTP exchange, plus a
//! linearizable read when the server does not know the value already (its first request on
//! the group, or after another writer).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use slate_fleetlock::{GroupSpec, Groups, Service};
use slate_fleetlock_server::{EtcdStore, Server};
use slate_testkit::etcd::EtcdCluster;

use crate::bench::{ms, percentile, print_ratios, Bench, Comparison, Sample, Side};

/// Concurrent clients in the concurrent variants.
const CLIENTS: usize = 16;
/// Servers sharing the cluster in the variant where their swaps race each other.
const SERVERS: usize = 3;
/// Concurrent clients (and slots: none waits for a slot, only for the swaps) in the variant
/// measured against `etcdctl txn`.
const MANY: usize = 100;

/// Latencies of one series, the wall time it took, and how many requests were refused.
struct Series {
    latencies: Vec<Duration>,
    wall: Duration,
    refused: usize,
}

impl Series {
    fn new(mut latencies: Vec<Duration>, wall: Duration, refused: usize) -> Series {
        latencies.sort();
        Series {
            latencies,
            wall,
            refused,
        }
    }

    /// The series' wall time as the run's figure; its latency percentiles, throughput and
    /// (for FleetLock) lost swaps as further figures.
    fn sample(&self, with_refusals: bool) -> Sample {
        let at = |p| percentile(&self.latencies, p).map_or(f64::NAN, ms);
        let wall = self.wall.as_secs_f64();
        let sample = Sample::new(wall)
            .with("p50", "ms", at(50))
            .with("p99", "ms", at(99))
            .with("throughput", "/s", self.latencies.len() as f64 / wall);
        if with_refusals {
            sample.with("refused", "", self.refused as f64)
        } else {
            sample
        }
    }
}

/// A FleetLock client on one keep-alive connection.
struct HttpClient {
    addr: SocketAddr,
    conn: BufReader<TcpStream>,
}

impl HttpClient {
    fn connect(addr: SocketAddr) -> Result<HttpClient> {
        let tcp = TcpStream::connect(addr)?;
        tcp.set_nodelay(true)?;
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(HttpClient {
            addr,
            conn: BufReader::new(tcp),
        })
    }

    /// POSTs `path` for `id` in `group`; the status.
    fn post(&mut self, path: &str, id: &str, group: &str) -> Result<u16> {
        let body = format!(r#"{{"client_params":{{"id":"{id}","group":"{group}"}}}}"#);
        write!(
            self.conn.get_mut(),
            "POST {path} HTTP/1.1\r\nhost: {}\r\nfleet-lock-protocol: true\r\n\
             content-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )?;
        let mut line = String::new();
        self.conn.read_line(&mut line)?;
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status line: {line:?}"))?;
        let mut len = 0;
        loop {
            line.clear();
            self.conn.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    len = value.trim().parse()?;
                }
            }
        }
        let mut body = vec![0; len];
        self.conn.read_exact(&mut body)?;
        Ok(status)
    }

    /// Lock, then unlock, each retried after 1 ms while refused (under concurrency a swap
    /// can lose 8 times in a row: "conflict"); the round trip's time and the refusals.
    fn round_trip(&mut self, id: &str, group: &str) -> Result<(Duration, usize)> {
        let start = Instant::now();
        let mut refused = 0;
        for (path, what) in [("/v1/pre-reboot", "lock"), ("/v1/steady-state", "unlock")] {
            let mut tries = 0;
            while self.post(path, id, group)? != 200 {
                tries += 1;
                ensure!(tries < 1000, "{what} of {id} refused 1000 times");
                std::thread::sleep(Duration::from_millis(1));
            }
            refused += tries;
        }
        Ok((start.elapsed(), refused))
    }
}

/// `count` lock + unlock round trips in `group` spread over `clients` threads, ids
/// `prefix-N`, client `c` speaking to `addrs[c % len]`.
fn fleetlock_series(
    addrs: &[SocketAddr],
    prefix: &str,
    count: usize,
    clients: usize,
    group: &'static str,
) -> Result<Series> {
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let prefix = prefix.to_owned();
            let addr = addrs[c % addrs.len()];
            std::thread::spawn(move || -> Result<Vec<(Duration, usize)>> {
                let mut client = HttpClient::connect(addr)?;
                (c..count)
                    .step_by(clients)
                    .map(|i| client.round_trip(&format!("{prefix}-{i:05}"), group))
                    .collect()
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(count);
    let mut refused = 0;
    for t in threads {
        match t.join() {
            Ok(series) => {
                for (latency, r) in series? {
                    latencies.push(latency);
                    refused += r;
                }
            }
            Err(_) => bail!("a client thread panicked"),
        }
    }
    Ok(Series::new(latencies, start.elapsed(), refused))
}

/// `count` raw compare-and-swap transactions, `tasks` at a time, each task on its own key
/// (so that none loses a compare: the series measures round trips, not conflicts).
fn raw_series(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    count: usize,
    tasks: usize,
) -> Result<Series> {
    rt.block_on(async {
        let start = Instant::now();
        let mut handles = Vec::new();
        for t in 0..tasks {
            let mut client = client.clone();
            let n = (t..count).step_by(tasks).count();
            handles.push(tokio::spawn(async move {
                let key = format!("bench/raw/{t}");
                let put = client.put(key.as_str(), "0", None).await?;
                let mut revision = put.header().map_or(0, |h| h.revision());
                let mut latencies = Vec::with_capacity(n);
                for i in 0..n {
                    let txn = Txn::new()
                        .when([Compare::mod_revision(
                            key.as_str(),
                            CompareOp::Equal,
                            revision,
                        )])
                        .and_then([TxnOp::put(key.as_str(), i.to_string(), None)]);
                    let start = Instant::now();
                    let resp = client.txn(txn).await?;
                    latencies.push(start.elapsed());
                    if !resp.succeeded() {
                        bail!("the raw swap on {key} lost: the baseline is not a clean series");
                    }
                    revision = resp.header().map_or(revision, |h| h.revision());
                }
                Ok::<_, anyhow::Error>(latencies)
            }));
        }
        let mut latencies = Vec::with_capacity(count);
        for h in handles {
            latencies.extend(h.await??);
        }
        Ok(Series::new(latencies, start.elapsed(), 0))
    })
}

/// `quick`: 1,000 ids only.
pub fn bench_fleetlock(quick: bool) -> Result<Vec<Comparison>> {
    ensure!(
        slate_testkit::find_tool("etcd").is_some() && slate_testkit::find_tool("etcdctl").is_some(),
        "etcd and etcdctl are missing: Debian's etcd-server and etcd-client"
    );
    let cluster = EtcdCluster::start(3)?;
    let endpoints = cluster.endpoints();
    let slots = CLIENTS as u64;
    let groups = Groups::new([
        format!("bench={slots}").parse::<GroupSpec>()?,
        format!("wide={MANY}").parse::<GroupSpec>()?,
    ])?;
    // Each server has its own store (its own etcd client and turns), as separate processes
    // would; the first serves the one-server series.
    let servers = (0..SERVERS)
        .map(|_| {
            let service = Arc::new(Service::new(
                groups.clone(),
                EtcdStore::connect(&endpoints)?,
            ));
            let server =
                Server::bind("127.0.0.1:0".parse()?)?.spawn(service, Arc::new(|_: &str| {}))?;
            Ok(server)
        })
        .collect::<Result<Vec<_>>>()?;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.local_addr()).collect();
    let one = &addrs[..1];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let raw = rt.block_on(Client::connect(&endpoints, None))?;

    let sizes: &[usize] = if quick { &[1_000] } else { &[1_000, 10_000] };
    println!(
        "FleetLock lock + unlock round trips over HTTP, etcd store, 3-member etcd {} on \
         loopback (data on {}); the baseline: raw etcd compare-and-swap Txns on one key per \
         client, the same count, against the same cluster",
        etcd_version(),
        cluster.dir().display()
    );
    // First: the issue's figure (100 clients against `etcdctl txn`).
    let mut comparisons = vec![many_clients(one, &endpoints, quick)?];
    for &n in sizes {
        let variants = [
            ("sequential", "seq", 1, one),
            ("16 clients", "par", CLIENTS, one),
            ("16 clients, 3 servers", "srv", CLIENTS, &addrs[..]),
        ];
        for (label, tag, clients, servers) in variants {
            let slate = Side::new("FleetLock lock+unlock", |run| {
                fleetlock_series(servers, &format!("{tag}{n}r{run}"), n, clients, "bench")
                    .map(|s| s.sample(true))
            });
            let baseline = Side::new("raw etcd Txn", |_| {
                raw_series(&rt, &raw, n, clients).map(|s| s.sample(false))
            });
            let c = Bench::new(&format!("fleetlock {n} ids, {label}"), "s")
                .about(format!(
                    "{n} distinct ids, {clients} client(s) through {} server(s), {slots} slots; \
                     figure: the series' wall time",
                    servers.len()
                ))
                .run(slate, baseline, vec![])?;
            c.print();
            comparisons.push(c);
        }
    }
    for server in servers {
        server.shutdown()?;
    }
    print_ratios(&comparisons);
    Ok(comparisons)
}

/// Lock + unlock by `etcdctl txn` directly: per round trip two compare-and-swap transactions
/// (`value(k) = "free"` → `held`, then back), each client on a key of its own so that no swap
/// loses; each transaction is one `etcdctl` process, as a script would run it.
fn etcdctl_series(endpoints: &[String], count: usize, clients: usize) -> Result<Series> {
    let endpoints = endpoints.join(",");
    let txn = |key: &str, from: &str, to: &str| -> Result<()> {
        let mut child = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoints, "txn"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("etcdctl")?;
        write!(
            child.stdin.take().context("etcdctl's stdin")?,
            "value(\"{key}\") = \"{from}\"\n\nput {key} \"{to}\"\n\n\n"
        )?;
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && text.starts_with("SUCCESS"),
            "etcdctl txn on {key} ({from} -> {to}): {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    let start = Instant::now();
    let latencies = std::thread::scope(|scope| -> Result<Vec<Duration>> {
        let threads: Vec<_> = (0..clients)
            .map(|c| {
                let txn = &txn;
                scope.spawn(move || -> Result<Vec<Duration>> {
                    let key = format!("bench/ctl/{c}");
                    (c..count)
                        .step_by(clients)
                        .map(|_| {
                            let start = Instant::now();
                            txn(&key, "free", "held")?;
                            txn(&key, "held", "free")?;
                            Ok(start.elapsed())
                        })
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(count);
        for t in threads {
            all.extend(
                t.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))??,
            );
        }
        Ok(all)
    })?;
    Ok(Series::new(latencies, start.elapsed(), 0))
}

/// 100 clients, lock + unlock round trips per second and their p99: FleetLock against the
/// same swaps by `etcdctl txn`, with the raw etcd-client transaction beside them.
fn many_clients(server: &[SocketAddr], endpoints: &[String], quick: bool) -> Result<Comparison> {
    let count = if quick { 300 } else { 2_000 };
    // The client's channel runs its workers on the runtime it was made on: one that runs.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let raw = rt.block_on(Client::connect(endpoints, None))?;
    let mut free = raw.clone();
    rt.block_on(async {
        for c in 0..MANY {
            free.put(format!("bench/ctl/{c}"), "free", None).await?;
        }
        Ok::<_, etcd_client::Error>(())
    })?;
    let rate = |s: Series, refusals: bool| {
        let per_s = s.latencies.len() as f64 / s.wall.as_secs_f64();
        s.sample(refusals).with("round_trips_per_s", "/s", per_s)
    };
    let slate = Side::new("FleetLock lock+unlock", |run| {
        fleetlock_series(server, &format!("many{count}r{run}"), count, MANY, "wide")
            .map(|s| rate(s, true))
    });
    let baseline = Side::new("etcdctl txn lock+unlock", |_| {
        etcdctl_series(endpoints, count, MANY).map(|s| rate(s, false))
    });
    let direct = Side::new("raw etcd Txn (etcd-client), 2 per round trip", |_| {
        raw_series(&rt, &raw, 2 * count, MANY).map(|s| {
            // Two swaps make a round trip: the rate of pairs, the latency of one swap.
            let pairs = s.latencies.len() as f64 / 2.0 / s.wall.as_secs_f64();
            s.sample(false).with("round_trips_per_s", "/s", pairs)
        })
    });
    let c = Bench::new(&format!("fleetlock {count} ids, {MANY} clients"), "s")
        .about(format!(
            "{count} lock + unlock round trips by {MANY} concurrent clients through one server \
             ({MANY} slots, so none waits for a slot; all swap the group's one key); the \
             baseline: the same two swaps per round trip by `etcdctl txn`, one process per \
             transaction, each client on a key of its own; figure: the series' wall time, \
             round_trips_per_s and p99 (of a round trip) beside it"
        ))
        .run(slate, baseline, vec![direct])?;
    c.print();
    Ok(c)
}

fn etcd_version() -> String {
    std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.lines()
                .next()
                .map(|l| l.trim_start_matches("etcd Version: ").to_owned())
        })
        .unwrap_or_else(|| "?".into())
}
