//! Reboot benchmark (not a test): a committed node asked to reboot over its API, to machined's
//! stage Running on the next boot — by kexec (`slate reboot --mode kexec`: the next entry's
//! kernel started from its UKI, no firmware) against the firmware path (`--mode powercycle`:
//! OVMF, systemd-boot, the EFI stub). One VM, QEMU TCG, 1 vCPU; wall-clock times from the
//! request to the line on the serial console.
//!
//! Under the harness's `-no-reboot` a firmware reboot ends the QEMU process and the benchmark
//! starts it again at once: that restart (a few hundred milliseconds) counts on the firmware
//! side, as a machine's reset would. Between runs the node is left to commit its boot, untimed,
//! so each reboot starts from the same state.

use std::cell::RefCell;
use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::bench::{Bench, Comparison, Sample, Side};
use crate::util::{output, repo_root};
use crate::vm::{tail, Running, Vm};
use crate::vm_test::{build_image, image_node_name, prepare, Prepared};

const RUNNING: &str = "[slate] [machined] stage Running";
const TIMEOUT: Duration = Duration::from_secs(240);

/// The node, its VM and the boot that runs now.
struct Node<'a> {
    prepared: &'a Prepared,
    /// What the node's certificate names (the API is reached through a port forward).
    name: String,
    vm: Vm,
    boot: Running,
}

impl Node<'_> {
    fn slate(&self, args: &[&str]) -> Result<String> {
        output(
            Command::new(&self.prepared.slate)
                .arg("--node")
                .arg(format!("127.0.0.1:{}", self.vm.api_port))
                .arg("--server-name")
                .arg(&self.name)
                .arg("--certs")
                .arg(&self.prepared.pki)
                .args(args),
        )
    }

    /// Until the node says its boot is committed (untimed: between runs).
    fn wait_committed(&self) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(text) = self.slate(&["status", "--output", "json"]) {
                let status: serde_json::Value = serde_json::from_str(&text)?;
                if status["committed"] == true && status["stage"] == "Running" {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("the node did not commit within {TIMEOUT:?}")
    }

    /// `slate reboot --mode MODE`, then until stage Running on the next boot: seconds.
    fn reboot(&mut self, mode: &str) -> Result<f64> {
        let before = self.boot.serial().matches(RUNNING).count();
        let asked = Instant::now();
        self.slate(&["reboot", "--mode", mode])?;
        loop {
            if !self.boot.is_running() {
                // A reset: the firmware path. Power on again, as the machine would.
                self.boot = self.vm.start()?;
                self.boot
                    .expect(&[RUNNING], TIMEOUT, "stage Running after the reboot")?;
                break;
            }
            if self.boot.serial().matches(RUNNING).count() > before {
                break;
            }
            ensure!(
                asked.elapsed() < TIMEOUT,
                "no stage Running within {TIMEOUT:?}; console:\n{}",
                tail(&self.boot.serial(), 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let took = asked.elapsed().as_secs_f64();
        self.wait_committed()?;
        Ok(took)
    }
}

pub fn bench_reboot() -> Result<Vec<Comparison>> {
    let prepared = prepare()?;
    let work = repo_root().join("target/bench/reboot");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let disk = work.join("reboot.raw");
    build_image(&prepared.slate, "1.0.0", &[], &disk)?;
    let mut vm = Vm::new(&disk, &work.join("vm"))?;
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], TIMEOUT, "the first boot")?;
    let node = RefCell::new(Node {
        prepared: &prepared,
        name: image_node_name(&disk),
        vm,
        boot,
    });
    node.borrow().wait_committed()?;

    let kexec = Side::new("kexec reboot to Running", |_| {
        let mut node = node.borrow_mut();
        let took = node.reboot("kexec")?;
        let serial = node.boot.serial();
        ensure!(
            serial.contains("rebooting by kexec into"),
            "the node did not kexec; console:\n{}",
            tail(&serial, 30)
        );
        Ok(Sample::new(took))
    });
    let firmware = Side::new("firmware reboot to Running", |_| {
        node.borrow_mut().reboot("powercycle").map(Sample::new)
    });
    let c = Bench::new("reboot to Running", "s")
        .about("`slate reboot --mode kexec` vs `--mode powercycle` (OVMF, systemd-boot, EFI stub)")
        .about("wall clock from the API request to machined's stage Running on the next boot;")
        .about("QEMU TCG, 1 vCPU, one committed node; the firmware side includes QEMU's restart")
        .run(kexec, firmware, vec![])?;
    c.print();
    node.borrow_mut().boot.kill();
    Ok(vec![c])
}
