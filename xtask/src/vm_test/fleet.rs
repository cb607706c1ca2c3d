//! The unattended update of a node that follows a channel under a FleetLock: a real registry
//! holding the releases (`slate release`), a real 3-member etcd cluster behind
//! `slate fleetlock serve --etcd`, and the node's update agent, which reaches both through
//! QEMU's host address 10.0.2.2.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::{build_bundle, running, Node, Prepared};
use crate::registry::Registry;
use crate::util::{output, repo_root, run};
use crate::vm::{Running, Vm};

/// The node's poll interval: the configuration's minimum.
const POLL: &str = "10s";
/// How long a status condition may take: a few polls.
const SETTLE: Duration = Duration::from_secs(75);

/// The host build of slate, with the etcd store that the node's static binary leaves out (the
/// test command's `cargo test` has built it already).
pub(super) fn host_slate() -> Result<PathBuf> {
    run(Command::new(env!("CARGO"))
        .args(["build", "--locked", "-q", "-p", "slate"])
        .current_dir(repo_root()))?;
    Ok(repo_root().join("target/debug/slate"))
}

/// `slate fleetlock serve` on the etcd cluster, killed when dropped.
struct LockServer {
    child: Child,
    port: u16,
}

impl Drop for LockServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LockServer {
    fn start(slate: &Path, endpoints: &str, log: &Path) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = fs::File::create(log)?;
        let child = Command::new(slate)
            .args(["fleetlock", "serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--etcd", endpoints, "--group", "default=1"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting slate fleetlock serve")?;
        let server = LockServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(Instant::now() < deadline, "the lock server did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }

    /// A FleetLock request as zincati sends it; answers the HTTP status.
    fn post(&self, path: &str, id: &str) -> Result<u16> {
        let body = format!(r#"{{"client_params":{{"id":"{id}","group":"default"}}}}"#);
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nfleet-lock-protocol: true\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("not an HTTP answer: {answer:?}"))
    }
}

/// The holders of group `default` as `slate fleetlock status --etcd` reads them from etcd.
fn holders(slate: &Path, endpoints: &str) -> Result<Vec<String>> {
    let status: serde_json::Value = serde_json::from_str(&output(Command::new(slate).args([
        "fleetlock",
        "status",
        "--etcd",
        endpoints,
        "--output",
        "json",
    ]))?)?;
    let groups = status["groups"].as_array().cloned().unwrap_or_default();
    Ok(groups
        .iter()
        .filter(|g| g["group"] == "default")
        .flat_map(|g| g["holders"].as_array().cloned().unwrap_or_default())
        .filter_map(|h| h.as_str().map(str::to_owned))
        .collect())
}

/// Poll the node's status until `done` holds for its update agent.
fn wait_for_agent(
    node: &Node,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let status = node.status()?;
        if done(&status["agent"]) {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!("the update agent never reached {what}; last status: {status}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn release(slate: &Path, args: &[&str]) -> Result<String> {
    output(Command::new(slate).arg("release").args(args))
}

fn console_has(boot: &Running, text: &str) -> bool {
    boot.serial().contains(text)
}

/// A node on `stable` with `strategy = fleet-lock` and a window that is always open. v2 in
/// `beta` → nothing happens; v2 promoted to `stable` → the node downloads it, takes the slot,
/// upgrades, commits and gives the slot back (etcd shows no holder afterwards). Then v3 reaches
/// `stable` while an admin holds the only slot: the node downloads it and waits for the lock;
/// v3 is yanked, the slot freed, and the node stays on v2.
pub fn fleet_lock_updates(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let (v1, v2, v3) = super::build_v1_v2(slate, work)?;
    build_bundle(slate, "3.0.0", &[], &v3)?;

    let registry = Registry::start(&work.join("registry"))?;
    let etcd = slate_testkit::etcd::EtcdCluster::start(3)
        .map_err(|e| anyhow::anyhow!("starting a 3-member etcd cluster: {e}"))?;
    let endpoints = etcd.endpoints().join(",");
    let admin = host_slate()?;
    let lock = LockServer::start(&admin, &endpoints, &work.join("fleetlock.log"))?;
    let repo = format!("{}/slate/os", registry.host);
    let port = registry.host.rsplit(':').next().unwrap_or_default();
    let guest_repo = format!("10.0.2.2:{port}/slate/os");
    release(
        slate,
        &[
            "publish",
            "--bundle",
            &v1.to_string_lossy(),
            "--image",
            &repo,
            "--channel",
            "stable",
        ],
    )?;
    release(
        slate,
        &[
            "publish",
            "--bundle",
            &v2.to_string_lossy(),
            "--image",
            &repo,
            "--channel",
            "beta",
        ],
    )?;

    let config = output(
        Command::new(slate)
            .args(["gen", "config", "--name", "fleet1", "--pki"])
            .arg(super::demo_pki())
            .args([
                "--image",
                &guest_repo,
                "--insecure-registry",
                "--channel",
                "stable",
            ])
            .args(["--strategy", "fleet-lock", "--window", "* 00:00 24h"])
            .arg("--lock-server")
            .arg(format!("http://10.0.2.2:{}", lock.port))
            .args(["--poll-interval", POLL]),
    )?;
    let config_path = work.join("fleet1.machine.toml");
    fs::write(&config_path, config)?;
    let image = work.join("fleet.raw");
    super::install_blank_disk_of(256, slate, &image, &v1, "1.0.0", &config_path)?;

    let mut vm = Vm::new(&image, &work.join("vm-fleet"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "fleet1".into(),
    };
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["update agent: FleetLock slot released"],
        Duration::from_secs(60),
        "the agent giving its slot back on start",
    )?;
    let beta_only = wait_for_agent(&node, "up to date on stable", |a| {
        a["reason"] == "up to date" && a["newest_available"] == "1.0.0"
    })?;
    ensure!(
        beta_only["agent"]["strategy"] == "fleet-lock" && beta_only["version"] == "1.0.0",
        "{beta_only}"
    );
    ensure!(
        !console_has(&boot, "update agent: downloading"),
        "a beta release must not be downloaded by a stable node"
    );

    release(
        slate,
        &["promote", "2.0.0", "--image", &repo, "--channel", "stable"],
    )?;
    let locked = boot.expect(
        &["update agent: FleetLock slot taken for 2.0.0"],
        SETTLE,
        "the agent taking the slot for 2.0.0",
    )?;
    let held = holders(&admin, &endpoints)?;
    ensure!(held == ["fleet1"], "etcd while upgrading: holders {held:?}");
    boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "v2's installer",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure!(
        console_has(&boot, "update agent: 2.0.0 downloaded and verified"),
        "the download line"
    );

    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-2.0.0"],
        Duration::from_secs(30),
        "v2 committed",
    )?;
    boot.expect(
        &["update agent: FleetLock slot released"],
        Duration::from_secs(60),
        "the slot given back after the commit",
    )?;
    ensure!(
        console_has(&boot, "update agent: the upgrade to 2.0.0 is committed"),
        "the agent judging its attempt"
    );
    let after_v2 = holders(&admin, &endpoints)?;
    ensure!(
        after_v2.is_empty(),
        "etcd after the commit: holders {after_v2:?}"
    );
    ensure!(node.status()?["version"] == "2.0.0");

    // v3 on stable while an admin holds the only slot: downloaded, then waiting for the lock.
    ensure!(
        lock.post("/v1/pre-reboot", "admin-hold")? == 200,
        "the admin's lock"
    );
    release(
        slate,
        &[
            "publish",
            "--bundle",
            &v3.to_string_lossy(),
            "--image",
            &repo,
            "--channel",
            "stable",
        ],
    )?;
    let waiting = wait_for_agent(&node, "waiting for the slot for 3.0.0", |a| {
        a["state"] == "waiting"
            && a["target"] == "3.0.0"
            && a["reason"]
                .as_str()
                .is_some_and(|r| r.contains("FleetLock slot"))
    })?;
    release(
        slate,
        &[
            "yank",
            "3.0.0",
            "--image",
            &repo,
            "--reason",
            "breaks the health check",
        ],
    )?;
    let yanked = wait_for_agent(&node, "up to date after the yank", |a| {
        a["reason"] == "up to date" && a["newest_available"] == "2.0.0"
    })?;
    output(
        Command::new(&admin)
            .args(["fleetlock", "release", "--etcd", &endpoints])
            .args(["--group", "default", "--id", "admin-hold"]),
    )?;
    // Two more polls with the slot free: v3 is never installed.
    std::thread::sleep(Duration::from_secs(25));
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["agent"]["reason"] == "up to date",
        "after the yank: {status}"
    );
    ensure!(
        !console_has(&boot, "upgrading 2.0.0 -> 3.0.0") && holders(&admin, &endpoints)?.is_empty(),
        "v3 must never be installed, and no slot held"
    );
    let listed = release(slate, &["list", "--image", &repo, "--output", "json"])?;
    boot.kill();
    drop(lock);
    drop(etcd);
    drop(registry);
    Ok(format!(
        "stable node ignored 2.0.0 in beta; after the promotion: `{}`, etcd holders [fleet1] \
         while upgrading, committed 2.0.0, slot released (etcd: no holder); v3 on stable \
         while an admin held the slot: {} then yanked: {}; never installed; index: {} bytes",
        locked.trim(),
        waiting["agent"]["reason"],
        yanked["agent"]["reason"],
        listed.len()
    ))
}
