//! Whether a configuration's API trust may sit on a node's disk (docs/trust.md, "Node
//! identity"). STATE is not encrypted: whatever key a configuration holds, an attacker with
//! the disk holds too. So the key (`api.ca_key`) must sign nothing another party trusts
//! beyond this node's own names:
//!
//! - its certificate (`api.ca_cert`) is not one of `api.client_ca`'s certificates and is not
//!   issued by one of them (else it makes client certificates, admin included, that every node
//!   sharing that `client_ca` accepts);
//! - it is an issuing CA constrained to this node: path length 0 and X.509 name constraints
//!   with permitted DNS subtrees and every IP address constrained (permitted subtrees, or all of
//!   0.0.0.0/0 and ::/0 excluded), so the serving certificates it can make are good for this
//!   node's names only. Clients (rustls' webpki) enforce the constraints.
//!
//! [`parse`](crate::parse) accepts the older shape (one CA for everything), so a node running
//! one still boots; [`check_trust`] is what every writer of a configuration adds (`slate
//! config validate`, the installer, `apply-config`), and [`trust_findings`] what a running
//! node reports in its status.

use std::net::IpAddr;

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

use crate::{ConfigError, MachineConfig};

/// How to make a configuration of the safe shape, appended to every refusal.
pub const HOW_TO_FIX: &str = "make a separate client CA and per-node issuing CAs with `slate gen \
     certs --out NEW` and `slate gen config --pki NEW` (docs/trust.md, \"Migrating from a shared \
     CA\")";

/// The name constraints of an issuing CA, as the serving certificates it issues must obey.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameConstraints {
    pub permitted_dns: Vec<String>,
    pub excluded_dns: Vec<String>,
    pub permitted_ip: Vec<(IpAddr, IpAddr)>,
    pub excluded_ip: Vec<(IpAddr, IpAddr)>,
}

impl NameConstraints {
    /// Whether a certificate naming `name` (a DNS name or an IP address) satisfies these
    /// constraints (RFC 5280 §4.2.1.10: a type with permitted subtrees must match one; none may
    /// match an excluded one).
    pub fn permits(&self, name: &str) -> bool {
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                let permitted_of_family: Vec<_> = self
                    .permitted_ip
                    .iter()
                    .filter(|(net, _)| net.is_ipv4() == ip.is_ipv4())
                    .collect();
                (self.permitted_ip.is_empty()
                    || permitted_of_family.iter().any(|s| in_subnet(ip, s)))
                    && !self.excluded_ip.iter().any(|s| in_subnet(ip, s))
            }
            Err(_) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                (self.permitted_dns.is_empty()
                    || self.permitted_dns.iter().any(|c| dns_within(&name, c)))
                    && !self.excluded_dns.iter().any(|c| dns_within(&name, c))
            }
        }
    }

    /// Every IP address is constrained: some permitted, or both families wholly excluded.
    fn constrains_every_ip(&self) -> bool {
        let excludes_all = |v4: bool| {
            self.excluded_ip
                .iter()
                .any(|(net, mask)| net.is_ipv4() == v4 && mask_bits(*mask) == 0)
        };
        !self.permitted_ip.is_empty() || (excludes_all(true) && excludes_all(false))
    }
}

fn mask_bits(mask: IpAddr) -> u32 {
    match mask {
        IpAddr::V4(m) => u32::from(m).count_ones(),
        IpAddr::V6(m) => u128::from(m).count_ones(),
    }
}

fn in_subnet(ip: IpAddr, (net, mask): &(IpAddr, IpAddr)) -> bool {
    match (ip, net, mask) {
        (IpAddr::V4(ip), IpAddr::V4(net), IpAddr::V4(mask)) => {
            u32::from(ip) & u32::from(*mask) == u32::from(*net) & u32::from(*mask)
        }
        (IpAddr::V6(ip), IpAddr::V6(net), IpAddr::V6(mask)) => {
            u128::from(ip) & u128::from(*mask) == u128::from(*net) & u128::from(*mask)
        }
        _ => false,
    }
}

/// RFC 5280: `example.com` matches itself and its subdomains; `.example.com` only the latter.
fn dns_within(name: &str, constraint: &str) -> bool {
    let constraint = constraint.trim_end_matches('.').to_ascii_lowercase();
    if let Some(suffix) = constraint.strip_prefix('.') {
        return name.ends_with(&format!(".{suffix}"));
    }
    name == constraint || name.ends_with(&format!(".{constraint}"))
}

