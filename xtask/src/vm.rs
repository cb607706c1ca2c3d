//! The VM harness: QEMU (TCG) with OVMF and a per-disk copy of the firmware variables (the
//! node's NVRAM, so EFI variables persist across its reboots), the serial console captured to a
//! file and watched for what the guest prints, the node API forwarded to 127.0.0.1, an
//! i6300esb watchdog, QEMU's monitor on its standard input (only this process can write
//! to it; what it answers is kept beside the console log), and optionally a TPM 2.0 (Debian's swtpm, one process per boot over a state
//! directory that outlives it).

use std::fs;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long a match in a line without its newline waits for the rest of the line.
const UNTERMINATED_LINE_GRACE: Duration = Duration::from_secs(2);

const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// OVMF with Secure Boot: its variable store is only writable from SMM, so the machine is a
/// q35 with SMM and a secure flash (TCG: this KVM has no SMM). Its empty VARS are setup mode.
const OVMF_CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";

/// One virtual machine: a disk, its NVRAM, and host ports forwarded to the node API and to
/// the demo's web service.
#[derive(Debug)]
pub struct Vm {
    disk: PathBuf,
    vars: PathBuf,
    work: PathBuf,
    boots: u32,
    pub api_port: u16,
    /// Forwarded to the guest's port 8080: the demo profile's web service.
    pub web_port: u16,
    /// Secure Boot firmware ([`Vm::with_secure_boot`]).
    secure_boot: bool,
    /// A TPM 2.0 ([`Vm::with_tpm`]): swtpm's state directory, kept across boots as a real
    /// TPM's NVRAM is.
    tpm: Option<PathBuf>,
    /// The virtual CPU offers RDRAND ([`Vm::without_cpu_rng`] takes it away).
    cpu_rng: bool,
}

/// A running boot of a VM. A guest reboot or power-off ends the QEMU process (`-no-reboot`).
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// This boot's swtpm (started before QEMU, stopped with it) and its control socket.
    swtpm: Option<Swtpm>,
    /// The human monitor's input (`-monitor stdio`; its answers go to `monitor_log`).
    monitor: Option<ChildStdin>,
    monitor_log: PathBuf,
    log: PathBuf,
    started: Instant,
    started_at: std::time::SystemTime,
}

/// Every boot that ended, by log file and how long QEMU ran: VM time is most of the VM tests'
/// wall time, and the run reports it per scenario (issue 17).
static BOOTS: std::sync::Mutex<Vec<(PathBuf, Duration)>> = std::sync::Mutex::new(Vec::new());

/// The boots under `dir` that have ended: how many, and their QEMU time added up.
pub fn boots_under(dir: &Path) -> (usize, Duration) {
    let boots = BOOTS.lock().unwrap_or_else(|p| p.into_inner());
    boots
        .iter()
        .filter(|(log, _)| log.starts_with(dir))
        .fold((0, Duration::ZERO), |(n, total), (_, took)| {
            (n + 1, total + *took)
        })
}

/// Two distinct free ports on loopback, for the node API's and the web workload's forwards.
/// Both listeners are held until both ports are known: one dropped before the second bind
/// let the kernel hand out its port again, and QEMU refused two forwarding rules on one port
/// (containerd_workload failed to start once in a fresh-clone run, 2026-12-07).
fn free_ports() -> Result<(u16, u16)> {
    let first = TcpListener::bind("127.0.0.1:0")?;
    let second = TcpListener::bind("127.0.0.1:0")?;
    Ok((first.local_addr()?.port(), second.local_addr()?.port()))
}

impl Vm {
    /// A VM over `disk` with fresh firmware variables, keeping its logs in `work`.
    pub fn new(disk: &Path, work: &Path) -> Result<Self> {
        fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
        let vars = work.join("OVMF_VARS.fd");
        fs::copy(OVMF_VARS, &vars).with_context(|| format!("copying {OVMF_VARS}"))?;
        let (api_port, web_port) = free_ports()?;
        Ok(Self {
            disk: disk.to_owned(),
            vars,
            work: work.to_owned(),
            boots: 0,
            api_port,
            web_port,
            secure_boot: false,
            tpm: None,
            cpu_rng: true,
        })
    }

