//! The OCI distribution protocol, the part slate needs, over blocking `ureq` (rustls on ring,
//! webpki roots): manifests by tag or digest (capped, typed, verified), blobs with `Range`
//! resumption, HEAD checks, monolithic and chunked uploads, manifests by tag; anonymous or basic
//! bearer-token authentication (`auth.rs`: where credentials may go; `upload.rs`: blob uploads).
//! Plain HTTP for loopback registries or with `insecure`.

mod auth;
mod upload;

use std::io::Read;
use std::sync::Mutex;

use slate_bundle::{Digest, MAX_DOCUMENT_BYTES};
use ureq::http::{self, Response};
use ureq::SendBody;

use crate::{Client, TransportError};

/// What slate reads as a manifest, in order of preference. Indexes and Docker manifests are
/// accepted on the wire only to be refused with a precise message rather than a 404.
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json;q=0.5, application/vnd.docker.distribution.manifest.v2+json;q=0.4, application/vnd.docker.distribution.manifest.list.v2+json;q=0.4";
/// Error bodies and token answers are read up to this much.
const MAX_SMALL_BODY: u64 = 64 * 1024;
pub(crate) const DEFAULT_CHUNK: u64 = 32 * 1024 * 1024;

/// A manifest as a registry or layout served it, checked against its digest.
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    pub bytes: Vec<u8>,
    pub digest: String,
    pub media_type: String,
}

/// A request body.
enum Body<'a> {
    Empty,
    Bytes(&'a [u8]),
    /// A stream of exactly this many bytes; sent once (no retry after an auth challenge).
    Reader(&'a mut dyn Read, u64),
}

/// One repository on one registry.
pub(crate) struct Registry {
    agent: ureq::Agent,
    base: String,
    repository: String,
    /// Where the credentials may go.
    auth: auth::Policy,
    push: bool,
    /// The `Authorization` value earned from the last challenge.
    authorization: Mutex<Option<String>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("base", &self.base)
            .field("repository", &self.repository)
            .finish_non_exhaustive()
    }
}

