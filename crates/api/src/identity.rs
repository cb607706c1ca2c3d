//! A node's own API identity: its private key (made on the node, never leaving it), the
//! serving certificate and the heartbeat client certificate issued from the machine
//! configuration's issuing CA (`node_ca.rs`), and the self-signed certificate of maintenance
//! mode.

use std::time::SystemTime;

use rcgen::{ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::CertificateDer;
use sha2::Digest as _;

use crate::certs::{load_ca, params, san_types, CertError, DAY, LONG_VALIDITY};
use crate::tls::parse_certs;

/// A new ECDSA P-256 private key as PKCS#8 PEM.
pub fn generate_key_pem() -> Result<String, CertError> {
    Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?.serialize_pem())
}

/// The names a serving certificate carries: `names` in order, then `localhost`, `127.0.0.1`
/// and `::1` (for port forwards and local clients), without repeats.
pub fn serving_names(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names
        .iter()
        .map(|n| n.trim().to_owned())
        .chain(["localhost", "127.0.0.1", "::1"].map(String::from))
    {
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// A serverAuth certificate for `key_pem` with `names` as its SANs — those the CA's name
/// constraints permit (`localhost` and the like are dropped under a node's issuing CA) —,
/// issued by the CA `ca_cert_pem`/`ca_key_pem`: the chain (PEM), the certificate then the CA,
/// so that clients holding only the fleet CA can build the path.
pub fn issue_serving_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    key_pem: &str,
    names: &[String],
) -> Result<String, CertError> {
    let (ca, ca_key) = load_ca(ca_cert_pem, ca_key_pem)?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| invalid("node key", e))?;
    let names = crate::permitted_names(ca_cert_pem, names)?;
    if names.is_empty() {
        return Err(CertError::Invalid {
            what: "serving certificate".into(),
            reason: "the CA's name constraints permit none of the node's names".into(),
        });
    }
    let mut leaf = params("slate node", None, SystemTime::now(), LONG_VALIDITY);
    leaf.subject_alt_names = san_types(&names)?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.use_authority_key_identifier_extension = true;
    Ok(chain(&leaf.signed_by(&key, &ca, &ca_key)?, ca_cert_pem))
}

/// The certificate's PEM followed by its issuer's.
fn chain(cert: &rcgen::Certificate, issuer_pem: &str) -> String {
    let mut pem = cert.pem();
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem.push_str(issuer_pem.trim_start());
    pem
}

fn invalid(what: &str, e: rcgen::Error) -> CertError {
    CertError::Invalid {
        what: what.to_owned(),
        reason: e.to_string(),
    }
}

/// The node `node`'s client certificate for `key_pem` (clientAuth, CN and DNS name `node`, no
/// role), issued by its issuing CA `ca_cert_pem`/`ca_key_pem`, valid for `validity`: what the
/// node reports to the rollout operator with. The chain (PEM), the certificate then the CA.
pub fn issue_node_client_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    key_pem: &str,
    node: &str,
    validity: std::time::Duration,
) -> Result<String, CertError> {
    let (ca, ca_key) = load_ca(ca_cert_pem, ca_key_pem)?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| invalid("client key", e))?;
    let mut leaf = params(node, None, SystemTime::now(), validity);
    leaf.subject_alt_names = san_types(&[node.to_owned()])?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.use_authority_key_identifier_extension = true;
    Ok(chain(&leaf.signed_by(&key, &ca, &ca_key)?, ca_cert_pem))
}

/// A self-signed serverAuth certificate for `key_pem` (maintenance mode: the node has no CA yet).
pub fn self_signed_cert(key_pem: &str, names: &[String]) -> Result<String, CertError> {
    let key = KeyPair::from_pem(key_pem).map_err(|e| CertError::Invalid {
        what: "node key".into(),
        reason: e.to_string(),
    })?;
    let now = SystemTime::now();
    let mut p = params("slate node (maintenance)", None, now, DAY * 30);
    p.subject_alt_names = san_types(names)?;
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(p.self_signed(&key)?.pem())
}

/// The SHA-256 of the first certificate's DER, lower-case hex: what `--fingerprint` pins.
pub fn fingerprint(cert_pem: &str) -> Result<String, CertError> {
    let certs: Vec<CertificateDer<'static>> = parse_certs(cert_pem.as_bytes(), "certificate")?;
    Ok(hex::encode(sha2::Sha256::digest(certs[0].as_ref())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_certificate_chains_to_its_ca_and_names_the_node() {
        let dir = tempfile::tempdir().unwrap();
        crate::gen_certs(dir.path(), &[]).unwrap();
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        let key = generate_key_pem().unwrap();
        let names = serving_names(&["node1".into(), "10.0.2.15".into()]);
        assert_eq!(
            names,
            ["node1", "10.0.2.15", "localhost", "127.0.0.1", "::1"]
        );
        let cert = issue_serving_cert(&read("ca.crt"), &read("ca.key"), &key, &names).unwrap();
        let der = parse_certs(cert.as_bytes(), "c").unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        let ca_der = parse_certs(read("ca.crt").as_bytes(), "ca")
            .unwrap()
            .remove(0);
        let (_, ca) = x509_parser::parse_x509_certificate(ca_der.as_ref()).unwrap();
        assert_eq!(parsed.issuer().as_raw(), ca.subject().as_raw());
        let sans = parsed.subject_alternative_name().unwrap().unwrap();
        assert_eq!(sans.value.general_names.len(), 5);
        // Real chain validation is exercised end to end by the server tests.
        assert_eq!(fingerprint(&cert).unwrap().len(), 64);
        assert_ne!(
            fingerprint(&cert).unwrap(),
            fingerprint(&read("ca.crt")).unwrap()
        );
    }
}