    /// QEMU's default `qemu64`, without RDRAND: the kernel gathers entropy by itself unless
    /// slate credits the seed the last boot saved, which node_lifecycle proves this way.
    pub fn without_cpu_rng(mut self) -> Self {
        self.cpu_rng = false;
        self
    }

    /// Give the VM a TPM 2.0: Debian's swtpm over `state` (a directory, made when missing;
    /// a fresh one is another TPM), started for each boot and stopped when it ends, as QEMU's
    /// `tpm-crb` device; `None` takes the TPM out.
    pub fn with_tpm(mut self, state: Option<&Path>) -> Self {
        self.set_tpm(state);
        self
    }

    /// [`Vm::with_tpm`] on a VM between boots.
    pub fn set_tpm(&mut self, state: Option<&Path>) {
        self.tpm = state.map(Path::to_owned);
    }

    /// swtpm for the boot whose log is `log`, and QEMU's arguments for it.
    fn start_swtpm(&self, log: &Path) -> Result<Option<(Swtpm, Vec<String>)>> {
        let Some(state) = &self.tpm else {
            return Ok(None);
        };
        fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
        let socket = swtpm_socket();
        let _ = fs::remove_file(&socket);
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--terminate"])
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", socket.display()))
            .arg("--log")
            .arg(format!(
                "file={},level=1",
                log.with_extension("swtpm.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting swtpm (Debian's swtpm package; scripts/install-deps)")?;
        let mut child = child;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "swtpm exited ({status}) before listening on {}",
                    socket.display()
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("swtpm did not listen on {} within 10 s", socket.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let args = [
            "-chardev".to_owned(),
            format!("socket,id=chrtpm,path={}", socket.display()),
            "-tpmdev".to_owned(),
            "emulator,id=tpm0,chardev=chrtpm".to_owned(),
            "-device".to_owned(),
            "tpm-crb,tpmdev=tpm0".to_owned(),
        ];
        Ok(Some(((child, socket), args.to_vec())))
    }

    /// Boot with OVMF's Secure Boot firmware (empty variables: setup mode until keys are
    /// enrolled).
    pub fn with_secure_boot(mut self) -> Self {
        self.secure_boot = true;
        self
    }

    fn cpu_model(&self) -> &'static str {
        if self.cpu_rng {
            "qemu64,+rdrand"
        } else {
            "qemu64"
        }
    }

    /// Power the VM on.
    pub fn start(&mut self) -> Result<Running> {
        self.boots += 1;
        let log = self.work.join(format!("boot-{}.log", self.boots));
        let _ = fs::remove_file(&log);
        let monitor_log = log.with_extension("monitor.log");
        let monitor_out = fs::File::create(&monitor_log)
            .with_context(|| format!("creating {}", monitor_log.display()))?;
        let (swtpm, tpm_args) = match self.start_swtpm(&log)? {
            Some((child, args)) => (Some(child), args),
            None => (None, Vec::new()),
        };
        let mut child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", "1024", "-smp", "1"])
            // The CPUs nodes run on have RDRAND, which seeds the kernel's CRNG at once; without
            // it a first boot (no saved seed) waited for entropy: STATE formatted in 4.3 s, not
            // 0.2 s (docs/testing.md).
            .args(["-cpu", self.cpu_model()])
            // No display adapter: the console is the serial line, and the firmware and the
            // kernel would otherwise draw on an emulated one nobody looks at.
            .args(["-display", "none", "-vga", "none"])
            .args(["-monitor", "stdio", "-no-reboot"])
            // The hardware watchdog machined arms: when it fires, QEMU resets the guest, which
            // `-no-reboot` turns into an exit, like any other reboot.
            .args(["-device", "i6300esb"])
            .arg("-serial")
            .arg(format!("file:{}", log.display()))
            .args(if self.secure_boot {
                &[
                    "-machine",
                    "q35,smm=on",
                    "-global",
                    "driver=cfi.pflash01,property=secure,value=on",
                ][..]
            } else {
                &[][..]
            })
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,readonly=on,file={}",
                if self.secure_boot {
                    OVMF_CODE_SECBOOT
                } else {
                    OVMF_CODE
                }
            ))
            .arg("-drive")
            .arg(format!("if=pflash,format=raw,file={}", self.vars.display()))
            .arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", self.disk.display()))
            // No option ROM on the NIC: the firmware never network-boots these VMs, and loading
            // iPXE's EFI driver cost about 3 s of every TCG boot (measured: 28.2 → 25.3 s from
            // power-on to the kernel, same disk).
            .arg("-netdev")
            .arg(format!(
                "user,id=net0,hostfwd=tcp:127.0.0.1:{}-:50000,hostfwd=tcp:127.0.0.1:{}-:8080",
                self.api_port, self.web_port
            ))
            .args(["-device", "virtio-net-pci,netdev=net0,romfile="])
            .args(&tpm_args)
            .stdin(Stdio::piped())
            .stdout(monitor_out)
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting qemu-system-x86_64")?;
        Ok(Running {
            monitor: child.stdin.take(),
            monitor_log,
            child,
            swtpm,
            log,
            started: Instant::now(),
            started_at: std::time::SystemTime::now(),
        })
    }
}

