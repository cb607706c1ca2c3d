//! The OCI distribution protocol, the part slate needs, over blocking `ureq` (rustls on ring,
//! webpki roots): manifests by tag or digest (capped, typed, verified), blobs with `Range`
//! resumption, HEAD checks, monolithic and chunked uploads, manifests by tag; anonymous or basic
//! bearer-token authentication. Plain HTTP for loopback registries or with `insecure`.

use std::io::Read;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use slate_bundle::{Digest, Hasher, MAX_DOCUMENT_BYTES};
use ureq::http::{self, Response};
use ureq::SendBody;

use crate::{Credentials, Event, Options, TransportError};

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

/// Whether `host` (with its port) is this machine: such registries are spoken to over plain
/// HTTP, as Docker does.
pub(crate) fn is_loopback(host: &str) -> bool {
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        host.split(':').next().unwrap_or_default()
    };
    name == "localhost"
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(5)
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        .user_agent(concat!("slate/", env!("CARGO_PKG_VERSION")))
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(120)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .build();
    ureq::Agent::new_with_config(config)
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
    credentials: Option<Credentials>,
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

/// The `Location` of an upload, made absolute against `base`.
fn absolute(base: &str, location: &str) -> Result<String, String> {
    if location.starts_with("http://") || location.starts_with("https://") {
        Ok(location.to_owned())
    } else if location.starts_with('/') {
        Ok(format!("{base}{location}"))
    } else {
        Err(format!(
            "the upload location {location:?} is not a URL or an absolute path"
        ))
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

/// `key="value"` pairs of a `WWW-Authenticate` challenge, and its scheme.
pub(crate) fn parse_challenge(value: &str) -> (String, Vec<(String, String)>) {
    let value = value.trim();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            params.push((key.trim().to_ascii_lowercase(), String::new()));
            continue;
        }
        let mut val = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => val.extend(chars.next()),
                    '"' => break,
                    c => val.push(c),
                }
            }
        } else {
            val = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        params.push((key.trim().to_ascii_lowercase(), val.trim().to_owned()));
    }
    (scheme.to_ascii_lowercase(), params)
}

/// Progress and a running hash over what is sent.
struct Sending<'a, 'p> {
    inner: &'a mut dyn Read,
    hasher: &'a mut Hasher,
    progress: &'a mut (dyn FnMut(Event<'_>) + 'p),
}

impl Read for Sending<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        if n > 0 {
            (self.progress)(Event::Bytes(n as u64));
        }
        Ok(n)
    }
}

impl Registry {
    pub fn new(host: &str, repository: &str, options: &Options, push: bool) -> Self {
        let scheme = if options.insecure || is_loopback(host) {
            "http"
        } else {
            "https"
        };
        Registry {
            agent: agent(),
            base: format!("{scheme}://{host}"),
            repository: repository.to_owned(),
            credentials: options.credentials.clone(),
            push,
            authorization: Mutex::new(None),
        }
    }

