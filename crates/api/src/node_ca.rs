//! A node's issuing CA: made by `slate gen config` from the fleet CA, one per node, and the
//! only CA key a node holds (its machine configuration's `api.ca_key`). What it can sign is
//! bounded by the certificate itself, and rustls' webpki enforces the bounds on every client:
//!
//! - path length 0: it issues end-entity certificates only;
//! - X.509 name constraints: DNS names permitted are the node's own (name, hostname, extra
//!   names), IP addresses permitted are its static ones, one address each (/32, /128); a node
//!   without one has every IPv4 and IPv6 address excluded. So a stolen node's key makes
//!   serving certificates for that node only, and nothing that any other node or the operator
//!   accepts as a client but the node itself (the operator takes its heartbeats as
//!   [`crate::Role::Node`], for the names in the certificate);
//! - extended key usage serverAuth and clientAuth (webpki applies an intermediate's EKU to the
//!   chain below it).

use std::net::IpAddr;
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CidrSubnet, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, KeyPair,
    KeyUsagePurpose, NameConstraints, PKCS_ECDSA_P256_SHA256,
};

use crate::certs::{load_ca, params, CertError, LONG_VALIDITY};

/// The issuing CA of the node `node` (certificate PEM, key PEM), from the fleet CA
/// `fleet_ca_cert_pem`/`fleet_ca_key_pem`, constrained to `names` (DNS names and IP
/// addresses; the node's name must be among them).
pub fn issue_node_ca(
    fleet_ca_cert_pem: &str,
    fleet_ca_key_pem: &str,
    node: &str,
    names: &[String],
) -> Result<(String, String), CertError> {
    let (fleet_ca, fleet_key) = load_ca(fleet_ca_cert_pem, fleet_ca_key_pem)?;
    if !names.iter().any(|n| n == node) {
        return Err(CertError::InvalidName(node.to_owned()));
    }
    let mut permitted = Vec::new();
    let mut any_ip = false;
    for name in names {
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                any_ip = true;
                let prefix = if ip.is_ipv4() { 32 } else { 128 };
                permitted.push(GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                    ip, prefix,
                )));
            }
            Err(_) => {
                if name.is_empty() || !name.is_ascii() || name.contains(char::is_whitespace) {
                    return Err(CertError::InvalidName(name.clone()));
                }
                permitted.push(GeneralSubtree::DnsName(name.to_ascii_lowercase()));
            }
        }
    }
    let excluded = if any_ip {
        Vec::new()
    } else {
        vec![
            GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])),
            GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])),
        ]
    };
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut p = params(
        &format!("slate node CA {node}"),
        Some("slate"),
        SystemTime::now(),
        LONG_VALIDITY,
    );
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted,
        excluded_subtrees: excluded,
    });
    p.use_authority_key_identifier_extension = true;
    let cert = p.signed_by(&key, &fleet_ca, &fleet_key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// `names` without those the issuing CA `ca_cert_pem` may not certify (all of them when it
/// has no name constraints): a serving certificate with one name outside the constraints
/// would be refused whole.
pub fn permitted_names(ca_cert_pem: &str, names: &[String]) -> Result<Vec<String>, CertError> {
    let ca = slate_machine_config::trust::issuing_ca(ca_cert_pem).map_err(|reason| {
        CertError::Invalid {
            what: "CA certificate".into(),
            reason,
        }
    })?;
    Ok(names
        .iter()
        .filter(|n| ca.constraints.as_ref().is_none_or(|c| c.permits(n)))
        .cloned()
        .collect())
}

/// The trust a node's machine configuration carries (its `[api]` CAs), made from a
/// [`crate::gen_certs`] directory: the node's own issuing CA and key, the client CA (with
/// `extra_client_cas`, PEM, accepted beside it — the old CA while a fleet migrates), and the
/// fleet CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTrust {
    pub ca_cert: String,
    pub ca_key: String,
    pub client_ca: String,
    pub fleet_ca: String,
}

impl NodeTrust {
    /// Issues the node `node`'s CA for `names` (its name among them) from `pki`.
    pub fn issue(
        pki: &std::path::Path,
        node: &str,
        names: &[String],
        extra_client_cas: &[String],
    ) -> Result<NodeTrust, CertError> {
        let read = |name: &str| {
            crate::certs::read_pki_file(pki, name)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        };
        let mut client_ca = read(crate::CLIENT_CA_CERT)?;
        let fleet_ca = read(crate::CA_CERT)?;
        let (ca_cert, ca_key) = issue_node_ca(&fleet_ca, &read(crate::CA_KEY)?, node, names)?;
        for extra in extra_client_cas {
            if !client_ca.ends_with('\n') {
                client_ca.push('\n');
            }
            client_ca.push_str(extra.trim_start());
        }
        Ok(NodeTrust {
            ca_cert,
            ca_key,
            client_ca,
            fleet_ca,
        })
    }
}
