//! `[var] mode = "tpm2"` (docs/node.md, "/var modes"; the token: docs/formats.md §15): /var
//! inside a LUKS2 volume on EPHEMERAL whose key is sealed to the machine's TPM 2.0 under a
//! PCR 7 policy. The first boot sets it up (random key sealed, a recovery key slot, the
//! sealed key stored in the header as a token — the commit point); every later boot unseals
//! the key and opens the volume without anyone typing. Whatever cannot be opened is refused,
//! and a refusal has written nothing to the partition.

mod reseal;
pub mod token;
mod tools;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use slate_host::HostError;

pub use reseal::{reseal, Resealed};

use token::{classify, find_token, luks2_label, Found, Token};
use tools::{brief, cryptsetup, Scratch, Tpm, Unseal, PBKDF_ARGS};

/// The device-mapper name of the open volume (`/dev/mapper/slate-var`).
pub const MAPPER_NAME: &str = "slate-var";
/// The TPM resource manager a node's tpm2-tools talk to.
pub const TPM_DEVICE: &str = "/dev/tpmrm0";

#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// /var is neither opened nor formatted, and nothing was written to the partition: the
    /// node waits for its owner (the reason says what is needed).
    #[error("{0}")]
    Refused(String),
}

/// Where and how a node reaches its TPM and tools.
#[derive(Debug, Clone)]
pub struct Setting {
    /// tpm2-tools' TCTI: `device:/dev/tpmrm0` on a node.
    pub tcti: String,
    /// The TPM device that must exist before anything is read (`None`: the TCTI is no device,
    /// as a test's `swtpm:` one).
    pub tpm_device: Option<PathBuf>,
    /// Where tpm2-tools' programs are (`/usr/bin`).
    pub tools_dir: PathBuf,
    /// A private directory for key material on a tmpfs.
    pub scratch: PathBuf,
    /// The device-mapper name to open the volume as.
    pub mapper_name: String,
}

impl Setting {
    /// A node's: the kernel's resource manager, the image's tools, /run.
    pub fn node() -> Self {
        Setting {
            tcti: format!("device:{TPM_DEVICE}"),
            tpm_device: Some(TPM_DEVICE.into()),
            tools_dir: "/usr/bin".into(),
            scratch: "/run/slate/var-crypt".into(),
            mapper_name: MAPPER_NAME.into(),
        }
    }

    fn tpm(&self) -> Tpm<'_> {
        Tpm {
            tcti: &self.tcti,
            tools_dir: &self.tools_dir,
        }
    }

    fn mapper(&self) -> PathBuf {
        Path::new("/dev/mapper").join(&self.mapper_name)
    }
}

/// The volume, open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The device to format or mount (`/dev/mapper/slate-var`).
    pub device: PathBuf,
    /// How it was unlocked, for `slate status`.
    pub how: String,
}

/// The recovery key's console line begins so (the tests read it there).
pub const RECOVERY_LINE: &str = "recovery key for /var";

/// Where the recovery key goes when the volume is set up (the machine configuration's
/// `[var] recovery_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// In the log's line: the console and the journal.
    Log,
    /// Into this file (mode 0600, its directory 0700), written and synced before anything is
    /// written to the partition; not logged.
    File(PathBuf),
    /// No recovery key slot at all.
    None,
}

/// Open EPHEMERAL (`device`) as a `tpm2` /var, setting it up first when it is blank (or its
/// setup was cut short before its token was stored). `log` gets each step, and once the
/// recovery key.
pub fn open(
    device: &Path,
    label: &str,
    setting: &Setting,
    recovery: &Recovery,
    log: &dyn Fn(&str),
) -> Result<Opened, CryptError> {
    let unlocked = unlock(device, label, setting, recovery, log)?;
    open_with(device, setting, unlocked.slot, &unlocked.key).map_err(|e| match e {
        CryptError::Host(HostError::CommandFailed { output, .. })
            if output.contains("No key available") =>
        {
            CryptError::Refused(format!(
                "/var could not be unlocked with this machine's TPM: the key it unsealed does \
                 not open key slot {} ({output}); the recovery key is needed (nothing was \
                 written to {label})",
                unlocked.slot
            ))
        }
        other => other,
    })?;
    Ok(Opened {
        device: setting.mapper(),
        how: unlocked.how,
    })
}

