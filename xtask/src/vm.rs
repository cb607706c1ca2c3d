//! The VM harness: QEMU (TCG) with OVMF and a per-disk copy of the firmware variables (the
//! node's NVRAM, so EFI variables persist across its reboots), the serial console captured to a
//! file and watched for what the guest prints.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// One virtual machine: a disk and its NVRAM.
#[derive(Debug)]
pub struct Vm {
    disk: PathBuf,
    vars: PathBuf,
    work: PathBuf,
    boots: u32,
}

/// What one boot printed.
#[derive(Debug)]
pub struct Boot {
    pub serial: String,
    /// The first expected line seen, if any.
    pub matched: Option<String>,
    pub elapsed: Duration,
}

impl Vm {
    /// A VM over `disk` with fresh firmware variables, keeping its logs in `work`.
    pub fn new(disk: &Path, work: &Path) -> Result<Self> {
        fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
        let vars = work.join("OVMF_VARS.fd");
        fs::copy(OVMF_VARS, &vars).with_context(|| format!("copying {OVMF_VARS}"))?;
        Ok(Self {
            disk: disk.to_owned(),
            vars,
            work: work.to_owned(),
            boots: 0,
        })
    }

    fn spawn(&self, log: &Path) -> Result<Child> {
        Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", "1024", "-smp", "1"])
            .args(["-display", "none", "-monitor", "none", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", log.display()))
            .arg("-drive")
            .arg(format!("if=pflash,format=raw,readonly=on,file={OVMF_CODE}"))
            .arg("-drive")
            .arg(format!("if=pflash,format=raw,file={}", self.vars.display()))
            .arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", self.disk.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting qemu-system-x86_64")
    }

    /// Boot once (a guest reboot or power-off ends the boot) and watch the serial console for
    /// any of `expect`; stop at the first one seen, when QEMU exits, or after `timeout`.
    pub fn boot(&mut self, expect: &[&str], timeout: Duration) -> Result<Boot> {
        self.boots += 1;
        let log = self.work.join(format!("boot-{}.log", self.boots));
        let _ = fs::remove_file(&log);
        let started = Instant::now();
        let mut child = self.spawn(&log)?;
        let mut matched = None;
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let serial = String::from_utf8_lossy(&fs::read(&log).unwrap_or_default()).into_owned();
            if let Some(line) = serial
                .lines()
                .find(|line| expect.iter().any(|e| line.contains(e)))
            {
                matched = Some(line.trim().to_string());
            }
            let exited = child.try_wait().context("waiting for QEMU")?.is_some();
            if matched.is_some() || exited || started.elapsed() > timeout {
                if !exited {
                    // Let the guest finish what it is printing, then power it off hard.
                    std::thread::sleep(Duration::from_millis(500));
                    let _ = child.kill();
                    let _ = child.wait();
                }
                let serial =
                    String::from_utf8_lossy(&fs::read(&log).unwrap_or_default()).into_owned();
                return Ok(Boot {
                    serial,
                    matched,
                    elapsed: started.elapsed(),
                });
            }
        }
    }
}

impl Boot {
    /// Fail with the tail of the console when nothing expected was seen.
    pub fn expect_match(&self, what: &str) -> Result<&str> {
        match &self.matched {
            Some(line) => Ok(line),
            None => {
                let tail: Vec<&str> = self.serial.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "{what}: not seen after {:.0?}; console ended with:\n{}",
                    self.elapsed,
                    tail.join("\n")
                )
            }
        }
    }
}
