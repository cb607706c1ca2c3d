//! Developer tasks for slate (`cargo run -p xtask -- <task>`): fetching and preparing the
//! Debian parts VM images are made of, and building the static `slate` binary.
//!
//! xtask runs on the developer's or CI's machine, never on a node; it may shell out to apt,
//! dpkg and cargo, which the node-side crates must not.

mod base_rootfs;
mod bench;
mod containerd_ext;
mod debian_rootfs;
mod kernel;
mod oci_archive;
mod registry;
mod slate_static;
mod soak;
mod tpm2_ext;
mod util;
mod vm;
mod vm_test;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "Developer tasks for slate")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Cache Debian's kernel (linux-image-amd64's versioned package) in .cache/kernel/ and
    /// report how the initramfs modules are provided.
    Kernel {
        /// Rebuild the cache even if its stamp matches apt's candidate version.
        #[arg(long)]
        force: bool,
    },
    /// Assemble a minimal busybox root filesystem directory.
    BaseRootfs {
        /// Directory to create (must not exist, or be empty; see --replace).
        #[arg(long)]
        out: PathBuf,
        /// Version written to /etc/os-release.
        #[arg(long)]
        version: String,
        /// A slate binary to install as /usr/bin/slate.
        #[arg(long)]
        slate_bin: Option<PathBuf>,
        /// Delete a non-empty --out directory first.
        #[arg(long)]
        replace: bool,
    },
    /// Make the containerd system extension (Debian's containerd and runc, the web container's
    /// OCI archive) under target/containerd/ext, signed with the demo key.
    ContainerdExt {
        /// The extension's version.
        #[arg(long, default_value = "1.6.20-1")]
        version: String,
        /// The port the web container listens on.
        #[arg(long, default_value_t = 8080)]
        web_port: u16,
    },
    /// Make the tpm2 system extension (Debian's cryptsetup and tpm2-tools with their
    /// libraries, for a `[var] mode = "tpm2"` image) under target/tpm2/ext, signed with the
    /// demo key.
    Tpm2Ext {
        /// The extension's version.
        #[arg(long, default_value = "2.6.1-1")]
        version: String,
    },
    /// A Debian bookworm root with systemd as PID 1 and the static slate (mmdebstrap; root):
    /// the base of profiles/debian.toml (issue 39).
    DebianRootfs {
        /// Directory to create (default target/debian/rootfs).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The slate binary to install as /usr/bin/slate (default: the static one).
        #[arg(long)]
        slate_bin: Option<PathBuf>,
        /// Delete a non-empty --out directory first.
        #[arg(long)]
        replace: bool,
    },
    /// Build the slate binary statically linked (target/static/...) and check it is static.
    SlateStatic,
    /// What every VM scenario needs, built ahead (kernel cache, static slate, keys, base
    /// root): the test command runs it beside the host tests, which leave a core idle.
    VmPrep,
    /// Build images and boot them in QEMU; every scenario judged by what the guest printed.
    VmTest {
        /// Run only these scenarios (all when none is named).
        only: Vec<String>,
    },
    /// The main job: build the demo image, boot it, show what happened.
    Demo,
    /// Benchmark: slate's squashfs builder vs mksquashfs (all cores; one core as a reference).
    BenchRootfs,
    /// Benchmark (issue 43): the demo bundle rebuilt with the build cache after one file of
    /// the root changed vs a clean build (byte-identical, checked every run), with mksquashfs.
    BenchRebuild {
        /// The slate binary that builds the bundles (the static one vm-prep builds by default).
        #[arg(long)]
        slate: Option<PathBuf>,
    },
    /// Benchmark: kernel start to machined Running vs a busybox /init mounting the same root.
    BenchBoot,
    /// Benchmark: reboot to machined Running by kexec vs through the firmware (one VM).
    BenchReboot,
    /// Benchmark: 50 services on the demo node (direct kernel boot): kernel start to all ready
    /// vs the busybox baseline boot and slate's boot without services, machined's memory with
    /// 50 and with none, and the drain against the services' grace periods.
    BenchServices,
    /// Benchmark: slate pull of a 256 MiB blob from a local registry vs curl + sha256sum + cp.
    BenchPull,
    /// Benchmark: applying a 256 MiB upgrade payload vs cp + fsync of the same bytes.
    BenchApply,
    /// Benchmark: FleetLock lock + unlock over HTTP with the etcd store (3-member cluster on
    /// loopback) vs a raw etcd compare-and-swap transaction.
    BenchFleetlock {
        /// 1,000 ids only (without: 1,000 and 10,000).
        #[arg(long)]
        quick: bool,
    },
    /// Benchmark (issue 42): the CPU a Prometheus scrape of a node costs machined, in a VM:
    /// 30 scrapes of `/metrics` vs an idle node over the same window, per scrape and as % CPU
    /// at a 15 s interval.
    BenchNodeScrape,
    /// Benchmark: the rollout operator over simulated nodes (3-member etcd): the rollout's
    /// wall time vs the policy's theoretical minimum, the leader's decision latency per tick,
    /// etcd writes per node upgrade. Each of the runs starts its own cluster and fleet. First,
    /// the cost of a scrape: `GET /metrics` vs `GET /v1/fleet/status` over the same fleet.
    BenchOperator {
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// The scrape's cost only (no rollout).
        #[arg(long)]
        scrape_only: bool,
        /// Measured rollouts (each starts its own cluster and fleet; minutes at 10,000 nodes).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Leave out the rollout whose leader is killed halfway.
        #[arg(long)]
        no_failover: bool,
    },
    /// One operator replica for bench-operator (its own process: its memory is measured and it
    /// is killed to fail over). Not for use by hand.
    #[command(hide = true)]
    BenchOperatorReplica {
        #[arg(long)]
        etcd: String,
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        certs: PathBuf,
        #[arg(long)]
        name: String,
    },
    /// Benchmark: `slate snapshot upgrade --command CMD` vs CMD chrooted on a copy of the root
    /// (a loop-mounted Btrfs pool; root), and the bytes a snapshot adds for a one-file change.
    BenchSnapshot {
        /// Measure this slate binary and skip the preparation (without: `xtask vm-prep`).
        #[arg(long)]
        slate: Option<PathBuf>,
    },
    /// Soak (not a test; about 20 minutes): one VM, online upgrades alternating good and
    /// broken versions (each good one committed, each broken one reverted; ESP free space and
    /// META size equal after the last as after the 2nd), and 50 concurrent status clients
    /// during one upgrade (every request answered within a stated bound). Works in
    /// target/soak/.
    Soak {
        /// How many upgrades.
        #[arg(long, default_value_t = 20)]
        upgrades: usize,
        /// The (good, so odd) upgrade during which the status clients ask.
        #[arg(long, default_value_t = 11)]
        load_at: usize,
        /// Each status client's pause between its requests, in milliseconds (`slate ...
        /// --wait` polls every 2,000); 0 asks in a tight loop.
        #[arg(long, default_value_t = 1000)]
        think_ms: u64,
        /// One API client per status client for all its requests instead of one per request.
        #[arg(long)]
        reuse_clients: bool,
    },
    /// Benchmark (issue 41): pairs of demo bundles — what a node fetches for each, slate's chunks
    /// against casync's, and the build time beside the chunk index's.
    BenchDelta {
        /// The slate binary that builds the bundles (target/release/slate by default).
        #[arg(long)]
        slate: Option<PathBuf>,
    },
    /// Benchmark (issue 40): /var in LUKS2 with its key sealed to the TPM (swtpm) against a
    /// plain /var on the same image — sequential write and read, fsync latency — and the unlock
    /// at boot.
    BenchVar,
    /// Every benchmark (or those named), each side measured 3 times; writes
    /// target/bench/summary-<commit>.json and target/bench/latest.json.
    Bench {
        /// rootfs, rebuild, apply, pull, boot, reboot, services, fleetlock, operator, snapshot
        /// (all when none is named).
        only: Vec<String>,
        /// Simulated nodes for the operator benchmark.
        #[arg(long, default_value_t = bench::summary::OPERATOR_NODES)]
        operator_nodes: usize,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Kernel { force } => kernel::kernel(force),
        Task::BaseRootfs {
            out,
            version,
            slate_bin,
            replace,
        } => base_rootfs::base_rootfs(&out, &version, slate_bin.as_deref(), replace),
        Task::ContainerdExt { version, web_port } => {
            let slate = slate_static::slate_static()?;
            containerd_ext::containerd_ext(&version, web_port, &slate).map(drop)
        }
        Task::Tpm2Ext { version } => {
            let slate = slate_static::slate_static()?;
            tpm2_ext::tpm2_ext(&version, &slate).map(drop)
        }
        Task::SlateStatic => slate_static::slate_static().map(drop),
        Task::DebianRootfs {
            out,
            slate_bin,
            replace,
        } => {
            let slate = match slate_bin {
                Some(bin) => bin,
                None => slate_static::slate_static()?,
            };
            let out = out.unwrap_or_else(debian_rootfs::default_out);
            debian_rootfs::debian_rootfs(&out, &slate, replace)
        }
        Task::VmPrep => vm_test::prepare().map(drop),
        Task::VmTest { only } => vm_test::vm_test(&only),
        Task::Demo => vm_test::demo(),
        Task::BenchRootfs => bench::rootfs::bench_rootfs().map(drop),
        Task::BenchRebuild { slate } => bench::rebuild::bench_rebuild(slate.as_deref()).map(drop),
        Task::BenchBoot => bench::boot::bench_boot().map(drop),
        Task::BenchPull => bench::pull::bench_pull().map(drop),
        Task::BenchReboot => bench::reboot::bench_reboot().map(drop),
        Task::BenchServices => bench::services::bench_services().map(drop),
        Task::BenchApply => bench::apply::bench_apply().map(drop),
        Task::BenchNodeScrape => bench::node_scrape::bench_node_scrape().map(drop),
        Task::BenchFleetlock { quick } => bench::fleetlock::bench_fleetlock(quick).map(drop),
        Task::BenchOperator {
            nodes,
            scrape_only,
            runs,
            no_failover,
        } => bench::operator::bench_operator(nodes, scrape_only, runs, !no_failover).map(drop),
        Task::BenchOperatorReplica {
            etcd,
            listen,
            certs,
            name,
        } => bench::operator_replica::serve(&etcd, listen, &certs, &name),
        Task::BenchSnapshot { slate } => {
            bench::snapshot::bench_snapshot(slate.as_deref()).map(drop)
        }
        Task::Soak {
            upgrades,
            load_at,
            think_ms,
            reuse_clients,
        } => soak::soak(
            upgrades,
            load_at,
            std::time::Duration::from_millis(think_ms),
            reuse_clients,
        ),
        Task::BenchDelta { slate } => bench::delta::bench_delta(slate.as_deref()),
        Task::BenchVar => bench::var::bench_var(),
        Task::Bench {
            only,
            operator_nodes,
        } => bench::summary::bench_all(&only, operator_nodes),
    }
}