    pub fn describe(&self) -> String {
        format!("{}/v2/{}", self.base, self.repository)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.repository)
    }

    fn http_error(method: &str, url: &str, source: ureq::Error) -> TransportError {
        if matches!(source, ureq::Error::Protocol(_)) {
            return TransportError::NotHttp {
                method: method.to_owned(),
                url: url.to_owned(),
                source: Box::new(source),
            };
        }
        TransportError::Http {
            method: method.to_owned(),
            url: url.to_owned(),
            source: Box::new(source),
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
        if let Some(auth) = self.authorization.lock().expect("not poisoned").clone() {
            request = request.header("Authorization", auth);
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

    fn authenticate(&self, url: &str, challenge: &str) -> Result<(), TransportError> {
        let unauthorized = || TransportError::Unauthorized {
            url: url.to_owned(),
            challenge: challenge.to_owned(),
        };
        let basic = self.credentials.as_ref().map(|c| {
            let pair = format!("{}:{}", c.username, c.password);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        let (scheme, params) = parse_challenge(challenge);
        let param = |key: &str| {
            params
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let value = match scheme.as_str() {
            "basic" => basic.ok_or_else(unauthorized)?,
            "bearer" => {
                let realm = param("realm").ok_or_else(unauthorized)?;
                if !(realm.starts_with("https://") || realm.starts_with("http://")) {
                    return Err(TransportError::malformed(
                        format!("the authentication challenge of {url}"),
                        format!("its realm {realm:?} is not an http(s) URL"),
                    ));
                }
                let actions = if self.push { "pull,push" } else { "pull" };
                let scope = format!("repository:{}:{actions}", self.repository);
                let mut token_url = with_query(realm, "scope", &scope);
                if let Some(service) = param("service") {
                    token_url = with_query(&token_url, "service", service);
                }
                let mut request = http::Request::builder().method("GET").uri(&token_url);
                if let Some(basic) = &basic {
                    request = request.header("Authorization", basic);
                }
                let request = request
                    .body(SendBody::none())
                    .map_err(|e| Self::http_error("GET", &token_url, ureq::Error::Http(e)))?;
                let response = self
                    .agent
                    .run(request)
                    .map_err(|e| Self::http_error("GET", &token_url, e))?;
                if response.status() != 200 {
                    return Err(Self::status_error("GET", &token_url, response));
                }
                let body = self.read_small(
                    response,
                    "GET",
                    &token_url,
                    "the token answer",
                    MAX_SMALL_BODY,
                )?;
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let token: Token = serde_json::from_slice(&body).map_err(|e| {
                    TransportError::malformed(format!("the token answer of {token_url}"), e)
                })?;
                let token = token.token.or(token.access_token).ok_or_else(|| {
                    TransportError::malformed(
                        format!("the token answer of {token_url}"),
                        "it has no token",
                    )
                })?;
                format!("Bearer {token}")
            }
            _ => return Err(unauthorized()),
        };
        *self.authorization.lock().expect("not poisoned") = Some(value);
        Ok(())
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
            .take(limit + 1)
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
            if from + length != size {
                return Err(TransportError::SizeMismatch {
                    what: format!("{what} (as announced by the registry's Content-Length)"),
                    expected: size,
                    actual: from + length,
                });
            }
        }
        Ok((from, Box::new(response.into_body().into_reader())))
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

    /// Upload `size` bytes of `reader` as `digest`: one PUT when it fits in `chunk`, PATCHes of
    /// `chunk` bytes and a closing PUT otherwise. What is sent is hashed, so a corrupt local blob
    /// is named as such.
    pub fn upload_blob(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        reader: &mut dyn Read,
        chunk: u64,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), TransportError> {
        let start_url = self.url("blobs/uploads/");
        let response = self.send("POST", &start_url, &[], Body::Empty)?;
        if response.status() != 202 {
            return Err(Self::status_error("POST", &start_url, response));
        }
        let mut location = self.location(&response, "POST", &start_url)?;
        let mut hasher = Hasher::new();
        let chunk = chunk.max(1);
        let octets = ("Content-Type", "application/octet-stream");
        let check_local = |hasher: Hasher| -> Result<(), TransportError> {
            let actual = hasher.finish();
            if actual != digest {
                return Err(TransportError::DigestMismatch {
                    what: format!("{what} (the local copy)"),
                    expected: digest.to_owned(),
                    actual: actual.to_string(),
                });
            }
            Ok(())
        };
        if size <= chunk {
            let url = with_query(&location, "digest", digest);
            let mut limited = reader.take(size);
            let mut sending = Sending {
                inner: &mut limited,
                hasher: &mut hasher,
                progress,
            };
            let response = self.send("PUT", &url, &[octets], Body::Reader(&mut sending, size))?;
            let status = response.status().as_u16();
            check_local(hasher)?;
            if status != 201 {
                return Err(Self::status_error("PUT", &url, response));
            }
            return Ok(());
        }
        let mut sent = 0u64;
        while sent < size {
            let len = chunk.min(size - sent);
            let range = format!("{sent}-{}", sent + len - 1);
            let mut limited = (&mut *reader).take(len);
            let mut sending = Sending {
                inner: &mut limited,
                hasher: &mut hasher,
                progress: &mut *progress,
            };
            let response = self.send(
                "PATCH",
                &location,
                &[octets, ("Content-Range", &range)],
                Body::Reader(&mut sending, len),
            )?;
            if response.status() != 202 {
                return Err(Self::status_error("PATCH", &location, response));
            }
            location = self.location(&response, "PATCH", &location)?;
            sent += len;
        }
        check_local(hasher)?;
        let url = with_query(&location, "digest", digest);
        let response = self.send("PUT", &url, &[octets], Body::Empty)?;
        if response.status() != 201 {
            return Err(Self::status_error("PUT", &url, response));
        }
        Ok(())
    }

    fn location(
        &self,
        response: &Response<ureq::Body>,
        method: &str,
        url: &str,
    ) -> Result<String, TransportError> {
        let location = header(response, "location").ok_or_else(|| {
            TransportError::malformed(
                format!("the answer to {method} {url}"),
                "it has no Location",
            )
        })?;
        absolute(&self.base, location).map_err(|reason| {
            TransportError::malformed(format!("the answer to {method} {url}"), reason)
        })
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

    #[test]
    fn loopback_hosts_use_plain_http() {
        for host in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "registry.example",
            "10.0.0.1:5000",
            "[fe80::1]:5000",
            "localhost.example",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn https_unless_loopback_or_insecure() {
        let remote = Registry::new("registry.example:5000", "os", &Options::default(), false);
        assert_eq!(remote.describe(), "https://registry.example:5000/v2/os");
        let insecure = Options {
            insecure: true,
            ..Options::default()
        };
        let plain = Registry::new("registry.example:5000", "os", &insecure, false);
        assert_eq!(plain.describe(), "http://registry.example:5000/v2/os");
        let local = Registry::new("[::1]:5000", "a/b", &Options::default(), false);
        assert_eq!(
            local.url("blobs/uploads/"),
            "http://[::1]:5000/v2/a/b/blobs/uploads/"
        );
    }

    #[test]
    fn challenges_parse() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(scheme, "bearer");
        assert_eq!(
            params,
            [
                ("realm".into(), "https://auth.example/token".into()),
                ("service".into(), "registry.example".into()),
                ("scope".into(), "repository:a/b:pull,push".into()),
            ]
        );
        let (scheme, params) =
            parse_challenge(r#"Basic realm="a \"quoted\" realm", charset=UTF-8"#);
        assert_eq!(scheme, "basic");
        assert_eq!(params[0], ("realm".into(), r#"a "quoted" realm"#.into()));
        assert_eq!(params[1], ("charset".into(), "UTF-8".into()));
        assert_eq!(parse_challenge("").1, []);
    }

    #[test]
    fn upload_locations_and_queries() {
        assert_eq!(
            absolute("http://h:1", "/v2/x/blobs/uploads/u?a=b").unwrap(),
            "http://h:1/v2/x/blobs/uploads/u?a=b"
        );
        assert_eq!(
            absolute("http://h:1", "https://o/u").unwrap(),
            "https://o/u"
        );
        assert!(absolute("http://h:1", "u").is_err());
        assert_eq!(
            with_query("http://h/u?a=b", "digest", "sha256:ab"),
            "http://h/u?a=b&digest=sha256%3Aab"
        );
        assert_eq!(
            with_query("http://h/u", "scope", "repository:a/b:pull"),
            "http://h/u?scope=repository%3Aa%2Fb%3Apull"
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