fn with_query(url: &str, key: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{key}={}", percent_encode(value))
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header<'r>(response: &'r Response<ureq::Body>, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The media type of a `Content-Type` value (parameters dropped, lowercased).
fn media_type_of(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// `: CODE: message; …` from an OCI error body, or a short quote of a body that is not one.
fn error_detail(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<OciError>,
    }
    #[derive(serde::Deserialize)]
    struct OciError {
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(errors) = serde_json::from_slice::<Errors>(body) {
        if !errors.errors.is_empty() {
            let list: Vec<String> = errors
                .errors
                .iter()
                .map(|e| format!("{}: {}", e.code, e.message))
                .collect();
            return format!(": {}", list.join("; "));
        }
    }
    let text: String = String::from_utf8_lossy(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(160)
        .collect();
    if text.trim().is_empty() {
        String::new()
    } else {
        format!(": {:?}", text.trim())
    }
}

impl Registry {
    pub fn new(
        host: &str,
        repository: &str,
        client: &Client,
        push: bool,
    ) -> Result<Self, TransportError> {
        let scheme = if client.options.insecure || auth::is_loopback(host) {
            "http"
        } else {
            "https"
        };
        let auth = auth::Policy::new(
            client.options.credentials.clone(),
            scheme,
            host,
            &client.credential_hosts,
        )?;
        Ok(Registry {
            agent: crate::tls::agent(&client.ca),
            base: format!("{scheme}://{host}"),
            repository: repository.to_owned(),
            auth,
            push,
            authorization: Mutex::new(None),
        })
    }

    /// Whether `url` is on this registry (same scheme, host and port): the only place its
    /// `Authorization` goes.
    fn is_own(&self, url: &str) -> bool {
        url.strip_prefix(&self.base)
            .is_some_and(|rest| rest.starts_with('/'))
    }

    pub fn describe(&self) -> String {
        format!("{}/v2/{}", self.base, self.repository)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.repository)
    }

    fn http_error(method: &str, url: &str, source: ureq::Error) -> TransportError {
        if let Some(reason) = crate::tls::certificate_problem(&source) {
            return TransportError::Certificate {
                method: method.to_owned(),
                url: url.to_owned(),
                reason,
            };
        }
        if matches!(source, ureq::Error::Protocol(_)) {
            return TransportError::NotHttp {
                method: method.to_owned(),
                url: url.to_owned(),
                cause: Box::new(source),
            };
        }
        TransportError::Http {
            method: method.to_owned(),
            url: url.to_owned(),
            cause: Box::new(source),
        }
    }

    /// A status the protocol does not allow here, with the body's explanation.
    fn status_error(method: &str, url: &str, response: Response<ureq::Body>) -> TransportError {
        let status = response.status().as_u16();
        let mut body = Vec::new();
        let _ = response
            .into_body()
            .into_reader()
            .take(MAX_SMALL_BODY)
            .read_to_end(&mut body);
        TransportError::Status {
            method: method.to_owned(),
            url: url.to_owned(),
            status,
            detail: error_detail(&body),
        }
    }

    fn send_once(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &mut Body<'_>,
    ) -> Result<Response<ureq::Body>, TransportError> {
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if self.is_own(url) {
            if let Some(auth) = self.authorization.lock().expect("not poisoned").clone() {
                request = request.header("Authorization", auth);
            }
        }
        let fail = |e: http::Error| Self::http_error(method, url, ureq::Error::Http(e));
        let result = match body {
            Body::Empty => {
                if matches!(method, "POST" | "PUT" | "PATCH") {
                    request = request.header("Content-Length", "0");
                }
                self.agent
                    .run(request.body(SendBody::none()).map_err(fail)?)
            }
            Body::Bytes(bytes) => self.agent.run(
                request
                    .header("Content-Length", bytes.len().to_string())
                    .body(*bytes)
                    .map_err(fail)?,
            ),
            Body::Reader(reader, len) => self.agent.run(
                request
                    .header("Content-Length", len.to_string())
                    .body(SendBody::from_reader(&mut **reader))
                    .map_err(fail)?,
            ),
        };
        result.map_err(|e| Self::http_error(method, url, e))
    }

    /// Send; on a 401 earn a token (or use basic credentials) and send once more.
    fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        mut body: Body<'_>,
    ) -> Result<Response<ureq::Body>, TransportError> {
        let response = self.send_once(method, url, headers, &mut body)?;
        if response.status() != 401 {
            return Ok(response);
        }
        let challenge = header(&response, "www-authenticate")
            .unwrap_or_default()
            .to_owned();
        if matches!(body, Body::Reader(..)) {
            return Err(TransportError::Unauthorized {
                url: url.to_owned(),
                challenge,
            });
        }
        self.authenticate(url, &challenge)?;
        let response = self.send_once(method, url, headers, &mut body)?;
        if response.status() == 401 {
            return Err(TransportError::Unauthorized {
                url: url.to_owned(),
                challenge,
            });
        }
        Ok(response)
    }

    fn read_small(
        &self,
        response: Response<ureq::Body>,
        method: &str,
        url: &str,
        what: &str,
        limit: u64,
    ) -> Result<Vec<u8>, TransportError> {
        let mut bytes = Vec::new();
        response
            .into_body()
            .into_reader()
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| Self::http_error(method, url, ureq::Error::Io(e)))?;
        if bytes.len() as u64 > limit {
            return Err(TransportError::Oversize {
                what: what.to_owned(),
                limit,
            });
        }
        Ok(bytes)
    }

    /// The manifest `reference` (a tag or a digest), or `None` when the registry has none by
    /// that name.
    pub fn get_manifest(&self, reference: &str) -> Result<Option<Manifest>, TransportError> {
        let url = self.url(&format!("manifests/{reference}"));
        let what = format!("the manifest {}:{reference}", self.describe());
        let response = self.send("GET", &url, &[("Accept", ACCEPT_MANIFESTS)], Body::Empty)?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(None),
            _ => return Err(Self::status_error("GET", &url, response)),
        }
        let media_type = media_type_of(header(&response, "content-type"));
        match media_type.as_str() {
            OCI_MANIFEST => {}
            OCI_INDEX | DOCKER_LIST => {
                return Err(TransportError::MediaType {
                    what: format!("{what} (an image index: slate bundles are single images)"),
                    actual: media_type,
                    expected: OCI_MANIFEST.into(),
                })
            }
            DOCKER_MANIFEST => {
                return Err(TransportError::MediaType {
                    what: format!("{what} (a Docker image manifest)"),
                    actual: media_type,
                    expected: OCI_MANIFEST.into(),
                })
            }
            _ => {
                return Err(TransportError::MediaType {
                    what: format!("{what} (the Content-Type of the answer)"),
                    actual: media_type,
                    expected: OCI_MANIFEST.into(),
                })
            }
        }
        let announced = header(&response, "docker-content-digest").map(str::to_owned);
        if let Some(length) = response.body().content_length() {
            if length > MAX_DOCUMENT_BYTES {
                return Err(TransportError::Oversize {
                    what,
                    limit: MAX_DOCUMENT_BYTES,
                });
            }
        }
        let bytes = self.read_small(response, "GET", &url, &what, MAX_DOCUMENT_BYTES)?;
        let digest = Digest::of(&bytes).to_string();
        let expected = if reference.starts_with("sha256:") {
            Some(reference.to_owned())
        } else {
            announced.filter(|d| d.starts_with("sha256:"))
        };
        if let Some(expected) = expected {
            if expected != digest {
                return Err(TransportError::DigestMismatch {
                    what,
                    expected,
                    actual: digest,
                });
            }
        }
        Ok(Some(Manifest {
            bytes,
            digest,
            media_type,
        }))
    }

    /// The blob from `offset` (a `Range` request): returns where the body starts, which is 0
    /// when the registry ignored the range and sends the whole blob.
    pub fn get_blob(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        offset: u64,
    ) -> Result<(u64, Box<dyn Read>), TransportError> {
        let url = self.url(&format!("blobs/{digest}"));
        let range = format!("bytes={offset}-");
        let headers: &[(&str, &str)] = if offset > 0 {
            &[("Range", &range)]
        } else {
            &[]
        };
        let mut response = self.send("GET", &url, headers, Body::Empty)?;
        if response.status() == 416 && offset > 0 {
            // The range is not satisfiable (the registry disagrees about the size): start over.
            response = self.send("GET", &url, &[], Body::Empty)?;
        }
        let from = match response.status().as_u16() {
            200 => 0,
            206 if offset > 0 => {
                let start = header(&response, "content-range")
                    .and_then(|v| v.trim().strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.trim().parse::<u64>().ok());
                match start {
                    Some(start) if start == offset => offset,
                    Some(start) => {
                        return Err(TransportError::malformed(
                            format!("the partial answer for {what}"),
                            format!("it starts at byte {start}, not at {offset} as asked"),
                        ))
                    }
                    None => {
                        return Err(TransportError::malformed(
                            format!("the partial answer for {what}"),
                            "it has no valid Content-Range",
                        ))
                    }
                }
            }
            404 => {
                return Err(TransportError::NotFound {
                    what: what.to_owned(),
                    location: url,
                })
            }
            _ => return Err(Self::status_error("GET", &url, response)),
        };
        if let Some(length) = response.body().content_length() {
            // A hostile length must not overflow: past u64 it is no blob's size.
            match from.checked_add(length) {
                Some(total) if total == size => {}
                Some(total) => {
                    return Err(TransportError::SizeMismatch {
                        what: format!("{what} (as announced by the registry's Content-Length)"),
                        expected: size,
                        actual: total,
                    })
                }
                None => {
                    return Err(TransportError::malformed(
                        format!("the answer for {what}"),
                        format!("its Content-Length, {length} bytes from byte {from}, is more than any blob"),
                    ))
                }
            }
        }
        Ok((from, Box::new(response.into_body().into_reader())))
    }

    /// `length` bytes of the blob from `offset`, by `Range: bytes=a-b` (a delta's chunk, issue
    /// 41). A registry that answers with the whole blob instead is refused rather than read: a
    /// delta of many chunks would download the blob once per chunk; the caller falls back to one
    /// whole download.
    pub fn get_range(
        &self,
        what: &str,
        digest: &str,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, TransportError> {
        let url = self.url(&format!("blobs/{digest}"));
        let last = offset + length.max(1) - 1;
        let range = format!("bytes={offset}-{last}");
        let response = self.send("GET", &url, &[("Range", &range)], Body::Empty)?;
        match response.status().as_u16() {
            206 => {}
            200 => {
                return Err(TransportError::malformed(
                    format!("the answer for {what}"),
                    "the registry ignored the range asked for (200, not 206)",
                ))
            }
            404 => {
                return Err(TransportError::NotFound {
                    what: what.to_owned(),
                    location: url,
                })
            }
            _ => return Err(Self::status_error("GET", &url, response)),
        }
        let answered = header(&response, "content-range")
            .and_then(|v| v.trim().strip_prefix("bytes "))
            .and_then(|v| v.split('/').next())
            .map(str::to_owned);
        if answered.as_deref() != Some(&range["bytes=".len()..]) {
            return Err(TransportError::malformed(
                format!("the partial answer for {what}"),
                format!("its Content-Range is {answered:?}, not {range:?} as asked"),
            ));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(length).unwrap_or(0));
        response
            .into_body()
            .into_reader()
            .take(length + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| TransportError::malformed(format!("the answer for {what}"), e))?;
        if bytes.len() as u64 != length {
            return Err(TransportError::SizeMismatch {
                what: what.to_owned(),
                expected: length,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// Whether the registry already has the blob.
    pub fn has_blob(&self, what: &str, digest: &str, size: u64) -> Result<bool, TransportError> {
        let url = self.url(&format!("blobs/{digest}"));
        let response = self.send("HEAD", &url, &[], Body::Empty)?;
        match response.status().as_u16() {
            200 => match header(&response, "content-length").and_then(|v| v.parse::<u64>().ok()) {
                Some(length) if length != size => Err(TransportError::SizeMismatch {
                    what: format!("{what} (on the registry)"),
                    expected: size,
                    actual: length,
                }),
                _ => Ok(true),
            },
            404 => Ok(false),
            _ => Err(Self::status_error("HEAD", &url, response)),
        }
    }

    /// Store a manifest under `reference` (a tag, or its digest).
    pub fn put_manifest(&self, reference: &str, manifest: &Manifest) -> Result<(), TransportError> {
        let url = self.url(&format!("manifests/{reference}"));
        let response = self.send(
            "PUT",
            &url,
            &[("Content-Type", &manifest.media_type)],
            Body::Bytes(&manifest.bytes),
        )?;
        if response.status() != 201 {
            return Err(Self::status_error("PUT", &url, response));
        }
        if let Some(answered) = header(&response, "docker-content-digest") {
            if answered != manifest.digest {
                return Err(TransportError::DigestMismatch {
                    what: format!("the manifest stored at {url}"),
                    expected: manifest.digest.clone(),
                    actual: answered.to_owned(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    #[test]
    fn https_unless_loopback_or_insecure() {
        let client = |insecure| {
            Client::new(Options {
                insecure,
                ..Options::default()
            })
        };
        let remote = Registry::new("registry.example:5000", "os", &client(false), false).unwrap();
        assert_eq!(remote.describe(), "https://registry.example:5000/v2/os");
        assert!(remote.is_own("https://registry.example:5000/v2/os/blobs/x"));
        assert!(!remote.is_own("https://registry.example:5000.evil/v2/"));
        assert!(!remote.is_own("http://registry.example:5000/v2/os/blobs/x"));
        let plain = Registry::new("registry.example:5000", "os", &client(true), false).unwrap();
        assert_eq!(plain.describe(), "http://registry.example:5000/v2/os");
        let local = Registry::new("[::1]:5000", "a/b", &client(false), false).unwrap();
        assert_eq!(
            local.url("blobs/uploads/"),
            "http://[::1]:5000/v2/a/b/blobs/uploads/"
        );
    }

    #[test]
    fn error_bodies_are_summarized() {
        assert_eq!(
            error_detail(br#"{"errors":[{"code":"MANIFEST_INVALID","message":"manifest invalid","detail":{}}]}"#),
            ": MANIFEST_INVALID: manifest invalid"
        );
        assert_eq!(
            error_detail(b"<html>oops</html>\n"),
            ": \"<html>oops</html>\""
        );
        assert_eq!(error_detail(b""), "");
        assert_eq!(
            media_type_of(Some("Application/JSON; charset=utf-8")),
            "application/json"
        );
    }
}