/// The key of a `tpm2` volume, unsealed into a private file (removed when this goes), and
/// the one key slot it opens.
#[derive(Debug)]
pub struct Unlocked {
    _scratch: Scratch,
    key: PathBuf,
    slot: u32,
    how: String,
}

impl Unlocked {
    pub fn key_file(&self) -> &Path {
        &self.key
    }

    pub fn slot(&self) -> u32 {
        self.slot
    }

    pub fn how(&self) -> &str {
        &self.how
    }
}

/// [`open`] up to the key: the volume set up when it is blank (or its setup was cut short),
/// else its key unsealed; nothing activated. Every refusal comes from here.
pub fn unlock(
    device: &Path,
    label: &str,
    setting: &Setting,
    recovery: &Recovery,
    log: &dyn Fn(&str),
) -> Result<Unlocked, CryptError> {
    if let Some(tpm) = &setting.tpm_device {
        if !tpm.exists() {
            return Err(CryptError::Refused(format!(
                "/var mode tpm2 needs a TPM 2.0 and this machine has none ({} does not exist); \
                 nothing was written to {label}",
                tpm.display()
            )));
        }
    }
    let head = read_head(device)?;
    let signature = slate_host::filesystem_signature(&head);
    let luks_label = luks2_label(&head);
    let token = match (signature, &luks_label) {
        (Some("crypto_LUKS"), Some(_)) => {
            let metadata = cryptsetup(&["luksDump", "--dump-json-metadata"], &[device])?;
            // A slate token that does not read is no reason to set the volume up again.
            find_token(&metadata).map_err(|e| {
                CryptError::Refused(format!(
                    "{label}'s LUKS2 header does not read as slate's ({e}): the recovery key is \
                     needed; nothing was written to it"
                ))
            })?
        }
        _ => None,
    };
    match classify(signature, luks_label.as_deref(), token) {
        Found::Blank => {
            log(&format!(
                "{label} ({}) is blank: tpm2: setting up LUKS2 with a key sealed to the TPM \
                 (PCR 7) (first boot)",
                device.display()
            ));
            set_up(device, label, setting, recovery, log)
        }
        Found::SetupInterrupted => {
            log(&format!(
                "{label} ({}): tpm2: a LUKS2 header whose setup was cut short before its token \
                 was stored (nothing was ever formatted inside): setting it up again",
                device.display()
            ));
            set_up(device, label, setting, recovery, log)
        }
        Found::Sealed(slot, token) => unseal(label, setting, slot, &token, log),
        Found::Other(what) => Err(CryptError::Refused(format!(
            "{label} holds {what}: /var mode tpm2 opens only the volume it sealed and sets up \
             only a blank partition; nothing was written to it (`slate reset` wipes it)"
        ))),
    }
}

/// The first `IDENTITY_HEAD_LEN` bytes of `device`.
fn read_head(device: &Path) -> Result<Vec<u8>, CryptError> {
    let mut head = vec![0u8; slate_host::IDENTITY_HEAD_LEN];
    std::fs::File::open(device)
        .and_then(|mut f| f.read_exact(&mut head))
        .map_err(|source| CryptError::Io {
            path: device.to_owned(),
            source,
        })?;
    Ok(head)
}

fn random32() -> Result<[u8; 32], CryptError> {
    let mut bytes = [0u8; 32];
    let path = Path::new("/dev/urandom");
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| CryptError::Io {
            path: path.to_owned(),
            source,
        })?;
    Ok(bytes)
}

