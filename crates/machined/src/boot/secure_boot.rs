//! Secure Boot on a node: the firmware's state for `slate status`, and the pre-write check of
//! an upgrade's UKI against the db certificate the running image carries
//! (`/etc/slate/secureboot/db.pem`, written by the imager for a `[secureboot]` profile). The
//! installer the bundle brings checks again (`--secureboot-db`), but this check is the running
//! version's own: a bundle's installer cannot talk its way past it.

use std::io::Read;
use std::path::Path;

use slate_api::SecureBootStatus;
use slate_bundle::Bundle;
use slate_profile::image_contract::SECURE_BOOT_DB;
use slate_secureboot::TrustedCerts;

/// A UKI larger than this is refused before it is read into memory (the imager's are tens of
/// MiB; an ESP is hundreds).
const UKI_LIMIT: u64 = 1 << 30;

/// The firmware's Secure Boot state, or `None` without UEFI variables.
pub fn status() -> Option<SecureBootStatus> {
    let enabled = slate_host::read_global_u8("SecureBoot")?;
    let setup_mode = slate_host::read_global_u8("SetupMode").unwrap_or(0);
    Some(SecureBootStatus {
        enabled: enabled == 1,
        setup_mode: setup_mode == 1,
        db: match trusted_db() {
            Ok(Some(db)) => db.subjects(),
            _ => Vec::new(),
        },
    })
}

/// The db certificates the running image carries, or `None` for an image built without
/// `[secureboot]`.
pub fn trusted_db() -> Result<Option<TrustedCerts>, String> {
    let path = Path::new(SECURE_BOOT_DB);
    match std::fs::read(path) {
        Ok(pem) => TrustedCerts::from_pem(&pem)
            .map(Some)
            .map_err(|e| format!("{SECURE_BOOT_DB}: {e}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{SECURE_BOOT_DB}: {e}")),
    }
}

/// Refuse the bundle unless its UKI is signed under `db`; the line to log when it is.
pub fn check_bundle_uki(bundle: &Bundle, db: &TrustedCerts) -> Result<String, String> {
    let chain = |e: &dyn std::error::Error| slate_sequencer::error_chain(e);
    let mut blob = bundle
        .open_blob(slate_bundle::UKI_ROLE)
        .map_err(|e| chain(&e))?;
    if blob.size() > UKI_LIMIT {
        return Err(format!(
            "the bundle's UKI is {} bytes, more than {UKI_LIMIT}",
            blob.size()
        ));
    }
    let mut uki = Vec::with_capacity(blob.size() as usize);
    blob.read_to_end(&mut uki)
        .map_err(|e| format!("reading the bundle's UKI: {e}"))?;
    let what = format!(
        "the UKI of {} {}",
        bundle.manifest().name,
        bundle.manifest().version
    );
    let signer = slate_secureboot::verify_pe(&uki, db).map_err(|e| {
        format!(
            "{what} would be refused by this node's Secure Boot firmware (db: {}): {e}",
            db.subjects().join("; ")
        )
    })?;
    Ok(format!(
        "{what} is signed by {}, which this image's Secure Boot db ({}) trusts",
        signer.subject, signer.trusted_by
    ))
}