/// An issuing CA certificate as far as trust is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuingCa {
    /// `None`: the certificate carries no name constraints (it can issue for any name).
    pub constraints: Option<NameConstraints>,
    /// The basic constraints' path length; `None` when unlimited.
    pub path_len: Option<u32>,
}

/// Reads the first certificate of `pem` as an issuing CA.
pub fn issuing_ca(pem: &str) -> Result<IssuingCa, String> {
    let ders = certificates(pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&ders[0])
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let path_len = cert
        .basic_constraints()
        .map_err(|e| e.to_string())?
        .and_then(|b| b.value.path_len_constraint);
    let constraints = match cert.name_constraints().map_err(|e| e.to_string())? {
        None => None,
        Some(ext) => {
            let mut out = NameConstraints::default();
            let lists = [
                (&ext.value.permitted_subtrees, true),
                (&ext.value.excluded_subtrees, false),
            ];
            for (subtrees, permitted) in lists {
                for subtree in subtrees.iter().flatten() {
                    match &subtree.base {
                        GeneralName::DNSName(name) => {
                            let list = if permitted {
                                &mut out.permitted_dns
                            } else {
                                &mut out.excluded_dns
                            };
                            list.push((*name).to_owned());
                        }
                        GeneralName::IPAddress(bytes) => {
                            let subnet = subnet(bytes)
                                .ok_or_else(|| "a malformed IP address constraint".to_owned())?;
                            let list = if permitted {
                                &mut out.permitted_ip
                            } else {
                                &mut out.excluded_ip
                            };
                            list.push(subnet);
                        }
                        _ => {}
                    }
                }
            }
            Some(out)
        }
    };
    Ok(IssuingCa {
        constraints,
        path_len,
    })
}

fn subnet(bytes: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match bytes.len() {
        8 => {
            let (a, m) = bytes.split_at(4);
            let a: [u8; 4] = a.try_into().ok()?;
            let m: [u8; 4] = m.try_into().ok()?;
            Some((IpAddr::from(a), IpAddr::from(m)))
        }
        32 => {
            let (a, m) = bytes.split_at(16);
            let a: [u8; 16] = a.try_into().ok()?;
            let m: [u8; 16] = m.try_into().ok()?;
            Some((IpAddr::from(a), IpAddr::from(m)))
        }
        _ => None,
    }
}

fn certificates(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for block in Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        if block.label == "CERTIFICATE" {
            out.push(block.contents);
        }
    }
    if out.is_empty() {
        return Err("holds no PEM CERTIFICATE block".into());
    }
    Ok(out)
}

/// Why the configuration's API trust is unsafe on a node's disk, one sentence each (empty:
/// it is safe). A certificate that does not parse is [`crate::parse`]'s to refuse; here it
/// only yields no finding.
pub fn trust_findings(config: &MachineConfig) -> Vec<String> {
    let api = &config.api;
    let mut findings = Vec::new();
    let (Ok(ca), Ok(clients)) = (certificates(&api.ca_cert), certificates(&api.client_ca)) else {
        return findings;
    };
    let Ok((_, ca)) = x509_parser::parse_x509_certificate(&ca[0]) else {
        return findings;
    };
    for (i, der) in clients.iter().enumerate() {
        let Ok((_, client_ca)) = x509_parser::parse_x509_certificate(der) else {
            continue;
        };
        if same_key(&ca, &client_ca) {
            findings.push(format!(
                "api.ca_key is the key of api.client_ca's certificate {}: whoever reads this \
                 node's disk can make client certificates, admin included, that every node \
                 trusting that client CA accepts",
                i + 1
            ));
        } else if issued_by(&ca, &client_ca) {
            findings.push(format!(
                "api.ca_cert is issued by api.client_ca's certificate {}: whoever reads this \
                 node's disk can make client certificates under it that every node trusting \
                 that client CA accepts",
                i + 1
            ));
        }
    }
    match issuing_ca(&api.ca_cert) {
        Ok(IssuingCa {
            constraints: Some(constraints),
            path_len: Some(0),
        }) => {
            if constraints.permitted_dns.is_empty() {
                findings.push(
                    "api.ca_cert's name constraints permit no DNS name subtree, so it can \
                     issue a serving certificate for any other node's name"
                        .into(),
                );
            }
            if !constraints.constrains_every_ip() {
                findings.push(
                    "api.ca_cert's name constraints leave IP addresses open, so it can issue \
                     a serving certificate for any other node's address"
                        .into(),
                );
            }
        }
        Ok(IssuingCa {
            constraints: None, ..
        }) => findings.push(
            "api.ca_cert is an unconstrained CA (no X.509 name constraints): its key, on this \
             node's disk, can issue a serving certificate for any other node's name"
                .into(),
        ),
        Ok(IssuingCa { path_len, .. }) => findings.push(format!(
            "api.ca_cert allows {} below it (path length must be 0): its key could make \
             further CAs",
            path_len.map_or("any number of CAs".to_owned(), |n| format!("{n} CA(s)"))
        )),
        Err(_) => {}
    }
    findings
}

