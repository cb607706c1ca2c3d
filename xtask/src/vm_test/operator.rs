//! The rollout operator driving three real nodes: a registry holding the releases, a
//! 3-member etcd cluster, one `slate operator run` replica (host build), and three VMs whose
//! update strategy is `operator`. They report themselves to the operator through QEMU's host
//! address 10.0.2.2; the operator reaches each node API through its host port forward.
//!
//! Policy: one group, at most one node unavailable, waves 1 → all (the first wave is one
//! canary, soaked 20 s), failure budget 1. v2 rolls across all three, one at a time; then a v3
//! whose health check can never pass: the canary installs it, fails, reverts to v2 by itself,
//! the rollout pauses, and the other two are never asked.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::{demo_keys, demo_pki, Prepared};
use crate::registry::Registry;
use crate::util::{output, run};
use crate::vm::{Running, Vm};

const GROUP: &str = "trio";
const POLICY: &str = r#"
[[policy]]
name = "trio"
groups = ["trio"]
max_unavailable = "1"
waves = [{ percent = 1, soak = "20s" }, { percent = 100 }]
failure_budget = 1
upgrade_timeout = "15m"
"#;
const BROKEN: &str = "3.0.1";

/// The operator replica, killed when dropped.
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A certificate directory for the operator: the demo's fleet CA (nodes' certificates chain to
/// it: their heartbeats and their API), its client CA, the operator client certificate it
/// calls nodes with, and a serving certificate naming 10.0.2.2 (how the guests reach it),
/// issued from the fleet CA as `slate gen certs` issues `service.crt`.
fn operator_pki(work: &Path) -> Result<PathBuf> {
    let pki = demo_pki();
    let dir = work.join("operator-pki");
    fs::create_dir_all(&dir)?;
    for name in [
        slate_api::CA_CERT,
        slate_api::CLIENT_CA_CERT,
        "operator.crt",
        "operator.key",
        "admin.crt",
        "admin.key",
    ] {
        fs::copy(pki.join(name), dir.join(name)).with_context(|| format!("copying {name}"))?;
    }
    let read = |name: &str| fs::read_to_string(pki.join(name));
    let key = slate_api::generate_key_pem()?;
    let names = slate_api::serving_names(&["10.0.2.2".to_owned()]);
    let cert = slate_api::issue_serving_cert(
        &read(slate_api::CA_CERT)?,
        &read(slate_api::CA_KEY)?,
        &key,
        &names,
    )?;
    fs::write(dir.join(slate_api::SERVICE_CERT), cert)?;
    fs::write(dir.join(slate_api::SERVICE_KEY), key)?;
    Ok(dir)
}

struct Member {
    name: String,
    vm: Vm,
    boot: Option<Running>,
    /// Every console line of every boot, oldest first.
    consoles: Vec<String>,
}

impl Member {
    /// Start the VM again when its guest rebooted (QEMU exits on a reboot). Not waiting for
    /// stage Running: a broken version may never reach it.
    fn keep_running(&mut self) -> Result<()> {
        let exited = self.boot.as_mut().is_none_or(|b| !b.is_running());
        if exited {
            if let Some(boot) = self.boot.take() {
                self.consoles.push(boot.serial());
            }
            self.boot = Some(self.vm.start()?);
        }
        Ok(())
    }

    fn console(&self) -> String {
        let mut all = self.consoles.join("\n");
        if let Some(boot) = &self.boot {
            all.push('\n');
            all.push_str(&boot.serial());
        }
        all
    }
}

fn fleet(slate: &Path, certs: &Path, addr: &str, args: &[&str]) -> Result<String> {
    output(
        Command::new(slate)
            .arg("--certs")
            .arg(certs)
            .args(["--node", addr, "--role", "admin", "fleet"])
            .args(args),
    )
}

fn fleet_status(slate: &Path, certs: &Path, addr: &str) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(&fleet(
        slate,
        certs,
        addr,
        &["status", "--output", "json"],
    )?)?)
}