impl Running {
    /// Everything the guest printed so far.
    pub fn serial(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Wait for a line containing any of `expect` (from the start of this boot); `None` if QEMU
    /// exited or `timeout` passed first.
    pub fn wait_for(&mut self, expect: &[&str], timeout: Duration) -> Result<Option<String>> {
        let deadline = Instant::now() + timeout;
        // A match in the console's last, unterminated line may be half a line still being
        // written: it counts once the line is complete, QEMU has ended, or it has stayed
        // unterminated for a while (a firmware message that is never followed by a newline).
        let mut partial_since: Option<Instant> = None;
        loop {
            let ended = self.child.try_wait().context("waiting for QEMU")?.is_some();
            let serial = self.serial();
            let (complete, unterminated) =
                serial.split_at(serial.rfind('\n').map_or(0, |end| end + 1));
            let matches = |line: &&str| expect.iter().any(|e| line.contains(e));
            if let Some(line) = complete.lines().find(matches) {
                return Ok(Some(line.trim().to_string()));
            }
            if matches(&unterminated) {
                let since = *partial_since.get_or_insert_with(Instant::now);
                if ended || since.elapsed() >= UNTERMINATED_LINE_GRACE {
                    return Ok(Some(unterminated.trim().to_string()));
                }
            }
            if ended || Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Like [`Running::wait_for`], failing with the console's tail when nothing matched.
    pub fn expect(&mut self, expect: &[&str], timeout: Duration, what: &str) -> Result<String> {
        match self.wait_for(expect, timeout)? {
            Some(line) => Ok(line),
            None => bail!(
                "{what}: not seen after {:.0?}; {}; console ended with:\n{}",
                self.elapsed(),
                self.guest_cpu_samples(),
                tail(&self.serial(), 40)
            ),
        }
    }

    /// Wait for the guest to end this boot (reboot or power-off) by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!(
            "the guest did not reboot within {timeout:?}; console ended with:\n{}",
            tail(&self.serial(), 30)
        )
    }

    /// Where a guest that went quiet is: its program counter sampled through the monitor, so
    /// a failure says whether the vCPU was idle (`HLT=1`: waiting for something), spinning in
    /// the kernel, in user space, or inside the firmware's runtime services.
    fn guest_cpu_samples(&mut self) -> String {
        if !self.is_running() {
            return "QEMU had exited".to_owned();
        }
        let Some(monitor) = self.monitor.as_mut() else {
            return "no monitor".to_owned();
        };
        let skip = fs::metadata(&self.monitor_log).map_or(0, |m| m.len() as usize);
        for _ in 0..8 {
            if monitor
                .write_all(b"info registers\n")
                .and_then(|()| monitor.flush())
                .is_err()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        std::thread::sleep(Duration::from_millis(300));
        let answers = fs::read(&self.monitor_log).unwrap_or_default();
        let answers = String::from_utf8_lossy(answers.get(skip..).unwrap_or_default());
        let samples: Vec<String> = answers
            .lines()
            .filter_map(|line| {
                let rip = line.split("RIP=").nth(1)?.split_whitespace().next()?;
                let cpl = line
                    .split("CPL=")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next());
                let halted = line.contains("HLT=1");
                Some(format!(
                    "{rip} ({}{})",
                    where_is(u64::from_str_radix(rip, 16).unwrap_or(0), cpl),
                    if halted { ", halted" } else { "" }
                ))
            })
            .collect();
        format!(
            "guest program counter, {} samples 0.3 s apart: {}",
            samples.len(),
            samples.join(", ")
        )
    }

    /// Press the ACPI power button (the monitor's `system_powerdown`): what a host or a cloud
    /// does to ask a guest to shut down. The guest decides what happens next.
    pub fn system_powerdown(&mut self) -> Result<()> {
        let monitor = self.monitor.as_mut().context("QEMU's monitor is closed")?;
        monitor
            .write_all(b"system_powerdown\n")
            .and_then(|()| monitor.flush())
            .context("writing to QEMU's monitor")
    }

    /// Whether this boot's QEMU is still running (the guest has not rebooted, powered off or
    /// been reset).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Pull the plug.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `--terminate` ends swtpm when QEMU's connection closes; this is for a QEMU that
        // never connected.
        if let Some((mut swtpm, socket)) = self.swtpm.take() {
            let _ = swtpm.kill();
            let _ = swtpm.wait();
            let _ = fs::remove_file(socket);
        }
    }
}

