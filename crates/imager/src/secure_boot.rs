//! Secure Boot in the imager: the owner's db key read and checked before anything is built,
//! systemd-boot and every UKI signed with it (reproducibly, `slate_secureboot`), and the
//! enrolment files for the ESP. `slate gen secureboot-keys` makes a key set.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use slate_bootloader::sdboot::EnrollKeys;
use slate_esp::SECURE_BOOT_AUTH_FILES;
use slate_profile::SecureBoot;
use slate_secureboot::SigningKey;

use crate::ImagerError;

/// A Secure Boot build's key, certificate and (for disk images) enrolment files.
#[derive(Debug, Clone)]
pub struct SecureBootInputs {
    key: Arc<SigningKey>,
    /// The db certificate (PEM), carried in the root for the node's pre-write check.
    pub cert_pem: Vec<u8>,
    pub enroll: Option<EnrollKeys>,
}

fn bad(reason: impl std::fmt::Display) -> ImagerError {
    ImagerError::BadInput {
        what: "secureboot",
        reason: reason.to_string(),
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ImagerError> {
    crate::read_input(what, path)
}

impl SecureBootInputs {
    /// Read `[secureboot]` (paths relative to `base`): the key must be the certificate's, and
    /// the `db.auth` to enrol must hold that certificate, or the image would enrol keys that
    /// refuse its own boot loader.
    pub fn resolve(base: &Path, profile: &SecureBoot) -> Result<Self, ImagerError> {
        let cert_pem = read("the Secure Boot certificate", &base.join(&profile.cert))?;
        let key_pem = read("the Secure Boot key", &base.join(&profile.key))?;
        let key = SigningKey::from_pem(&key_pem, &cert_pem).map_err(bad)?;
        let enroll = match &profile.enroll {
            None => None,
            Some(dir) => {
                let dir = base.join(dir);
                let [db, kek, pk] = SECURE_BOOT_AUTH_FILES
                    .map(|name| read("a Secure Boot enrolment file", &dir.join(name)));
                let keys = EnrollKeys {
                    pk: pk?,
                    kek: kek?,
                    db: db?,
                };
                let certs = slate_secureboot::certs_from_auth(&keys.db)
                    .map_err(|e| bad(format!("{}/db.auth: {e}", dir.display())))?;
                if !certs.contains(&key.cert_der()) {
                    return Err(bad(format!(
                        "{}/db.auth does not hold the signing certificate {} ({}): the image \
                         would enrol keys that refuse its own boot loader",
                        dir.display(),
                        profile.cert.display(),
                        key.subject()
                    )));
                }
                Some(keys)
            }
        };
        Ok(Self {
            key: Arc::new(key),
            cert_pem,
            enroll,
        })
    }

    /// `image` signed with the db key.
    pub fn sign(&self, what: &str, image: &[u8]) -> Result<Vec<u8>, ImagerError> {
        slate_secureboot::sign_pe(image, &self.key).map_err(|e| bad(format!("signing {what}: {e}")))
    }
}

/// The files `slate gen secureboot-keys` writes, in order.
pub const SECURE_BOOT_KEY_FILES: [&str; 9] = [
    "PK.key", "PK.crt", "KEK.key", "KEK.crt", "db.key", "db.crt", "PK.auth", "KEK.auth", "db.auth",
];

/// Why a key set could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    #[error("{0} exists: keys are never overwritten")]
    Exists(PathBuf),
    #[error("{program} failed: {detail}")]
    Tool { program: String, detail: String },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn run(program: &str, args: &[&str], dir: &Path) -> Result<(), KeygenError> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| KeygenError::Tool {
            program: program.into(),
            detail: format!("{e} (install openssl and efitools)"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(KeygenError::Tool {
            program: format!("{program} {}", args.join(" ")),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Make an owner's Secure Boot key set in `out` (which must not exist): PK, KEK and db RSA-2048
/// keys (0600) with self-signed certificates named `<name> PK|KEK|db`, and the signed
/// enrolment payloads — PK.auth and KEK.auth signed by PK, db.auth by KEK — under one random
/// owner GUID. openssl makes the keys, efitools' cert-to-efi-sig-list and sign-efi-sig-list
/// the `.auth` files (ARCHITECTURE.md says why). Built in a temporary directory beside `out`
/// and renamed, so a failure leaves nothing.
pub fn gen_secureboot_keys(out: &Path, name: &str) -> Result<Vec<PathBuf>, KeygenError> {
    if out.exists() {
        return Err(KeygenError::Exists(out.to_owned()));
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| KeygenError::Io { path, source }
    };
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let temp = tempfile::Builder::new()
        .prefix(".secureboot-keys")
        .tempdir_in(parent)
        .map_err(io(parent))?;
    let dir = temp.path();
    let guid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map_err(io(Path::new("/proc/sys/kernel/random/uuid")))?;
    let guid = guid.trim();
    for var in ["PK", "KEK", "db"] {
        let subject = format!("/CN={name} {var}/");
        run(
            "openssl",
            &[
                "req",
                "-new",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-sha256",
                "-days",
                "3650",
                "-subj",
                &subject,
                "-keyout",
                &format!("{var}.key"),
                "-out",
                &format!("{var}.crt"),
            ],
            dir,
        )?;
        run(
            "cert-to-efi-sig-list",
            &["-g", guid, &format!("{var}.crt"), &format!("{var}.esl")],
            dir,
        )?;
    }
    for (var, signer) in [("PK", "PK"), ("KEK", "PK"), ("db", "KEK")] {
        run(
            "sign-efi-sig-list",
            &[
                "-g",
                guid,
                "-k",
                &format!("{signer}.key"),
                "-c",
                &format!("{signer}.crt"),
                var,
                &format!("{var}.esl"),
                &format!("{var}.auth"),
            ],
            dir,
        )?;
    }
    for var in ["PK", "KEK", "db"] {
        let esl = dir.join(format!("{var}.esl"));
        std::fs::remove_file(&esl).map_err(io(&esl))?;
        let key = dir.join(format!("{var}.key"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).map_err(io(&key))?;
    }
    let kept = temp.keep();
    if let Err(e) = std::fs::rename(&kept, out) {
        let _ = std::fs::remove_dir_all(&kept);
        return Err(io(out)(e));
    }
    Ok(SECURE_BOOT_KEY_FILES.iter().map(|f| out.join(f)).collect())
}
