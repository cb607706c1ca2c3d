//! Blob uploads: one `POST` and a `PUT` when the blob fits in a chunk, `PATCH`es of a chunk each
//! and a closing `PUT` otherwise; what is sent is hashed on the way, so a corrupt local blob is
//! named as such.

use std::io::Read;

use ureq::http::Response;

use super::{header, with_query, Body, Registry};
use slate_bundle::Hasher;

use crate::{Event, TransportError};

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
