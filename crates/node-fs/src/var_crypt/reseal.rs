//! Re-enrolment (`slate var reseal`; docs/node.md, "/var modes"): after a Secure Boot db, dbx,
//! shim or on/off change PCR 7 differs and the sealed key no longer unseals. The owner's
//! recovery key authorises a fresh key, sealed to the TPM's current PCR 7, in a new key slot;
//! the token is replaced in one header write, and only then is the old key slot destroyed. A
//! power cut at any step leaves a volume the recovery key opens and a token whose slot exists
//! (the old one — the next reseal first destroys the slot the cut one left — or the new one).

use std::path::Path;

use super::token::{self, classify, find_token, key_slots, luks2_label, plan_reseal, Found};
use super::tools::{brief, cryptsetup, Scratch};
use super::{add_key, random32, read_head, seal_checked, CryptError, Setting, RECOVERY_SLOT};

/// What a reseal did, or would do (`dry_run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resealed {
    /// The key slot the old token named (destroyed).
    pub old_slot: u32,
    /// The key slot of the key sealed to the current PCR 7.
    pub new_slot: u32,
    /// Key slots a reseal cut short had left, neither the token's nor the recovery key's
    /// (destroyed first).
    pub leftovers: Vec<u32>,
    /// Nothing was written.
    pub dry_run: bool,
}

/// Reseal the `tpm2` volume on `device` to this TPM's current PCR 7 with `recovery_key` (key
/// slot 1's passphrase as it was printed or written at setup; surrounding whitespace is
/// ignored). Every check — slate's volume with a recovery slot, the recovery key opens it, the
/// TPM seals and unseals — comes before the first write; `dry_run` stops there.
pub fn reseal(
    device: &Path,
    label: &str,
    setting: &Setting,
    recovery_key: &[u8],
    dry_run: bool,
    log: &dyn Fn(&str),
) -> Result<Resealed, CryptError> {
    let refused =
        |why: String| CryptError::Refused(format!("{label}: {why}; nothing was written to it"));
    let head = read_head(device)?;
    let signature = slate_host::filesystem_signature(&head);
    if signature != Some("crypto_LUKS") {
        return Err(refused(format!(
            "holds {}, not slate's tpm2 volume: nothing to reseal",
            signature.unwrap_or("nothing")
        )));
    }
    let metadata = cryptsetup(&["luksDump", "--dump-json-metadata"], &[device])?;
    let found = find_token(&metadata).map_err(|e| refused(e.to_string()))?;
    let token_id = found.as_ref().map_or(0, |(id, _)| *id);
    let (old_slot, old) = match classify(signature, luks2_label(&head).as_deref(), found) {
        Found::Sealed(slot, token) => (slot, token),
        Found::SetupInterrupted => {
            return Err(refused(
                "its setup was cut short (the next boot sets it up again): nothing to reseal"
                    .into(),
            ))
        }
        Found::Other(what) => return Err(refused(format!("holds {what}: nothing to reseal"))),
        Found::Blank => return Err(refused("is blank: nothing to reseal".into())),
    };
    let used = key_slots(&metadata).map_err(|e| refused(e.to_string()))?;
    let plan = plan_reseal(&used, old_slot, RECOVERY_SLOT).map_err(refused)?;

    let scratch = Scratch::new(&setting.scratch)?;
    let secret = String::from_utf8_lossy(recovery_key).trim().to_owned();
    let recovery_file = scratch.write("recovery", secret.as_bytes())?;
    let recovery = recovery_file.to_string_lossy().into_owned();
    let slot = RECOVERY_SLOT.to_string();
    cryptsetup(
        &[
            "open",
            "--test-passphrase",
            "--key-slot",
            &slot,
            "--key-file",
            &recovery,
        ],
        &[device],
    )
    .map_err(|e| {
        refused(format!(
            "the recovery key does not open key slot {RECOVERY_SLOT} ({})",
            brief(&e)
        ))
    })?;
    let key = scratch.write("key", &random32()?)?;
    let (token, _) = seal_checked(setting, &scratch, &key, plan.new_slot, label)?;
    let leftovers = match plan.leftovers.as_slice() {
        [] => String::new(),
        slots => format!(" (and key slots {slots:?}, which a reseal cut short had left)"),
    };
    let resealed = Resealed {
        old_slot,
        new_slot: plan.new_slot,
        leftovers: plan.leftovers.clone(),
        dry_run,
    };
    if dry_run {
        log(&format!(
            "{label}: would reseal to the TPM's current PCR {}: a new key in key slot {} \
             (authorised by the recovery key), token {} {token_id} replaced, key slot \
             {old_slot} destroyed{leftovers}; nothing was written",
            old.pcr_selection(),
            plan.new_slot,
            token::TOKEN_TYPE,
        ));
        return Ok(resealed);
    }
    for slot in &plan.leftovers {
        kill_slot(device, *slot, &recovery)?;
    }
    add_key(device, &recovery, plan.new_slot, &key)?;
    let token_file = scratch.write("token.json", token.to_json().as_bytes())?;
    let id = token_id.to_string();
    // One header write moves the token from the old slot to the new: LUKS2 writes both header
    // copies under a sequence number, so a cut leaves the one token or the other.
    cryptsetup(
        &[
            "token",
            "import",
            "--token-id",
            &id,
            "--token-replace",
            "--json-file",
        ],
        &[&token_file, device],
    )?;
    kill_slot(device, old_slot, &recovery)?;
    log(&format!(
        "{label}: resealed to the TPM's current PCR {}: key slot {} (token {} {token_id}), key \
         slot {old_slot} destroyed{leftovers}",
        token.pcr_selection(),
        plan.new_slot,
        token::TOKEN_TYPE,
    ));
    Ok(resealed)
}

/// `luksKillSlot`, authorised by the recovery key (`recovery`: the file holding it).
fn kill_slot(device: &Path, slot: u32, recovery: &str) -> Result<(), CryptError> {
    let slot = slot.to_string();
    cryptsetup(
        &["luksKillSlot", "--batch-mode", "--key-file", recovery],
        &[device, Path::new(&slot)],
    )?;
    Ok(())
}
