//! Developer tasks for slate (`cargo run -p xtask -- <task>`): fetching and preparing the
//! Debian parts VM images are made of, and building the static `slate` binary.
//!
//! xtask runs on the developer's or CI's machine, never on a node; it may shell out to apt,
//! dpkg and cargo, which the node-side crates must not.

mod base_rootfs;
mod bench;
mod bench_apply;
mod bench_boot;
mod bench_fleetlock;
mod bench_operator;
mod bench_pull;
mod kernel;
mod registry;
mod slate_static;
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
    /// Benchmark: slate's squashfs builder vs mksquashfs, printed as ratios.
    BenchRootfs,
    /// Benchmark: kernel start to machined Running vs a busybox /init mounting the same root.
    BenchBoot,
    /// Benchmark: slate pull of a 256 MiB blob from a local registry vs curl + sha256sum + cp.
    BenchPull,
    /// Benchmark: applying a 256 MiB upgrade payload vs cp + sync of the same bytes.
    BenchApply,
    /// Benchmark: FleetLock lock + unlock over HTTP with the etcd store (3-member cluster on
    /// loopback) vs a raw etcd compare-and-swap transaction.
    BenchFleetlock {
        /// 1,000 ids only (without: 1,000 and 10,000).
        #[arg(long)]
        quick: bool,
    },
    /// Benchmark: the rollout operator over 10,000 simulated nodes (3-member etcd): the
    /// leader's decision latency per tick, etcd writes per node upgrade, and the rollout's
    /// wall time vs the policy's theoretical minimum.
    BenchOperator {
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
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
        Task::SlateStatic => slate_static::slate_static().map(drop),
        Task::VmPrep => vm_test::prepare().map(drop),
        Task::VmTest { only } => vm_test::vm_test(&only),
        Task::Demo => vm_test::demo(),
        Task::BenchRootfs => bench::bench_rootfs(),
        Task::BenchBoot => bench_boot::bench_boot(),
        Task::BenchPull => bench_pull::bench_pull(),
        Task::BenchApply => bench_apply::bench_apply(),
        Task::BenchFleetlock { quick } => bench_fleetlock::bench_fleetlock(quick),
        Task::BenchOperator { nodes } => bench_operator::bench_operator(nodes),
    }
}
