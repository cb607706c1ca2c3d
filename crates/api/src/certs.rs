//! `slate gen certs`: the CA, the node's server certificate and one client certificate per role
//! (ECDSA P-256), the role carried as the subject Organization `os:<role>` as in Talos.

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

/// The CA certificate, given to the node and to every client.
pub const CA_CERT: &str = "ca.crt";
/// The CA key: keep it off nodes; it signs new client certificates.
pub const CA_KEY: &str = "ca.key";
/// The node's server certificate (serverAuth), carried by the image.
pub const NODE_CERT: &str = "node.crt";
/// The node's key, carried by the image.
pub const NODE_KEY: &str = "node.key";

/// The client certificate file of a role: `admin.crt`, `operator.crt`, `reader.crt`.
pub fn client_cert_file(role: Role) -> String {
    format!("{}.crt", role.as_str())
}

/// The client key file of a role: `admin.key`, …
pub fn client_key_file(role: Role) -> String {
    format!("{}.key", role.as_str())
}

pub(crate) const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// CA and node certificates.
pub(crate) const LONG_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// Client certificates.
const CLIENT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Errors of certificate generation and of reading certificates and keys.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} already exists; refusing to overwrite certificates (remove the old set first)")]
    Exists(PathBuf),
    #[error("invalid name {0:?} for the node certificate")]
    InvalidName(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },
}

/// What [`gen_certs`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedCerts {
    /// Every file written, in `dir`.
    pub files: Vec<PathBuf>,
    /// The node certificate's subject alternative names.
    pub node_names: Vec<String>,
}

/// Writes `ca.crt`/`ca.key`, `node.crt`/`node.key` (serverAuth; SANs: `node_names` — DNS
/// names or IP addresses — plus `localhost`, `127.0.0.1` and `::1`) and `admin`, `operator`,
/// `reader` `.crt`/`.key` (clientAuth, `O=os:<role>`) into `dir` (created if missing).
///
/// Refuses to overwrite: if any of the files exists nothing is written. Files are written
/// under temporary names and renamed into place; keys are mode 0600.
pub fn gen_certs(dir: &Path, node_names: &[String]) -> Result<GeneratedCerts, CertError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CertError::Io { path, source }
    };
    let mut names: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for name in node_names
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
    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut ca = params("slate CA", Some("slate"), now, LONG_VALIDITY);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    files.push((CA_CERT.into(), ca_cert.pem(), false));
    files.push((CA_KEY.into(), ca_key.serialize_pem(), true));

    let mut node = params("slate node", None, now, LONG_VALIDITY);
    node.subject_alt_names = san_types(&names)?;
    node.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let (cert, key) = leaf(node, &ca_cert, &ca_key)?;
    files.push((NODE_CERT.into(), cert, false));
    files.push((NODE_KEY.into(), key, true));

    for role in [Role::Admin, Role::Operator, Role::Reader] {
        let mut client = params(
            role.as_str(),
            Some(role.organization()),
            now,
            CLIENT_VALIDITY,
        );
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let (cert, key) = leaf(client, &ca_cert, &ca_key)?;
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
        node_names: names,
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
