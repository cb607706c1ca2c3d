//! rustls configuration for both ends (the server's made by `slate-https`, as for every slate
//! listener), PEM errors in the node API's words, and the role carried by a verified client
//! certificate.

use std::sync::Arc;

use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::Digest as _;
use slate_https::tls::{provider, ALPN_HTTP1};

use crate::certs::CertError;
use crate::types::{Caller, Role};

mod judged;

use judged::{chain_digest, Judged};

fn invalid(what: &str, reason: impl std::fmt::Display) -> CertError {
    CertError::Invalid {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

/// Every certificate in a PEM bundle (at least one).
pub(crate) fn parse_certs(
    pem: &[u8],
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    slate_https::tls::parse_certs(pem).map_err(|e| invalid(what, e))
}

/// The private key of a PEM file (PKCS#8, SEC1 or PKCS#1).
pub(crate) fn parse_key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, CertError> {
    slate_https::tls::parse_key(pem).map_err(|e| invalid(what, e))
}

fn roots(ca_pem: &[u8]) -> Result<Arc<RootCertStore>, CertError> {
    slate_https::tls::roots(ca_pem).map_err(|e| invalid("CA certificate", e))
}

/// Who may call a server: client certificates that chain to the client CA (`O=os:<role>` is
/// their role) and, for a server that hears from nodes (the rollout operator), node
/// certificates that chain to the fleet CA through a node's name-constrained issuing CA
/// ([`Role::Node`], never more). Used as the handshake's verifier, then once more per
/// connection to tell which of the two a verified chain is.
#[derive(Debug)]
pub(crate) struct ClientTrust {
    clients: Arc<dyn ClientCertVerifier>,
    nodes: Option<Arc<dyn ClientCertVerifier>>,
    hints: Vec<rustls::DistinguishedName>,
    /// Chains judged good, while they are valid (`tls/judged.rs`).
    judged: Judged,
}

impl ClientTrust {
    pub(crate) fn new(client_ca_pem: &[u8], node_ca_pem: Option<&[u8]>) -> Result<Self, CertError> {
        let verifier = |pem: &[u8], what: &str| -> Result<Arc<dyn ClientCertVerifier>, CertError> {
            slate_https::tls::client_verifier(roots(pem)?).map_err(|e| invalid(what, e))
        };
        let clients = verifier(client_ca_pem, "client CA certificate")?;
        let nodes = node_ca_pem
            .map(|pem| verifier(pem, "fleet CA certificate"))
            .transpose()?;
        let mut hints = clients.root_hint_subjects().to_vec();
        if let Some(nodes) = &nodes {
            hints.extend_from_slice(nodes.root_hint_subjects());
        }
        Ok(ClientTrust {
            clients,
            nodes,
            hints,
            judged: Judged::default(),
        })
    }

    /// The caller a chain the handshake accepted stands for: a role from a client certificate,
    /// else a node; `None` when it names no role (or there is no chain).
    pub(crate) fn caller(&self, chain: Option<&[CertificateDer<'_>]>) -> Option<Caller> {
        self.caller_at(chain?, rustls_pki_types::UnixTime::now())
    }

    /// [`ClientTrust::caller`] at `now`: from memory when the same chain was judged good
    /// and is still valid, else judged and (when good) remembered.
    fn caller_at(
        &self,
        chain: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Option<Caller> {
        let digest = chain_digest(chain);
        if let Some(caller) = self.judged.caller(&digest, now) {
            return Some(caller);
        }
        let caller = self.judge(chain, now)?;
        self.judged.remember(digest, chain, &caller);
        Some(caller)
    }

    fn judge(
        &self,
        chain: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Option<Caller> {
        let (end_entity, intermediates) = chain.split_first()?;
        if self
            .clients
            .verify_client_cert(end_entity, intermediates, now)
            .is_ok()
        {
            return role_of(Some(chain)).map(Caller::with_role);
        }
        let nodes = self.nodes.as_ref()?;
        nodes
            .verify_client_cert(end_entity, intermediates, now)
            .ok()?;
        let (_, cert) = x509_parser::parse_x509_certificate(end_entity.as_ref()).ok()?;
        let sans = cert.subject_alternative_name().ok()??;
        let node_names = sans
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(name) => Some((*name).to_owned()),
                _ => None,
            })
            .collect();
        Some(Caller {
            role: Role::Node,
            node_names,
        })
    }
}

impl ClientCertVerifier for ClientTrust {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let digest = chain_digest(std::iter::once(end_entity).chain(intermediates));
        if self.judged.holds(&digest, now) {
            return Ok(ClientCertVerified::assertion());
        }
        match self
            .clients
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(verified) => Ok(verified),
            Err(e) => match &self.nodes {
                Some(nodes) => nodes
                    .verify_client_cert(end_entity, intermediates, now)
                    .map_err(|_| e),
                None => Err(e),
            },
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.clients.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.clients.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.clients.supported_verify_schemes()
    }
}

/// The server side: our chain and key, and a client certificate *required* and verified by
/// `trust` (no certificate, or one from another CA, fails the handshake). Without `trust`
/// (maintenance mode) no client certificate is asked for. A client may resume its session from
/// a ticket.
pub(crate) fn server_config(
    trust: Option<Arc<ClientTrust>>,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<rustls::ServerConfig, CertError> {
    let chain = parse_certs(cert_pem, "server certificate")?;
    let key = parse_key(key_pem, "server key")?;
    let clients = trust.map(|trust| trust as Arc<dyn ClientCertVerifier>);
    let explain = |e| match e {
        slate_https::tls::ConfigError::Protocols(e)
        | slate_https::tls::ConfigError::Ticketer(e) => invalid("TLS configuration", e),
        slate_https::tls::ConfigError::Pair(e) => invalid("server certificate and key", e),
    };
    let mut config = slate_https::tls::server_config(clients, chain, key).map_err(explain)?;
    // Every connection's chain is judged again (`ClientTrust::caller`), a resumed one's too.
    slate_https::tls::resume_with_tickets(&mut config).map_err(explain)?;
    Ok(config)
}

/// The client side: the node's certificate must chain to `ca_pem`; `identity` is our
/// certificate chain and key PEM (none only to show that the server refuses such a client).
pub(crate) fn client_config(
    ca_pem: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<rustls::ClientConfig, CertError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("TLS configuration", e))?
        .with_root_certificates(roots(ca_pem)?);
    let mut config = match identity {
        Some((cert_pem, key_pem)) => builder
            .with_client_auth_cert(
                parse_certs(cert_pem, "client certificate")?,
                parse_key(key_pem, "client key")?,
            )
            .map_err(|e| invalid("client certificate and key", e))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// The role granted by a (verified) client certificate chain: the highest role named by an
/// `O=os:<role>` of the end-entity certificate's subject; `None` when it names none.
pub(crate) fn role_of(chain: Option<&[CertificateDer<'_>]>) -> Option<Role> {
    let der = chain?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let role = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .filter_map(Role::from_organization)
        .max();
    role
}

/// A human explanation of a TLS failure seen by the client, if `err` (or its sources) is one.
pub(crate) fn explain(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(describe(tls));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(describe(tls));
            }
        }
        cur = e.source();
    }
    None
}

fn describe(err: &rustls::Error) -> String {
    use rustls::AlertDescription as A;
    match err {
        rustls::Error::AlertReceived(A::CertificateRequired) => {
            "the node refused the TLS handshake: it requires a client certificate and this \
             client presented none"
                .to_owned()
        }
        rustls::Error::AlertReceived(
            alert @ (A::UnknownCA
            | A::BadCertificate
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::AccessDenied
            | A::DecryptError),
        ) => format!(
            "the node refused the TLS handshake ({alert:?}): the client certificate is not \
             accepted (is it signed by the node's CA, and still valid?)"
        ),
        // webpki's NameConstraintViolation comes wrapped in `Other`; its Debug names it.
        rustls::Error::InvalidCertificate(e)
            if format!("{e:?}").contains("NameConstraintViolation") =>
        {
            "the node's certificate is not trusted: its issuing CA may not certify that name \
             (X.509 name constraints): another node's CA, or the wrong --server-name"
                .to_owned()
        }
        rustls::Error::InvalidCertificate(e) => {
            format!("the node's certificate is not trusted: {e}")
        }
        e => format!("TLS error: {e}"),
    }
}

/// The client side of maintenance mode: the node has no identity yet, only a self-signed
/// certificate. With `pin` (the SHA-256 of its DER, which the node prints on its console) only
/// that certificate is accepted; without, any (`--insecure`). Handshake signatures are still
/// verified, so the peer holds the certificate's key.
pub(crate) fn maintenance_client_config(
    pin: Option<[u8; 32]>,
) -> Result<rustls::ClientConfig, CertError> {
    let provider = provider();
    let verifier = Arc::new(MaintenanceServer {
        algorithms: provider.signature_verification_algorithms,
        pin,
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("TLS configuration", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(config)
}

#[derive(Debug)]
struct MaintenanceServer {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
    pin: Option<[u8; 32]>,
}

impl rustls::client::danger::ServerCertVerifier for MaintenanceServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.pin {
            Some(pin) if sha2::Sha256::digest(end_entity.as_ref()).as_slice() != pin => {
                Err(rustls::Error::General(
                    "the node's maintenance certificate does not have the pinned fingerprint"
                        .into(),
                ))
            }
            _ => Ok(rustls::client::danger::ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
