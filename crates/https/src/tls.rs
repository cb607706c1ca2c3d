//! rustls' server side from PEM, as every slate listener sets it up: ring, the safe default
//! protocol versions, HTTP/1.1 by ALPN, and, given a verifier, a client certificate *required*
//! and verified (none, or one the verifier refuses, fails the handshake).
//!
//! The errors say what was wrong and nothing about where it came from: one caller names the
//! role of some bytes ("server certificate"), another the file it read them from, each in its
//! own words.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::RootCertStore;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The one application protocol slate's servers and clients speak.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// ring: aws-lc, rustls' default, needs cmake and nasm to build.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a PEM bundle gave no certificates.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("{0}")]
    Pem(pem::Error),
    #[error("no CERTIFICATE block in the PEM data")]
    NoCertificate,
}

/// Why PEM certificates are no set of trusted roots.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    #[error(transparent)]
    Pem(#[from] PemError),
    /// A certificate rustls cannot use as a trust anchor.
    #[error("{0}")]
    Add(rustls::Error),
}

/// Why rustls refused to build a server configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The crypto provider offers no safe protocol version: a build defect, not bad input.
    #[error("{0}")]
    Protocols(rustls::Error),
    /// The certificate and key parse, but not together (the key is not the certificate's, or
    /// the certificate's key type is unsupported).
    #[error("{0}")]
    Pair(rustls::Error),
    /// No ticket key could be made (the system's random source failed).
    #[error("making the session ticket key: {0}")]
    Ticketer(rustls::Error),
}

/// Every certificate in a PEM bundle (at least one).
pub fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(PemError::Pem)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, SEC1 or PKCS#1).
pub fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, pem::Error> {
    PrivateKeyDer::from_pem_slice(pem)
}

/// The certificates of a PEM bundle as trust anchors.
pub fn roots(ca_pem: &[u8]) -> Result<Arc<RootCertStore>, RootsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(ca_pem)? {
        roots.add(cert).map_err(RootsError::Add)?;
    }
    Ok(Arc::new(roots))
}

/// rustls' verifier of client certificates that chain to `roots`.
pub fn client_verifier(
    roots: Arc<RootCertStore>,
) -> Result<Arc<dyn ClientCertVerifier>, VerifierBuilderError> {
    WebPkiClientVerifier::builder_with_provider(roots, provider()).build()
}

/// The server side: our chain (end-entity first) and key, and with `clients` a client
/// certificate required and judged by it; without, none is asked for.
pub fn server_config(
    clients: Option<Arc<dyn ClientCertVerifier>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ServerConfig, ConfigError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Protocols)?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(ConfigError::Pair)?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// Lets clients resume their sessions from stateless tickets instead of rustls' default cache
/// of 256 sessions: a rollout operator hears from thousands of nodes, each calling again every
/// poll interval, and a ticket costs the server no memory. A resumed handshake sends and signs
/// no certificate, but still makes a fresh (EC)DHE key exchange; the ticket keys rotate every
/// 6 hours. Only for a server that judges the client's chain again on every connection: a
/// resumed connection brings the chain of the session's first handshake, which the handshake's
/// verifier does not see again (a certificate that expired since would pass it).
pub fn resume_with_tickets(config: &mut rustls::ServerConfig) -> Result<(), ConfigError> {
    config.ticketer = rustls::crypto::ring::Ticketer::new().map_err(ConfigError::Ticketer)?;
    Ok(())
}