fn same_key(a: &X509Certificate<'_>, b: &X509Certificate<'_>) -> bool {
    a.public_key().raw == b.public_key().raw
}

fn issued_by(cert: &X509Certificate<'_>, issuer: &X509Certificate<'_>) -> bool {
    cert.issuer().as_raw() == issuer.subject().as_raw()
        && cert.verify_signature(Some(issuer.public_key())).is_ok()
}

/// [`trust_findings`] as the refusal of a configuration about to be written: `api.ca_key`,
/// every reason, and how to make a safe one.
pub fn check_trust(config: &MachineConfig) -> Result<(), ConfigError> {
    let findings = trust_findings(config);
    if findings.is_empty() {
        return Ok(());
    }
    Err(ConfigError::invalid(
        "api.ca_key",
        format!(
            "refused: no node may hold a key that signs for others ({}); {HOW_TO_FIX}",
            findings.join("; ")
        ),
    ))
}

/// Whether `fleet_ca` (the root clients verify nodes against) issued `ca_cert`.
pub(crate) fn issued_by_any(ca_cert: &str, fleet_ca: &str) -> bool {
    let (Ok(ca), Ok(roots)) = (certificates(ca_cert), certificates(fleet_ca)) else {
        return false;
    };
    let Ok((_, ca)) = x509_parser::parse_x509_certificate(&ca[0]) else {
        return false;
    };
    roots.iter().any(|der| {
        x509_parser::parse_x509_certificate(der).is_ok_and(|(_, root)| issued_by(&ca, &root))
    })
}

#[cfg(test)]
mod tests {
    use rcgen::{
        BasicConstraints, CertificateParams, CidrSubnet, DnType, GeneralSubtree, IsCa, KeyPair,
        NameConstraints as Constraints,
    };

    use super::*;

    const V1: &str = include_str!("../tests/fixtures/node-v1.toml");