/// Seal a fresh key (and check it unseals) and write the recovery key where it goes before
/// the first write to the partition; then LUKS2 with the key in slot 0, the recovery key in
/// slot 1, the recovery key shown (or where it was written said), and last the token.
fn set_up(
    device: &Path,
    label: &str,
    setting: &Setting,
    recovery: &Recovery,
    log: &dyn Fn(&str),
) -> Result<Unlocked, CryptError> {
    let started = Instant::now();
    let scratch = Scratch::new(&setting.scratch)?;
    let key = scratch.write("key", &random32()?)?;
    let (token, unsealed) = seal_checked(setting, &scratch, &key, 0, label)?;
    let recovery_key = match recovery {
        Recovery::None => None,
        _ => Some(token::recovery_key(&random32()?)),
    };
    if let (Recovery::File(path), Some(secret)) = (recovery, &recovery_key) {
        // Before the partition is touched: a STATE that cannot take it refuses the setup
        // with nothing written, and a power cut after this leaves a file the next setup
        // overwrites (its key opens nothing).
        tools::write_secret(path, secret.as_bytes()).map_err(|e| {
            CryptError::Refused(format!(
                "the recovery key could not be written to {} ({e}); nothing was written to \
                 {label}",
                path.display()
            ))
        })?;
    }
    let mut format = vec![
        "luksFormat",
        "--type",
        "luks2",
        "--batch-mode",
        "--label",
        token::SETUP_LABEL,
        "--key-slot",
        "0",
        "--key-file",
    ];
    let key_arg = key.to_string_lossy().into_owned();
    format.push(&key_arg);
    format.extend_from_slice(PBKDF_ARGS);
    cryptsetup(&format, &[device])?;
    if let Some(secret) = &recovery_key {
        let recovery_file = scratch.write("recovery", secret.as_bytes())?;
        add_key(device, &key_arg, RECOVERY_SLOT, &recovery_file)?;
    }
    // Said before the token makes the volume slate's: a power cut after this line starts
    // the setup again (with another key), one before it leaves no volume anyone needs it for.
    match (recovery, &recovery_key) {
        (Recovery::File(path), Some(_)) => log(&format!(
            "{RECOVERY_LINE} ({label}, key slot {RECOVERY_SLOT}) written to {} (root only; \
             STATE is not encrypted — copy it off this machine, then delete it)",
            path.display()
        )),
        (_, Some(secret)) => log(&format!(
            "{RECOVERY_LINE} ({label}, key slot {RECOVERY_SLOT}; shown once — keep it off \
             this machine): {secret}"
        )),
        (_, None) => log(&format!(
            "no {RECOVERY_LINE} ({label}): [var] recovery_key = \"none\" — only this \
             machine's TPM, under this Secure Boot state, opens it"
        )),
    }
    let token_file = scratch.write("token.json", token.to_json().as_bytes())?;
    cryptsetup(&["token", "import", "--json-file"], &[&token_file, device])?;
    cryptsetup(&["config", "--label", token::LABEL], &[device])?;
    log(&format!(
        "{label}: tpm2: LUKS2 set up, key sealed to the TPM (PCR 7) and stored as token \
         {} ({} ms)",
        token::TOKEN_TYPE,
        started.elapsed().as_millis()
    ));
    Ok(Unlocked {
        _scratch: scratch,
        key: unsealed,
        slot: 0,
        how: "TPM (sealed at this boot, PCR 7)".into(),
    })
}

/// Seal `key` (a file in `scratch`) to the TPM under the PCR policy, as the token of
/// `keyslot`, and unseal it again as a check: the token and the unsealed copy. Every failure
/// is a refusal, and comes before anything is written to `label`.
fn seal_checked(
    setting: &Setting,
    scratch: &Scratch,
    key: &Path,
    keyslot: u32,
    label: &str,
) -> Result<(Token, PathBuf), CryptError> {
    let tpm = setting.tpm();
    let sealed = tpm.seal(scratch, key).map_err(|e| {
        let why = match &e {
            CryptError::Host(e) => brief(e),
            other => other.to_string(),
        };
        CryptError::Refused(format!(
            "the TPM did not seal /var's key ({why}); nothing was written to {label}"
        ))
    })?;
    let token = Token::new(keyslot, &sealed.policy, &sealed.public, &sealed.private);
    let unsealed = tpm.unseal(scratch, &token).map_err(|e| {
        CryptError::Refused(format!(
            "the key just sealed did not unseal ({}); nothing was written to {label}",
            unseal_error(&e)
        ))
    })?;
    let wanted = std::fs::read(key).map_err(|source| CryptError::Io {
        path: key.to_owned(),
        source,
    })?;
    if wanted != std::fs::read(&unsealed).unwrap_or_default() {
        return Err(CryptError::Refused(format!(
            "the TPM unsealed another key than it sealed; nothing was written to {label}"
        )));
    }
    Ok((token, unsealed))
}

