//! TLS on the lock server's listener, as the node API does it (`slate-api`'s `tls.rs`): rustls
//! on ring, HTTP/1.1 by ALPN, and with a client CA a client certificate *required* and
//! verified against it (none, or one from another CA, fails the handshake).
//!
//! This is a small copy of the api crate's PEM-to-`ServerConfig` code rather than a dependency
//! on it: there it is crate-private and takes bytes, here every error must name the file it
//! came from, and `slate-api` would bring rcgen, x509-parser and the sequencer into a crate
//! that needs none of them. The versions and features are the api crate's, so no second
//! rustls enters the build.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

const ALPN_HTTP1: &[u8] = b"http/1.1";

/// How long a client gets to complete the TLS handshake, unless
/// [`Tls::with_handshake_timeout`] says otherwise. Without a bound, a client that connects and
/// sends nothing would hold a task and a socket for as long as it likes (hyper's header
/// timeout only starts once the handshake is done).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A certificate, key or CA file that cannot be used. Every variant names the file(s).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    // `error`, not `source`: the message shows it already, and an error chain (`{:#}`) would
    // print a source a second time.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    /// The certificate and key parse, but rustls refuses them together (the key is not the
    /// certificate's, or the certificate's key type is unsupported).
    #[error("{} with key {}: {reason}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    /// The crypto provider offers no safe protocol version: a build defect, not bad input.
    #[error("TLS configuration: {0}")]
    Provider(rustls::Error),
}

/// TLS for [`crate::Server`]: checked certificates and key, ready to accept connections.
#[derive(Clone)]
pub struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) handshake_timeout: Duration,
    mutual: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The acceptor holds the private key: never shown.
        f.debug_struct("Tls")
            .field("mutual", &self.mutual)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the server's certificate chain (`cert`, PEM, end-entity first) and private key
    /// (`key`, PEM: PKCS#8, SEC1 or PKCS#1) and, with `client_ca`, the PEM certificates client
    /// certificates must chain to (mutual TLS). Everything is checked here, so that a bad file
    /// is reported before the listener binds.
    pub fn from_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Tls, TlsError> {
        let chain = parse_certs(cert)?;
        let key_der = parse_key(key)?;
        let client_roots = client_ca.map(roots).transpose()?;

        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Provider)?;
        let mutual = client_roots.is_some();
        let builder = match client_roots {
            Some((path, roots)) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| invalid(&path, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key_der)
            .map_err(|e| TlsError::Pair {
                cert: cert.to_owned(),
                key: key.to_owned(),
                reason: pair_reason(&e),
            })?;
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            mutual,
        })
    }

    /// Replaces [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Tls {
        self.handshake_timeout = timeout;
        self
    }

    /// Whether clients must present a certificate from the client CA.
    pub fn mutual(&self) -> bool {
        self.mutual
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn invalid(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn pair_reason(err: &rustls::Error) -> String {
    match err {
        // rustls' own words ("keys may not be consistent: KeyMismatch") leave the admin to
        // guess what is wrong.
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            "the private key is not the certificate's".to_owned()
        }
        e => e.to_string(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        error,
    })
}

/// Every certificate of a PEM file (at least one).
fn parse_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "no CERTIFICATE block in the PEM data"));
    }
    Ok(certs)
}

fn parse_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| {
        invalid(
            path,
            format!("no usable private key (PEM: PKCS#8, SEC1 or PKCS#1): {e}"),
        )
    })
}

fn roots(path: &Path) -> Result<(PathBuf, Arc<RootCertStore>), TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| invalid(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok((path.to_owned(), Arc::new(roots)))
}