/// A boot's swtpm process and its control socket.
type Swtpm = (Child, PathBuf);

/// A path for swtpm's control socket. Not beside the boot's log: a Unix socket's path is at
/// most 107 bytes, and a run of several named scenarios has a long work directory (swtpm
/// refused to listen there). Unique per process and boot; removed when the boot ends.
fn swtpm_socket() -> PathBuf {
    static SOCKETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SOCKETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("slate-swtpm-{}-{n}.sock", std::process::id()))
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
        // Until the guest's last console line (the log's modification time), not until the
        // drop: a scenario may keep a boot's handle long after QEMU exited.
        let ran = fs::metadata(&self.log)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|last| last.duration_since(self.started_at).ok())
            .map_or_else(|| self.started.elapsed(), |d| d.min(self.started.elapsed()));
        BOOTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.log.clone(), ran));
    }
}

/// Which part of an x86-64 Linux guest an instruction address is in: the kernel's text
/// mapping, the window the kernel maps the firmware's runtime services into (`EFI_VA_END` to
/// `EFI_VA_START`), user space, or (before the kernel runs) the firmware's identity map.
fn where_is(rip: u64, cpl: Option<&str>) -> &'static str {
    match rip {
        _ if cpl == Some("3") => "user space",
        0xffff_ffff_8000_0000.. => "kernel text",
        0xffff_ffef_0000_0000..0xffff_ffff_0000_0000 => "EFI runtime services",
        0xffff_8000_0000_0000.. => "kernel, other mapping",
        _ => "firmware or low memory",
    }
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    /// Held together, the two listeners cannot share a port; dropped one by one, the kernel may
    /// hand the same one out twice.
    #[test]
    fn the_two_forwarded_ports_always_differ() {
        for _ in 0..500 {
            let (api, web) = super::free_ports().unwrap();
            assert_ne!(api, web);
        }
    }
}
