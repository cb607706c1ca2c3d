//! HTML pages a service serves beside its JSON routes (the operator's dashboard): the same TLS,
//! roles and limits, an HTML answer with a strict Content-Security-Policy, errors as a short
//! HTML page, and the refusal of cross-site requests a browser holding a client certificate
//! would otherwise send for any page that asks it to.

use base64::Engine;
use hyper::header::{HeaderName, HeaderValue, HOST, ORIGIN};
use hyper::{Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};

use crate::backend::BackendError;
use crate::body::{response, Body};
use crate::http::{backend_error, Reject};
use crate::types::ErrorCode;

/// An HTML document a page route answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// The whole document. Everything in it that came from outside (node ids, versions, event
    /// text) must have gone through [`escape_html`].
    pub html: String,
    /// The text of each inline `<script>` in it, exactly: only these run (their SHA-256 are
    /// the Content-Security-Policy's `script-src`), so a script that slipped in through an
    /// unescaped value would not.
    pub scripts: &'static [&'static str],
}

/// `text` as HTML text or a double- or single-quoted attribute value.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The policy of a page: nothing loads from anywhere (the page is whole: inline SVG and
/// style), only the listed scripts run, they may fetch from this origin only, and no other
/// site may frame the page (a framed page's buttons could be clicked through).
fn content_security_policy(scripts: &[&str]) -> String {
    let hashes: Vec<String> = scripts
        .iter()
        .map(|s| {
            let digest = Sha256::digest(s.as_bytes());
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        })
        .collect();
    let script_src = if hashes.is_empty() {
        "'none'".to_owned()
    } else {
        hashes.join(" ")
    };
    format!(
        "default-src 'none'; script-src {script_src}; style-src 'unsafe-inline'; \
         img-src data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
         base-uri 'none'"
    )
}

fn html_response(status: StatusCode, html: String, scripts: &[&str]) -> Response<Body> {
    let mut r = response(status, "text/html; charset=utf-8", Body::full(html));
    let headers = r.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&content_security_policy(scripts)) {
        headers.insert(HeaderName::from_static("content-security-policy"), csp);
    }
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        // The page shows the fleet as it is now; a cached copy would not.
        ("cache-control", "no-store"),
    ] {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    r
}

/// The answer to a page route: the page, or its error as a short page with the status the
/// JSON routes would give it.
pub(crate) fn page_reply(result: Result<Page, BackendError>) -> Response<Body> {
    match result {
        Ok(page) => html_response(StatusCode::OK, page.html, page.scripts),
        Err(e) => {
            // The JSON routes' status and words, in a page a person reads.
            let status = backend_error(e.clone()).status();
            let message = match e {
                BackendError::Locked(m)
                | BackendError::InvalidArgument(m)
                | BackendError::Unsupported(m)
                | BackendError::NotFound(m)
                | BackendError::PermissionDenied(m)
                | BackendError::Failed(m) => m,
            };
            let html = format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
                 <title>{code} {reason}</title></head><body><h1>{code} {reason}</h1>\
                 <p class=\"error\">{message}</p><p><a href=\"/ui\">The fleet</a></p>\
                 </body></html>",
                code = status.as_u16(),
                reason = status.canonical_reason().unwrap_or(""),
                message = escape_html(&message),
            );
            html_response(status, html, &[])
        }
    }
}

/// Refuses a request that changes something when a browser says another site sent it.
///
/// A browser holding an operator's certificate presents it to this server whatever page made
/// the request, so a hostile page could post to `/v1/fleet/abort` (a form posts JSON-looking
/// `text/plain` without asking first). Browsers name the sender in `Origin` (and
/// `Sec-Fetch-Site`); a request whose origin is not this server's own is refused. Requests
/// without them (the CLI, curl, Prometheus) are not browsers' and pass.
pub(crate) fn check_same_origin<B>(req: &Request<B>) -> Result<(), Reject> {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return Ok(());
    }
    let headers = req.headers();
    let refuse = |why: String| {
        Err(Reject::new(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            format!("a cross-site request is refused: {why}"),
        ))
    };
    if let Some(site) = headers.get("sec-fetch-site") {
        if site.as_bytes() == b"cross-site" || site.as_bytes() == b"same-site" {
            return refuse("the browser says another site sent it".into());
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let host = headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let own = format!("https://{host}");
        if host.is_empty() || origin.as_bytes() != own.as_bytes() {
            let shown = crate::logq::for_log(
                &String::from_utf8_lossy(origin.as_bytes()),
                crate::logq::MAX_LOGGED_FIELD,
            );
            return refuse(format!("it comes from {shown}, not from {own}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        let hostile = r#"<script>alert('x')</script>" onmouseover="x" &amp;"#;
        let escaped = escape_html(hostile);
        assert!(!escaped.contains(['<', '>', '"', '\'']), "{escaped}");
        assert!(escaped.contains("&amp;amp;"), "{escaped}");
    }

    #[test]
    fn only_listed_scripts_may_run() {
        let csp = content_security_policy(&["alert(1)"]);
        // echo -n 'alert(1)' | openssl dgst -sha256 -binary | base64
        assert!(
            csp.contains("script-src 'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='"),
            "{csp}"
        );
        assert!(content_security_policy(&[]).contains("script-src 'none'"));
    }

    #[test]
    fn cross_site_posts_are_refused_and_same_origin_ones_pass() {
        let req = |method: &str, headers: &[(&str, &str)]| {
            let mut b = Request::builder().method(method).uri("/v1/fleet/pause");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap()
        };
        let host = ("host", "127.0.0.1:7000");
        assert!(check_same_origin(&req("POST", &[host])).is_ok(), "the CLI");
        assert!(
            check_same_origin(&req("POST", &[host, ("origin", "https://127.0.0.1:7000")])).is_ok()
        );
        for bad in [
            vec![host, ("origin", "https://evil.example")],
            vec![host, ("origin", "null")],
            vec![("origin", "https://127.0.0.1:7000")],
            vec![host, ("sec-fetch-site", "cross-site")],
        ] {
            assert!(check_same_origin(&req("POST", &bad)).is_err(), "{bad:?}");
        }
        assert!(check_same_origin(&req("GET", &[host, ("origin", "https://evil")])).is_ok());
    }
}
