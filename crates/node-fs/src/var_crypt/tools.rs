//! The programs a `tpm2` /var runs: tpm2-tools to seal and unseal (over the kernel's resource
//! manager, `/dev/tpmrm0`) and Debian's cryptsetup for LUKS2. Secrets travel in files of a
//! private directory on /run (a tmpfs: RAM), never on a command line, and are overwritten
//! before the directory goes.

use std::fs;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_host::HostError;
use slate_profile::image_contract::CRYPTSETUP;

use super::token::{Token, PCRS, PCR_BANK};
use super::CryptError;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CryptError + '_ {
    move |source| CryptError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The primary key the sealed object lives under: the owner hierarchy's ECC P-256 key of
/// tpm2-tools' default template, made again (the same key) from the TPM's owner seed at every
/// unseal. Another TPM (another seed) makes another key, under which the object does not load.
const PRIMARY_ALG: &str = "ecc";
/// A sealed object only the PCR policy can unseal (no `userwithauth`), not subject to the
/// TPM's dictionary-attack lockout (a failed policy is no guess).
const SEALED_ATTRIBUTES: &str = "fixedtpm|fixedparent|adminwithpolicy|noda";

/// A private directory for key material on /run, removed (files overwritten first) on drop.
#[derive(Debug)]
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub fn new(dir: &Path) -> Result<Self, CryptError> {
        if dir.exists() {
            wipe_dir(dir);
        }
        fs::create_dir_all(dir).map_err(io(dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        Ok(Scratch {
            dir: dir.to_owned(),
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Write `bytes` to a new file readable by root alone.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, CryptError> {
        let path = self.path(name);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io(&path))?;
        std::io::Write::write_all(&mut file, bytes).map_err(io(&path))?;
        Ok(path)
    }

    pub fn read(&self, name: &str) -> Result<Vec<u8>, CryptError> {
        let path = self.path(name);
        fs::read(&path).map_err(io(&path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        wipe_dir(&self.dir);
    }
}

/// `bytes` into `path` durably and readable by root alone: its directory made 0700, a
/// temporary file (0600) written and synced, renamed over `path`, the directory synced — a
/// power cut leaves the old file or the new one, never a torn key.
pub fn write_secret(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.new"));
    let _ = fs::remove_file(&temp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, path)?;
    fs::File::open(dir)?.sync_all()
}

/// Overwrite every file in `dir` with zeros, then remove it all.
fn wipe_dir(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if let Ok(len) = fs::metadata(&path).map(|m| m.len()) {
                let _ = fs::write(&path, vec![0u8; len as usize]);
            }
        }
    }
    let _ = fs::remove_dir_all(dir);
}

/// tpm2-tools over one TPM (`tcti`: `device:/dev/tpmrm0` on a node; a test passes
/// `swtpm:port=…`).
pub struct Tpm<'a> {
    pub tcti: &'a str,
    pub tools_dir: &'a Path,
}

impl Tpm<'_> {
    fn command(&self, tool: &str) -> Command {
        let mut cmd = Command::new(self.tools_dir.join(tool));
        cmd.env("TPM2TOOLS_TCTI", self.tcti);
        cmd
    }

    /// Run a tool. The kernel's resource manager flushes what a tool left loaded when its
    /// connection closes; a TPM reached without one (a test's swtpm) keeps it and runs out of
    /// object and session slots after three, so there slate flushes transient objects and
    /// sessions itself (a failed policy session stays loaded).
    fn run(&self, mut cmd: Command) -> Result<(), HostError> {
        let result = slate_host::run_command(&mut cmd).map(drop);
        if !self.tcti.starts_with("device:/dev/tpmrm") {
            for kind in ["-t", "-l", "-s"] {
                let mut flush = self.command("tpm2_flushcontext");
                let _ = slate_host::run_command(flush.arg(kind));
            }
        }
        result
    }

    /// The owner hierarchy's primary key, into `primary.ctx`.
    fn primary(&self, s: &Scratch) -> Result<PathBuf, CryptError> {
        let ctx = s.path("primary.ctx");
        let mut cmd = self.command("tpm2_createprimary");
        cmd.args(["-Q", "-C", "o", "-g", "sha256", "-G", PRIMARY_ALG, "-c"])
            .arg(&ctx);
        self.run(cmd)?;
        Ok(ctx)
    }

    /// Seal `key` (a file in `s`) under the PCR policy: the policy digest and the sealed
    /// object's public and private halves.
    pub fn seal(&self, s: &Scratch, key: &Path) -> Result<Sealed, CryptError> {
        let primary = self.primary(s)?;
        let policy = s.path("policy.digest");
        let selection = pcr_selection();
        let mut cmd = self.command("tpm2_createpolicy");
        cmd.args(["-Q", "--policy-pcr", "-l", &selection, "-L"])
            .arg(&policy);
        self.run(cmd)?;
        let (public, private) = (s.path("sealed.pub"), s.path("sealed.priv"));
        let mut cmd = self.command("tpm2_create");
        cmd.args(["-Q", "-g", "sha256", "-a", SEALED_ATTRIBUTES, "-C"])
            .arg(&primary)
            .arg("-L")
            .arg(&policy)
            .arg("-i")
            .arg(key)
            .arg("-u")
            .arg(&public)
            .arg("-r")
            .arg(&private);
        self.run(cmd)?;
        Ok(Sealed {
            policy: s.read("policy.digest")?,
            public: s.read("sealed.pub")?,
            private: s.read("sealed.priv")?,
        })
    }

    /// The sealed key of `token`, unsealed into a file of `s`. Which step failed says why:
    /// the object does not load under this TPM's primary key (another TPM, or its owner seed
    /// was cleared), or the PCR policy does not hold (the Secure Boot state changed).
    pub fn unseal(&self, s: &Scratch, token: &Token) -> Result<PathBuf, Unseal> {
        let primary = self.primary(s).map_err(Unseal::Tpm)?;
        let (public, private) = token.blobs();
        let public = s.write("sealed.pub", &public).map_err(Unseal::Tpm)?;
        let private = s.write("sealed.priv", &private).map_err(Unseal::Tpm)?;
        let object = s.path("sealed.ctx");
        let mut cmd = self.command("tpm2_load");
        cmd.arg("-Q")
            .arg("-C")
            .arg(&primary)
            .arg("-u")
            .arg(&public)
            .arg("-r")
            .arg(&private)
            .arg("-c")
            .arg(&object);
        self.run(cmd).map_err(Unseal::Load)?;
        let key = s.path("unsealed");
        let mut cmd = self.command("tpm2_unseal");
        cmd.arg("-c")
            .arg(&object)
            .arg("-p")
            .arg(format!("pcr:{}", token.pcr_selection()))
            .arg("-o")
            .arg(&key);
        self.run(cmd).map_err(Unseal::Policy)?;
        Ok(key)
    }
}

/// `sha256:7`.
fn pcr_selection() -> String {
    let list: Vec<String> = PCRS.iter().map(u8::to_string).collect();
    format!("{PCR_BANK}:{}", list.join(","))
}

/// What sealing made.
pub struct Sealed {
    pub policy: Vec<u8>,
    pub public: Vec<u8>,
    pub private: Vec<u8>,
}

/// Why a key did not unseal.
#[derive(Debug)]
pub enum Unseal {
    /// The TPM did not answer as a TPM (no primary key), or the scratch files failed.
    Tpm(CryptError),
    /// The sealed object does not load: another TPM, or this one's owner seed was cleared.
    Load(HostError),
    /// The PCR policy failed: the Secure Boot state differs from when it was sealed.
    Policy(HostError),
}

/// A tool's failure in one line for the console: tpm2-tools print the TSS's trace before the
/// one line that says what the TPM answered (`ERROR: Esys_Load(0x1DF) - tpm:parameter(1):
/// integrity check failed`); that line, after the program's name.
pub fn brief(err: &HostError) -> String {
    match err {
        HostError::CommandFailed {
            program, output, ..
        } => {
            let lines: Vec<&str> = output.lines().map(str::trim).collect();
            let said = lines
                .iter()
                .find(|l| l.starts_with("ERROR: ") && !l.contains("Unable to run"))
                .or(lines.iter().find(|l| !l.is_empty()))
                .copied()
                .unwrap_or("no output");
            let name = program.rsplit('/').next().unwrap_or(program);
            format!("{name}: {said}")
        }
        other => other.to_string(),
    }
}

/// `cryptsetup` with the arguments; its failure carries its output.
pub fn cryptsetup(args: &[&str], paths: &[&Path]) -> Result<String, HostError> {
    let mut cmd = Command::new(CRYPTSETUP);
    cmd.args(args).args(paths);
    // No udev on slate's own OS: libdevmapper makes the /dev/mapper node itself.
    cmd.env("DM_DISABLE_UDEV", "1");
    let out = slate_host::run_command(&mut cmd)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A LUKS2 key slot's key derivation: PBKDF2 at its minimum. Both keys are 256 random bits
/// (the sealed key and the recovery key), so stretching adds nothing against a guess, and
/// Argon2's default of up to 1 GiB would not fit a small node at boot.
pub const PBKDF_ARGS: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_failure_is_the_line_that_says_what_the_tpm_answered() {
        let failed = HostError::CommandFailed {
            program: "/usr/bin/tpm2_load".into(),
            status: "exit status: 1".into(),
            output: "WARNING:esys:src/tss2-esys/api/Esys_Load.c:324:Esys_Load_Finish() Received \
                     TPM Error\nERROR:esys:src/tss2-esys/api/Esys_Load.c:112:Esys_Load() Esys \
                     Finish ErrorCode (0x000001df)\nERROR: Esys_Load(0x1DF) - \
                     tpm:parameter(1):integrity check failed\nERROR: Unable to run \
                     /usr/bin/tpm2_load"
                .into(),
        };
        assert_eq!(
            brief(&failed),
            "tpm2_load: ERROR: Esys_Load(0x1DF) - tpm:parameter(1):integrity check failed"
        );
    }
}
