//! `gen_certs` output, and the role taken from a certificate's subject Organization.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use slate_api::{
    gen_certs, CertError, Client, ClientError, Role, ServerConfig, ServerError, CA_CERT,
    CLIENT_CA_CERT, CLIENT_CA_KEY,
};
use x509_parser::extensions::GeneralName;

fn parse(pem: &[u8]) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem).unwrap()
}

#[test]
fn writes_two_cas_the_service_and_role_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let out = gen_certs(dir.path(), &["10.0.0.5".into(), "node-1.lan".into()]).unwrap();
    assert_eq!(out.files.len(), 12);
    assert_eq!(
        out.service_names,
        ["10.0.0.5", "node-1.lan", "localhost", "127.0.0.1", "::1"]
    );
    for file in &out.files {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        let secret = file.extension().unwrap() == "key";
        assert_eq!(
            mode,
            if secret { 0o600 } else { 0o644 },
            "{}",
            file.display()
        );
    }

    let node = parse(&common::read(&dir, "service.crt"));
    let (_, node) = x509_parser::parse_x509_certificate(&node).unwrap();
    let san = node.subject_alternative_name().unwrap().unwrap();
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => d.to_string(),
            GeneralName::IPAddress(ip) => format!("{ip:?}"),
            other => format!("{other}"),
        })
        .collect();
    assert!(names.contains(&"node-1.lan".to_owned()), "{names:?}");
    assert!(names.contains(&"localhost".to_owned()), "{names:?}");
    assert!(names.contains(&"[127, 0, 0, 1]".to_owned()), "{names:?}");
    assert!(names.contains(&"[10, 0, 0, 5]".to_owned()), "{names:?}");
    let eku = node.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);
    // Two CAs: the fleet CA (nodes, services) and the client CA (roles), apart.
    let ca_of = |name: &str| {
        let der = parse(&common::read(&dir, name));
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let bc = cert.basic_constraints().unwrap().unwrap().value.clone();
        (cert.subject().to_string(), bc.ca, bc.path_len_constraint)
    };
    let (fleet, fleet_is_ca, fleet_path) = ca_of(CA_CERT);
    let (client_ca, client_is_ca, client_path) = ca_of(CLIENT_CA_CERT);
    assert!(fleet_is_ca && client_is_ca);
    assert_eq!((fleet_path, client_path), (Some(1), Some(0)));
    assert_ne!(fleet, client_ca);
    assert_eq!(node.issuer().to_string(), fleet);

    for role in Role::ALL {
        let der = parse(&common::read(&dir, &format!("{role}.crt")));
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let orgs: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(orgs, [format!("os:{role}")]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert_eq!(cert.issuer().to_string(), client_ca);
        assert_eq!(
            cert.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        );
    }
}

#[test]
fn refuses_to_overwrite_and_bad_names() {
    let dir = common::certs();
    let ca = common::read(&dir, CA_CERT);
    let err = gen_certs(dir.path(), &[]).unwrap_err();
    assert!(matches!(err, CertError::Exists(_)), "{err}");
    assert_eq!(common::read(&dir, CA_CERT), ca);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let empty = tempfile::tempdir().unwrap();
    let err = gen_certs(empty.path(), &["bad name".into()]).unwrap_err();
    assert!(matches!(err, CertError::InvalidName(_)), "{err}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

#[test]
fn server_refuses_a_key_that_does_not_match() {
    let dir = common::certs();
    let mut config = ServerConfig::from_dir("127.0.0.1:0".parse().unwrap(), dir.path()).unwrap();
    config.key_pem = common::read(&dir, "admin.key");
    let err = slate_api::spawn(config, Arc::new(common::Fake::default())).unwrap_err();
    assert!(matches!(err, ServerError::Config(_)), "{err}");
}

/// A client certificate signed by the client CA whose Organization names no role may do
/// nothing (403), though its handshake succeeds.
#[test]
fn certificate_without_a_role_is_denied_everything() {
    let (dir, server) = common::start(Arc::default());
    let text = |name: &str| String::from_utf8(common::read(&dir, name)).unwrap();
    let ca_key = rcgen::KeyPair::from_pem(&text(CLIENT_CA_KEY)).unwrap();
    // The issuer as gen_certs made it: same name and key, so the signature chains.
    let ca = rcgen::CertificateParams::from_ca_cert_pem(&text(CLIENT_CA_CERT))
        .unwrap()
        .self_signed(&ca_key)
        .unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "stranger");
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "os:root");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = p.signed_by(&key, &ca, &ca_key).unwrap();

    let addr = server.local_addr().to_string();
    let ca_pem = common::read(&dir, CA_CERT);
    let client = Client::new(
        &addr,
        &ca_pem,
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
    )
    .unwrap();
    let err = client.status().unwrap_err();
    assert!(
        matches!(&err, ClientError::PermissionDenied(m) if m.contains("no role")),
        "{err}"
    );
    server.shutdown().unwrap();
}