/// The key slot the recovery key opens.
pub const RECOVERY_SLOT: u32 = 1;

/// `luksAddKey`: `new_key` into `slot`, authorised by the passphrase in `existing`.
fn add_key(device: &Path, existing: &str, slot: u32, new_key: &Path) -> Result<(), CryptError> {
    let slot = slot.to_string();
    let mut add = vec![
        "luksAddKey",
        "--batch-mode",
        "--key-slot",
        &slot,
        "--key-file",
        existing,
    ];
    add.extend_from_slice(PBKDF_ARGS);
    cryptsetup(&add, &[device, new_key])?;
    Ok(())
}

fn unseal_error(e: &Unseal) -> String {
    match e {
        Unseal::Tpm(CryptError::Host(e)) => brief(e),
        Unseal::Tpm(e) => e.to_string(),
        Unseal::Load(e) | Unseal::Policy(e) => brief(e),
    }
}

fn unseal(
    label: &str,
    setting: &Setting,
    slot: u32,
    token: &Token,
    log: &dyn Fn(&str),
) -> Result<Unlocked, CryptError> {
    let started = Instant::now();
    let scratch = Scratch::new(&setting.scratch)?;
    let refused = |why: String| {
        CryptError::Refused(format!(
            "/var could not be unlocked with this machine's TPM: {why}; the recovery key is \
             needed (nothing was written to {label})"
        ))
    };
    let key = setting.tpm().unseal(&scratch, token).map_err(|e| match e {
        Unseal::Load(e) => refused(format!(
            "the sealed key does not load under this TPM's primary key — the disk was sealed \
             by another TPM, or this one was cleared ({})",
            brief(&e)
        )),
        Unseal::Policy(e) => refused(format!(
            "the TPM refused the PCR 7 policy — the Secure Boot state (db, dbx, Secure Boot \
             on or off) differs from when the key was sealed ({})",
            brief(&e)
        )),
        other => refused(format!("the TPM did not answer ({})", unseal_error(&other))),
    })?;
    log(&format!(
        "{label}: unlocked with the TPM (PCR {}, key slot {slot}) in {} ms",
        token
            .pcrs
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(","),
        started.elapsed().as_millis()
    ));
    Ok(Unlocked {
        _scratch: scratch,
        key,
        slot,
        how: format!("TPM (PCR {})", token.pcr_selection()),
    })
}

/// `cryptsetup open` with the key file, on the one slot the token names (the recovery slot is
/// never tried unattended).
fn open_with(device: &Path, setting: &Setting, slot: u32, key: &Path) -> Result<(), CryptError> {
    let slot = slot.to_string();
    let key = key.to_string_lossy().into_owned();
    cryptsetup(
        &[
            "open",
            "--type",
            "luks2",
            "--key-slot",
            &slot,
            "--key-file",
            &key,
        ],
        &[device, Path::new(&setting.mapper_name)],
    )?;
    Ok(())
}

/// Cryptographic erase (`slate reset`): close the open volume and destroy every key slot of
/// a LUKS header on `device` (`cryptsetup erase`), so what it held can never be decrypted
/// again, whatever becomes of the disk. Answers whether there was one.
pub fn erase(device: &Path, setting: &Setting) -> Result<bool, CryptError> {
    let head = read_head(device)?;
    if slate_host::filesystem_signature(&head) != Some("crypto_LUKS") {
        return Ok(false);
    }
    if setting.mapper().exists() {
        cryptsetup(&["close"], &[Path::new(&setting.mapper_name)])?;
    }
    cryptsetup(&["erase", "--batch-mode"], &[device])?;
    Ok(true)
}
