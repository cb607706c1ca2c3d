//! `slate gen certs`: the fleet's two CAs and the certificates made from them (ECDSA P-256),
//! the role carried as the subject Organization `os:<role>` as in Talos.
//!
//! Two CAs, so that no node holds a key anyone else trusts (docs/trust.md, "Node identity"):
//! the **client CA** signs the admin, operator and reader certificates every node accepts; the
//! **fleet CA** vouches for nodes (through one name-constrained issuing CA per node, made by
//! `slate gen config`, [`crate::issue_node_ca`]) and for the fleet's services. Both keys stay
//! with the fleet's administrators; a node's configuration carries only its own issuing CA.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};

use crate::types::Role;

/// The fleet CA's certificate: clients verify nodes and the fleet's services against it.
pub const CA_CERT: &str = "ca.crt";
/// The fleet CA's key: keep it off nodes; `slate gen config` issues each node's CA with it.
pub const CA_KEY: &str = "ca.key";
/// The client CA's certificate: every node's `api.client_ca`.
pub const CLIENT_CA_CERT: &str = "client-ca.crt";
/// The client CA's key: keep it off nodes; it signs new client certificates.
pub const CLIENT_CA_KEY: &str = "client-ca.key";
/// The serving certificate of the fleet's services (the rollout operator, a FleetLock server
/// with TLS, the simulated fleet), issued by the fleet CA.
pub const SERVICE_CERT: &str = "service.crt";
/// Its key.
pub const SERVICE_KEY: &str = "service.key";

/// The client certificate file of a role: `admin.crt`, `operator.crt`, `reader.crt`.
pub fn client_cert_file(role: Role) -> String {
    format!("{}.crt", role.as_str())
}

/// The client key file of a role: `admin.key`, …
pub fn client_key_file(role: Role) -> String {
    format!("{}.key", role.as_str())
}

/// A PEM file is a few KiB; a bigger one is not a certificate or key.
pub(crate) const MAX_PEM_BYTES: u64 = 1 << 20;

/// A certificate or key file: a regular file within [`MAX_PEM_BYTES`], a FIFO or a device
/// refused by name rather than waited on (issue 44).
pub(crate) fn read_pem(path: &Path) -> std::io::Result<Vec<u8>> {
    slate_files::read_file_bounded(path, MAX_PEM_BYTES, "the certificate file")
        .map_err(slate_files::FileError::into_io)
}

/// Reads `name` from a certificate directory; a directory of the older shared-CA shape (no
/// `client-ca.crt`) is named as such.
pub(crate) fn read_pki_file(dir: &Path, name: &str) -> Result<Vec<u8>, CertError> {
    let path = dir.join(name);
    read_pem(&path).map_err(|source| {
        if name == CLIENT_CA_CERT
            && source.kind() == std::io::ErrorKind::NotFound
            && dir.join(CA_CERT).exists()
        {
            CertError::SharedCa(dir.to_owned())
        } else {
            CertError::Io {
                path,
                cause: source,
            }
        }
    })
}

pub(crate) const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// CA and node certificates.
pub(crate) const LONG_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// Client certificates.
const CLIENT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Errors of certificate generation and of reading certificates and keys.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The cause is in the message and not a `source()`, so a chain printer says it once.
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{0} already exists; refusing to overwrite certificates (remove the old set first)")]
    Exists(PathBuf),
    #[error("invalid name {0:?} for the node certificate")]
    InvalidName(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error(
        "{0} holds one CA for nodes and clients (made by an older `slate gen certs`): a node \
         configured from it could make admin certificates; make a new directory with `slate gen \
         certs --out NEW` (docs/trust.md, \"Migrating from a shared CA\")"
    )]
    SharedCa(PathBuf),
}

/// What [`gen_certs`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedCerts {
    /// Every file written, in `dir`.
    pub files: Vec<PathBuf>,
    /// The service certificate's subject alternative names.
    pub service_names: Vec<String>,
}

