use std::path::PathBuf;

use crate::reference::ReferenceError;

/// Why a pull or a push failed. Each variant names the thing (a URL, a blob, a manifest) and what
/// was wrong with it; a transfer that fails never leaves an unverified blob in a layout.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The request did not get an HTTP answer: connection refused or cut, TLS, timeout, or bytes
    /// that are not HTTP.
    ///
    /// The cause is in the message and not a `source()`: a chain printer (`{:#}`, anyhow's
    /// `error: a: b`) would otherwise print it twice (issue 44).
    #[error("{method} {url}: {cause}")]
    Http {
        method: String,
        url: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Bytes came back, but not an HTTP answer.
    #[error("{method} {url}: the answer is not HTTP ({cause})")]
    NotHttp {
        method: String,
        url: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The registry answered with a status the protocol does not allow here.
    #[error("{method} {url}: the registry answered {status}{detail}")]
    Status {
        method: String,
        url: String,
        status: u16,
        /// The OCI error codes and messages of the body, when it had any (`: CODE: message`).
        detail: String,
    },
    #[error("{url}: the registry wants credentials ({challenge}); set SLATE_REGISTRY_USERNAME and SLATE_REGISTRY_PASSWORD")]
    Unauthorized { url: String, challenge: String },
    #[error("{what} was not found ({location})")]
    NotFound { what: String, location: String },
    #[error("{what} has media type {actual:?}, expected {expected}")]
    MediaType {
        what: String,
        actual: String,
        expected: String,
    },
    #[error("{what} is malformed: {reason}")]
    Malformed { what: String, reason: String },
    #[error("{what} is larger than {limit} bytes")]
    Oversize { what: String, limit: u64 },
    #[error("{what} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{what} is {actual} bytes, its descriptor says {expected}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },
    /// The transfer stopped early; what arrived is kept and the next pull resumes from it.
    #[error("{what}: the transfer stopped after {received} of {expected} bytes (kept; the next pull resumes there){}", cause.as_ref().map(|c| format!(": {c}")).unwrap_or_default())]
    Truncated {
        what: String,
        received: u64,
        expected: u64,
        cause: Option<std::io::Error>,
    },
    #[error("{0}")]
    Usage(String),
    /// Credentials would have gone over plain HTTP to a host that is not this machine.
    #[error("{url}: refusing to send the registry credentials in clear (plain http) to {host}, which is not this machine; use https")]
    CleartextCredentials { url: String, host: String },
    /// The registry's token service is on another host, which was not allowed to receive the
    /// registry's credentials, and it refused an anonymous token.
    #[error("{url}: the token service on {host} wants credentials, but they belong to {registry} and are sent to no other host; allow that host explicitly (--auth-host {host}) if it is the registry's token service{detail}")]
    CredentialsWithheld {
        url: String,
        host: String,
        registry: String,
        /// The token service's own explanation, when it gave one (`: CODE: message`).
        detail: String,
    },
    /// The TLS handshake failed on the server's certificate.
    #[error("{method} {url}: the registry's TLS certificate is not trusted ({reason}); if it is issued by a private CA, trust that CA with --ca-file")]
    Certificate {
        method: String,
        url: String,
        reason: String,
    },
    /// A CA file that holds no usable certificate.
    #[error("{path}: not a PEM CA certificate file: {reason}")]
    CaFile { path: PathBuf, reason: String },
    /// What the manifest declares is more than the pull may fetch; nothing was fetched.
    #[error("{what} declares {declared} bytes, more than the limit of {limit} bytes{}", if *limit == crate::MAX_FILE_BYTES { " (the largest file size)" } else { " (raise it with --max-image-size)" })]
    TooLarge {
        what: String,
        /// The declared size (a sum of descriptors, which can exceed `u64`).
        declared: u128,
        limit: u64,
    },
    /// A file in a layout that is not a regular file (a FIFO, device, socket or symbolic link).
    #[error("{path} is {kind}, not a regular file: refused")]
    NotRegularFile { path: PathBuf, kind: &'static str },
}

#[cfg_attr(not(feature = "client"), allow(dead_code))]
impl TransportError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| TransportError::Io { path, source }
    }

    pub(crate) fn malformed(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        TransportError::Malformed {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}