    /// A self-signed CA.
    fn root(cn: &str) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(1));
        (p.self_signed(&key).unwrap(), key)
    }

    /// A CA under `issuer` with `path_len` and `constraints`.
    fn under(
        issuer: &(rcgen::Certificate, KeyPair),
        path_len: Option<u8>,
        constraints: Option<Constraints>,
    ) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, "node CA");
        p.is_ca = IsCa::Ca(match path_len {
            Some(n) => BasicConstraints::Constrained(n),
            None => BasicConstraints::Unconstrained,
        });
        p.name_constraints = constraints;
        (p.signed_by(&key, &issuer.0, &issuer.1).unwrap(), key)
    }

    fn node_only(ips: Vec<GeneralSubtree>, excluded: Vec<GeneralSubtree>) -> Option<Constraints> {
        let mut permitted = vec![GeneralSubtree::DnsName("node1".into())];
        permitted.extend(ips);
        Some(Constraints {
            permitted_subtrees: permitted,
            excluded_subtrees: excluded,
        })
    }

    fn all_ips() -> Vec<GeneralSubtree> {
        vec![
            GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])),
            GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])),
        ]
    }

    /// The fixture's document with this CA and client CA.
    fn config(ca: &(rcgen::Certificate, KeyPair), client_ca: &str) -> MachineConfig {
        let mut config = crate::parse(V1).unwrap().config;
        config.api.ca_cert = ca.0.pem();
        config.api.ca_key = ca.1.serialize_pem();
        config.api.client_ca = client_ca.to_owned();
        config
    }

    #[test]
    fn what_slate_gen_config_writes_is_safe() {
        let text = include_str!("../tests/fixtures/node-v1-own-ca.toml");
        let parsed = crate::parse_for_writing(text).unwrap();
        assert!(trust_findings(&parsed.config).is_empty());
        let ca = issuing_ca(&parsed.config.api.ca_cert).unwrap();
        assert_eq!(ca.path_len, Some(0));
        let constraints = ca.constraints.unwrap();
        assert_eq!(constraints.permitted_dns, ["node1"]);
        assert!(constraints.permits("node1") && !constraints.permits("node2"));
        assert!(!constraints.permits("127.0.0.1") && !constraints.permits("::1"));
    }

    #[test]
    fn a_name_constrained_node_ca_apart_from_the_client_ca_is_safe() {
        let (fleet, clients) = (root("fleet"), root("clients"));
        let ca = under(&fleet, Some(0), node_only(Vec::new(), all_ips()));
        let config = config(&ca, &clients.0.pem());
        assert_eq!(trust_findings(&config), Vec::<String>::new());
        check_trust(&config).unwrap();
        // With a static address permitted instead of every address excluded: safe too.
        let ip = GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
            "10.0.0.5".parse().unwrap(),
            32,
        ));
        let ca = under(&fleet, Some(0), node_only(vec![ip], Vec::new()));
        assert!(trust_findings(&config_with(&ca, &clients)).is_empty());
    }

    fn config_with(
        ca: &(rcgen::Certificate, KeyPair),
        clients: &(rcgen::Certificate, KeyPair),
    ) -> MachineConfig {
        config(ca, &clients.0.pem())
    }

    #[test]
    fn every_unsafe_shape_is_named() {
        let (fleet, clients) = (root("fleet"), root("clients"));
        let finding = |config: &MachineConfig| trust_findings(config).join(" | ");
        // The fixture: one CA for everything (what `slate gen certs` used to make).
        let shared = crate::parse(V1).unwrap().config;
        let text = finding(&shared);
        assert!(
            text.contains("is the key of api.client_ca's certificate 1"),
            "{text}"
        );
        assert!(text.contains("unconstrained CA"), "{text}");
        let err = check_trust(&shared).unwrap_err();
        assert_eq!(err.field(), Some("api.ca_key"));
        assert!(err.to_string().contains("slate gen certs"), "{err}");
        assert_eq!(
            crate::parse_for_writing(V1).unwrap_err(),
            err,
            "parse_for_writing refuses what check_trust refuses"
        );
        // The node's CA issued by the client CA: it could mint clients under it.
        let ca = under(&clients, Some(0), node_only(Vec::new(), all_ips()));
        let text = finding(&config_with(&ca, &clients));
        assert!(
            text.contains("issued by api.client_ca's certificate 1"),
            "{text}"
        );
        // No name constraints.
        let ca = under(&fleet, Some(0), None);
        assert!(finding(&config_with(&ca, &clients)).contains("unconstrained CA"));
        // IP addresses left open.
        let ca = under(&fleet, Some(0), node_only(Vec::new(), Vec::new()));
        assert!(finding(&config_with(&ca, &clients)).contains("leave IP addresses open"));
        // Only IPv4 excluded: IPv6 still open.
        let ca = under(
            &fleet,
            Some(0),
            node_only(Vec::new(), all_ips()[..1].to_vec()),
        );
        assert!(finding(&config_with(&ca, &clients)).contains("leave IP addresses open"));
        // No DNS subtree permitted.
        let no_dns = Some(Constraints {
            permitted_subtrees: Vec::new(),
            excluded_subtrees: all_ips(),
        });
        let ca = under(&fleet, Some(0), no_dns);
        assert!(finding(&config_with(&ca, &clients)).contains("permit no DNS name"));
        // CAs below it allowed.
        for path_len in [None, Some(1)] {
            let ca = under(&fleet, path_len, node_only(Vec::new(), all_ips()));
            assert!(finding(&config_with(&ca, &clients)).contains("path length must be 0"));
        }
    }

    #[test]
    fn constraints_permit_as_rfc_5280_says() {
        let c = NameConstraints {
            permitted_dns: vec!["node1".into(), "lan.example".into()],
            excluded_dns: vec!["bad.lan.example".into()],
            permitted_ip: vec![(
                "10.0.0.5".parse().unwrap(),
                "255.255.255.255".parse().unwrap(),
            )],
            excluded_ip: Vec::new(),
        };
        for ok in [
            "node1",
            "NODE1.",
            "lan.example",
            "a.lan.example",
            "10.0.0.5",
        ] {
            assert!(c.permits(ok), "{ok}");
        }
        for refused in [
            "node2",
            "xnode1",
            "x.bad.lan.example",
            "10.0.0.6",
            "::1",
            "127.0.0.1",
        ] {
            assert!(!c.permits(refused), "{refused}");
        }
        let none_ip = NameConstraints {
            permitted_dns: vec!["node1".into()],
            excluded_ip: vec![
                ("0.0.0.0".parse().unwrap(), "0.0.0.0".parse().unwrap()),
                ("::".parse().unwrap(), "::".parse().unwrap()),
            ],
            ..NameConstraints::default()
        };
        assert!(none_ip.constrains_every_ip());
        assert!(!none_ip.permits("10.0.2.15") && !none_ip.permits("fe80::1"));
    }
}