/// Writes into `dir` (created if missing): the fleet CA `ca.crt`/`ca.key` (path length 1: it
/// issues each node's CA), the client CA `client-ca.crt`/`client-ca.key` (path length 0), the
/// services' `service.crt`/`service.key` (serverAuth, from the fleet CA; SANs: `service_names`
/// — DNS names or IP addresses — plus `localhost`, `127.0.0.1` and `::1`) and `admin`,
/// `operator`, `reader` `.crt`/`.key` (clientAuth, `O=os:<role>`, from the client CA).
///
/// Refuses to overwrite: if any of the files exists nothing is written. Files are written
/// under temporary names and renamed into place; keys are mode 0600.
pub fn gen_certs(dir: &Path, service_names: &[String]) -> Result<GeneratedCerts, CertError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CertError::Io {
            path,
            cause: source,
        }
    };
    let mut names: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for name in service_names
        .iter()
        .map(|n| n.trim().to_owned())
        .chain(["localhost", "127.0.0.1", "::1"].map(String::from))
    {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(CertError::InvalidName(name));
        }
        if seen.insert(name.clone()) {
            names.push(name);
        }
    }

    let mut files: Vec<(String, String, bool)> = Vec::new(); // (name, contents, secret)
    let now = SystemTime::now();
    let (fleet_ca, fleet_key) = root_ca("slate fleet CA", 1, now)?;
    files.push((CA_CERT.into(), fleet_ca.pem(), false));
    files.push((CA_KEY.into(), fleet_key.serialize_pem(), true));
    let (client_ca, client_key) = root_ca("slate client CA", 0, now)?;
    files.push((CLIENT_CA_CERT.into(), client_ca.pem(), false));
    files.push((CLIENT_CA_KEY.into(), client_key.serialize_pem(), true));

    let mut service = params("slate service", None, now, LONG_VALIDITY);
    service.subject_alt_names = san_types(&names)?;
    service.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let (cert, key) = leaf(service, &fleet_ca, &fleet_key)?;
    files.push((SERVICE_CERT.into(), cert, false));
    files.push((SERVICE_KEY.into(), key, true));

    for role in Role::ALL {
        let mut client = params(
            role.as_str(),
            Some(role.organization()),
            now,
            CLIENT_VALIDITY,
        );
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let (cert, key) = leaf(client, &client_ca, &client_key)?;
        files.push((client_cert_file(role), cert, false));
        files.push((client_key_file(role), key, true));
    }

    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (name, _, _) in &files {
        let path = dir.join(name);
        if path.symlink_metadata().is_ok() {
            return Err(CertError::Exists(path));
        }
    }
    let mut temps = Vec::new();
    let result: Result<(), CertError> = (|| {
        for (name, contents, secret) in &files {
            let tmp = dir.join(format!(".{name}.tmp"));
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            opts.mode(if *secret { 0o600 } else { 0o644 });
            let mut f = opts.open(&tmp).map_err(io(&tmp))?;
            temps.push(tmp.clone());
            f.write_all(contents.as_bytes()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        for (name, _, _) in &files {
            let (tmp, path) = (dir.join(format!(".{name}.tmp")), dir.join(name));
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
        }
        Ok(())
    })();
    if result.is_err() {
        for tmp in &temps {
            let _ = std::fs::remove_file(tmp);
        }
    }
    result?;
    Ok(GeneratedCerts {
        files: files.iter().map(|(n, _, _)| dir.join(n)).collect(),
        service_names: names,
    })
}

/// Subject alternative names: IP addresses as such, anything else as a DNS name.
pub(crate) fn san_types(names: &[String]) -> Result<Vec<SanType>, CertError> {
    names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n
                .as_str()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|_| CertError::InvalidName(n.clone())),
        })
        .collect()
}

pub(crate) fn params(
    cn: &str,
    org: Option<&str>,
    now: SystemTime,
    validity: Duration,
) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(org) = org {
        dn.push(DnType::OrganizationName, org);
    }
    p.distinguished_name = dn;
    // A day of slack for clocks that are behind (a VM's RTC, a node before NTP).
    p.not_before = (now - DAY).into();
    p.not_after = (now + validity).into();
    p
}

/// A self-signed CA allowing `path_len` CAs below it.
fn root_ca(cn: &str, path_len: u8, now: SystemTime) -> Result<(Certificate, KeyPair), CertError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut ca = params(cn, Some("slate"), now, LONG_VALIDITY);
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(path_len));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok((ca.self_signed(&key)?, key))
}

fn leaf(
    mut p: CertificateParams,
    ca_cert: &Certificate,
    ca_key: &KeyPair,
) -> Result<(String, String), CertError> {
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let cert = p.signed_by(&key, ca_cert, ca_key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A clientAuth certificate with `role` (`O=os:<role>`) and `common_name` for `key_pem`,
/// issued by the client CA `client_ca_pem`/`client_ca_key_pem`, valid for `validity`: how
/// whoever holds the client CA's key (the fleet's administrators, never a node) gives a
/// person or a program a role.
pub fn issue_client_cert(
    client_ca_pem: &str,
    client_ca_key_pem: &str,
    key_pem: &str,
    role: Role,
    common_name: &str,
    validity: Duration,
) -> Result<String, CertError> {
    let (ca, ca_key) = load_ca(client_ca_pem, client_ca_key_pem)?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| CertError::Invalid {
        what: "client key".into(),
        reason: e.to_string(),
    })?;
    let mut p = params(
        common_name,
        Some(role.organization()),
        SystemTime::now(),
        validity,
    );
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    Ok(p.signed_by(&key, &ca, &ca_key)?.pem())
}

/// The CA as an issuer rcgen can sign with: same subject and key as the CA certificate.
pub(crate) fn load_ca(
    ca_cert_pem: &str,
    ca_key_pem: &str,
) -> Result<(Certificate, KeyPair), CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| rcgen_invalid("CA key", e))?;
    let ca = CertificateParams::from_ca_cert_pem(ca_cert_pem)
        .map_err(|e| rcgen_invalid("CA certificate", e))?
        .self_signed(&ca_key)?;
    Ok((ca, ca_key))
}

fn rcgen_invalid(what: &str, e: rcgen::Error) -> CertError {
    CertError::Invalid {
        what: what.to_owned(),
        reason: e.to_string(),
    }
}