/// Keeps the VMs running and polls the operator until `done` holds.
fn supervise(
    members: &mut [Member],
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        for m in members.iter_mut() {
            m.keep_running()
                .with_context(|| format!("restarting {}", m.name))?;
        }
        if done()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn publish(slate: &Path, bundle: &Path, repo: &str) -> Result<String> {
    output(
        Command::new(slate)
            .args(["release", "publish", "--bundle"])
            .arg(bundle)
            .args(["--image", repo, "--channel", "stable"]),
    )
}

pub fn operator_rollout(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let (v1, v2, v3) = super::build_v1_v2(slate, work)?;
    let broken = super::rollback::variant_profile(
        work,
        "operator-health",
        "[health]\ntimeout_secs = 5\n[[health.checks]]\nfile = \"/nonexistent/ready\"\n\n\
         [watchdog]\ntimeout_secs = 60\n",
    )?;
    super::rollback::build(slate, &broken, "installer", BROKEN, &[], &v3)?;

    let registry = Registry::start(&work.join("registry"))?;
    let etcd = slate_testkit::etcd::EtcdCluster::start(3)
        .map_err(|e| anyhow::anyhow!("starting a 3-member etcd cluster: {e}"))?;
    let host_slate = super::fleet::host_slate()?;
    let repo = format!("{}/slate/os", registry.host);
    let registry_port = registry
        .host
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let guest_repo = format!("10.0.2.2:{registry_port}/slate/os");
    publish(slate, &v1, &repo)?;
    publish(slate, &v2, &repo)?;

    let certs = operator_pki(work)?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let log = fs::File::create(work.join("operator.log"))?;
    let _replica = Replica(
        Command::new(&host_slate)
            .args(["operator", "run", "--etcd", &etcd.endpoints().join(",")])
            .args(["--listen", &addr, "--name", "op-1", "--image", &repo])
            .args(["--node-image", &guest_repo, "--insecure-registry"])
            .arg("--certs")
            .arg(&certs)
            .args(["--tick", "1s", "--stale-after", "90s"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting slate operator run")?,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&addr).is_err() {
        ensure!(Instant::now() < deadline, "the operator did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut members = Vec::new();
    for i in 1..=3 {
        let name = format!("op{i}");
        let image = work.join(format!("{name}.raw"));
        fs::File::create(&image)?.set_len(256 << 20)?;
        let vm = Vm::new(&image, &work.join(format!("vm-{name}")))?;
        let config = output(
            Command::new(slate)
                .args(["gen", "config", "--name", &name, "--pki"])
                .arg(demo_pki())
                .args(["--image", &guest_repo, "--insecure-registry"])
                .args(["--strategy", "operator", "--poll-interval", "10s"])
                .args(["--operator", &format!("10.0.2.2:{port}"), "--group", GROUP])
                .args(["--advertise", &format!("127.0.0.1:{}", vm.api_port)]),
        )?;
        let config_path = work.join(format!("{name}.machine.toml"));
        fs::write(&config_path, config)?;
        run(Command::new(slate)
            .args(["installer", "install", "--disk"])
            .arg(&image)
            .arg("--bundle")
            .arg(&v1)
            .arg("--trusted-keys")
            .arg(demo_keys())
            .arg("--config")
            .arg(&config_path))?;
        members.push(Member {
            name,
            vm,
            boot: None,
            consoles: Vec::new(),
        });
    }

    let status = |what: &str| -> Result<serde_json::Value> {
        fleet_status(&host_slate, &certs, &addr).with_context(|| format!("fleet status ({what})"))
    };
    let versions = |s: &serde_json::Value| -> Vec<(String, String)> {
        s["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|n| {
                        (
                            n["node"].as_str().unwrap_or("").to_owned(),
                            n["version"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    supervise(
        &mut members,
        "three nodes in the inventory",
        Duration::from_secs(240),
        || Ok(versions(&status("inventory")?).len() == 3),
    )?;
    let policy = work.join("policy.toml");
    fs::write(&policy, POLICY)?;
    fleet(
        &host_slate,
        &certs,
        &addr,
        &["policy", "set", &policy.to_string_lossy()],
    )?;
    let plan = fleet(&host_slate, &certs, &addr, &["plan"])?;

    // v2 across all three, one at a time.
    let started = Instant::now();
    supervise(
        &mut members,
        "every node on 2.0.0",
        Duration::from_secs(1500),
        || {
            let s = status("v2")?;
            Ok(versions(&s).iter().all(|(_, v)| v == "2.0.0")
                && s["rollouts"][0]["state"]["state"] == "completed")
        },
    )?;
    let v2_took = started.elapsed();
    let events: Vec<serde_json::Value> = serde_json::from_str(&output(
        Command::new(&host_slate)
            .arg("--certs")
            .arg(&certs)
            .args(["--node", &addr, "fleet", "status", "--output", "json"]),
    )?)
    .map(|s: serde_json::Value| s["events"].as_array().cloned().unwrap_or_default())?;
    // One at a time: every start comes after the previous node committed.
    let mut in_flight: Vec<String> = Vec::new();
    let mut order = Vec::new();
    for e in &events {
        let node = e["node"].as_str().unwrap_or("").to_owned();
        match e["kind"].as_str() {
            Some("started") => {
                ensure!(
                    in_flight.is_empty(),
                    "{node} started while {in_flight:?} upgraded"
                );
                in_flight.push(node.clone());
                order.push(node);
            }
            Some("committed") | Some("failed") => in_flight.retain(|n| *n != node),
            _ => {}
        }
    }
    ensure!(order.len() == 3, "three starts for v2: {order:?}");
    for m in &members {
        let console = m.console();
        ensure!(
            console.matches("upgrade to 2.0.0 requested").count() == 1,
            "{} was asked {} times for 2.0.0",
            m.name,
            console.matches("upgrade to 2.0.0 requested").count()
        );
        ensure!(
            console.contains("committed: slate-2.0.0"),
            "{} never committed v2",
            m.name
        );
    }

    // A broken v3: the canary reverts, the rollout pauses, the others stay on v2.
    publish(slate, &v3, &repo)?;
    supervise(
        &mut members,
        "the v3 rollout paused",
        Duration::from_secs(900),
        || {
            let s = status("v3")?;
            Ok(s["rollouts"][0]["target"] == BROKEN
                && s["rollouts"][0]["state"]["state"] == "paused")
        },
    )?;
    let s = status("paused")?;
    let reason = s["rollouts"][0]["state"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    // Give the others time to be (wrongly) asked, while the canary settles back on v2.
    supervise(
        &mut members,
        "the canary back on v2",
        Duration::from_secs(300),
        || {
            Ok(versions(&status("canary")?)
                .iter()
                .all(|(_, v)| v == "2.0.0"))
        },
    )?;
    let asked: Vec<&str> = members
        .iter()
        .filter(|m| {
            m.console()
                .contains(&format!("upgrade to {BROKEN} requested"))
        })
        .map(|m| m.name.as_str())
        .collect();
    ensure!(
        asked.len() == 1,
        "only the canary may be asked for {BROKEN}: {asked:?}"
    );
    let canary = asked[0].to_owned();
    let final_status = status("final")?;
    let canary_row = final_status["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node"] == canary.as_str()).cloned())
        .unwrap_or_default();
    for m in &mut members {
        if let Some(mut boot) = m.boot.take() {
            boot.kill();
        }
    }
    drop(etcd);
    drop(registry);
    Ok(format!(
        "plan:\n{plan}v2 across three nodes one at a time in {:.0} s, order {order:?}; broken \
         {BROKEN}: canary {canary} reverted ({}), rollout paused: {reason}; the other two never \
         asked",
        v2_took.as_secs_f64(),
        canary_row["last_error"]
    ))
}
