//! TLS on the lock server's listener from files: the certificate chain, the key and, for
//! mutual TLS, the client CA, each read here so that every error names its file. The
//! configuration itself (rustls on ring, HTTP/1.1 by ALPN, a client certificate *required*
//! and verified against the client CA) is `slate-https`'s, as for the node API.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use slate_https::tls::{ConfigError, PemError, RootsError};
use slate_https::Accept;

pub use slate_https::DEFAULT_HANDSHAKE_TIMEOUT;

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
    config: Arc<rustls::ServerConfig>,
    handshake_timeout: Duration,
    mutual: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The configuration holds the private key: never shown.
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
        let verifier = client_ca.map(client_verifier).transpose()?;
        let mutual = verifier.is_some();
        let config =
            slate_https::tls::server_config(verifier, chain, key_der).map_err(|e| match e {
                ConfigError::Protocols(e) | ConfigError::Ticketer(e) => TlsError::Provider(e),
                ConfigError::Pair(e) => TlsError::Pair {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    reason: pair_reason(&e),
                },
            })?;
        Ok(Tls {
            config: Arc::new(config),
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

    /// How the listener accepts with this TLS.
    pub(crate) fn accept(&self) -> Accept {
        Accept::tls(self.config.clone(), self.handshake_timeout)
    }
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

/// A PEM file is a few KiB; a bigger one is not a certificate or key.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// `--tls-cert`, `--tls-key`, `--client-ca`: regular files within the bound, a FIFO or a
/// device refused by name rather than waited on (issue 44).
fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    slate_files::read_file_bounded(path, MAX_PEM_BYTES, "the TLS file").map_err(|e| {
        TlsError::Read {
            path: path.to_owned(),
            error: e.into_io(),
        }
    })
}

fn pem_invalid(path: &Path, err: PemError) -> TlsError {
    match err {
        PemError::Pem(e) => invalid(path, format!("not a PEM certificate file: {e}")),
        e @ PemError::NoCertificate => invalid(path, e),
    }
}

/// Every certificate of a PEM file (at least one).
fn parse_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    slate_https::tls::parse_certs(&read(path)?).map_err(|e| pem_invalid(path, e))
}

fn parse_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    slate_https::tls::parse_key(&read(path)?).map_err(|e| {
        invalid(
            path,
            format!("no usable private key (PEM: PKCS#8, SEC1 or PKCS#1): {e}"),
        )
    })
}

/// rustls' verifier of client certificates that chain to the CA certificates of a PEM file.
fn client_verifier(path: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let roots = slate_https::tls::roots(&read(path)?).map_err(|e| match e {
        RootsError::Pem(e) => pem_invalid(path, e),
        RootsError::Add(e) => invalid(path, format!("not a usable CA certificate: {e}")),
    })?;
    slate_https::tls::client_verifier(roots).map_err(|e| invalid(path, e))
}
