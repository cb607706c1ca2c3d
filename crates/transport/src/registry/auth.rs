//! Authentication: `WWW-Authenticate` challenges, basic credentials, bearer tokens — and where
//! credentials may go. The credentials belong to the registry's host: they are sent to it, and to
//! a token service the registry names only when that service is on the same host (and port) or
//! the user allowed its host ([`crate::Client::credential_hosts`]); any other token service is
//! asked for an anonymous token. Credentials never travel over plain HTTP to a host that is not
//! this machine, and neither does a token earned with them.

use base64::Engine as _;
use ureq::http;
use ureq::SendBody;

use super::{with_query, Registry, MAX_SMALL_BODY};
pub(crate) use crate::challenge::{is_loopback, parse_challenge, Authority};
use crate::{Credentials, TransportError};

/// Where the registry's credentials may go.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    credentials: Option<Credentials>,
    /// The registry: its scheme and authority.
    scheme: &'static str,
    registry: Authority,
    /// Other hosts the user allowed to receive the credentials (token services).
    allowed: Vec<Authority>,
}

/// What to do with the credentials for one URL.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Send them (as basic authentication).
    Send,
    /// Do not send them: the URL is on another host (or there are none).
    Withhold,
}

impl Policy {
    /// The credentials of the registry at `host` (as a reference names it) spoken to over
    /// `scheme`; `allowed` are further `host[:port]`s, refused when they do not parse.
    pub fn new(
        credentials: Option<Credentials>,
        scheme: &'static str,
        host: &str,
        allowed: &[String],
    ) -> Result<Self, TransportError> {
        let registry = Authority::parse(host)
            .ok_or_else(|| TransportError::Usage(format!("{host:?} is not a host[:port]")))?;
        let allowed = allowed
            .iter()
            .map(|a| {
                Authority::parse(a.trim()).ok_or_else(|| {
                    TransportError::Usage(format!(
                        "{a:?} is not a host[:port] that credentials may be sent to"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Policy {
            credentials,
            scheme,
            registry,
            allowed,
        })
    }

    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// `Authorization: Basic …` of the credentials.
    fn basic(&self) -> Option<String> {
        self.credentials.as_ref().map(|c| {
            let pair = format!("{}:{}", c.username, c.password);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        })
    }

    /// Whether the credentials go to `url`: only to the registry's host and the allowed ones,
    /// and never in clear to a host that is not this machine (an error naming the host).
    pub fn decide(&self, url: &str) -> Result<Decision, TransportError> {
        if self.credentials.is_none() {
            return Ok(Decision::Withhold);
        }
        let Some((scheme, target)) = Authority::of_url(url) else {
            return Ok(Decision::Withhold);
        };
        let theirs = target.same(scheme, &self.registry, self.scheme)
            || self.allowed.iter().any(|a| {
                a.host == target.host && a.port.is_none_or(|p| p == target.port_for(scheme))
            });
        if !theirs {
            return Ok(Decision::Withhold);
        }
        Self::in_clear_check(url, scheme, &target)?;
        Ok(Decision::Send)
    }

    /// Credentials (or a token earned with them) may cross plain HTTP only to this machine.
    fn in_clear_check(url: &str, scheme: &str, target: &Authority) -> Result<(), TransportError> {
        if scheme == "http" && !is_loopback(&target.display()) {
            return Err(TransportError::CleartextCredentials {
                url: url.to_owned(),
                host: target.display(),
            });
        }
        Ok(())
    }

    /// The registry as `host[:port]`.
    pub fn registry(&self) -> String {
        self.registry.display()
    }
}

impl Registry {
    /// Answer a 401's challenge: basic credentials (only for the registry itself), or a bearer
    /// token from the challenge's realm — asked with the credentials only where
    /// [`Policy::decide`] allows, anonymously elsewhere.
    pub(super) fn authenticate(&self, url: &str, challenge: &str) -> Result<(), TransportError> {
        let unauthorized = || TransportError::Unauthorized {
            url: url.to_owned(),
            challenge: challenge.to_owned(),
        };
        let (scheme, params) = parse_challenge(challenge);
        let param = |key: &str| {
            params
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let value = match scheme.as_str() {
            "basic" => {
                if !self.is_own(url) || self.auth.decide(url)? != Decision::Send {
                    return Err(unauthorized());
                }
                self.auth.basic().ok_or_else(unauthorized)?
            }
            "bearer" => {
                let realm = param("realm").ok_or_else(unauthorized)?;
                let Some((_, realm_host)) = Authority::of_url(realm) else {
                    return Err(TransportError::malformed(
                        format!("the authentication challenge of {url}"),
                        format!("its realm {realm:?} is not an http(s) URL"),
                    ));
                };
                let actions = if self.push { "pull,push" } else { "pull" };
                let scope = format!("repository:{}:{actions}", self.repository);
                let mut token_url = with_query(realm, "scope", &scope);
                if let Some(service) = param("service") {
                    token_url = with_query(&token_url, "service", service);
                }
                let send = self.auth.decide(&token_url)? == Decision::Send;
                if send {
                    // A token earned with the credentials is as secret as they are.
                    if let Some((scheme, registry)) = Authority::of_url(&self.base) {
                        Policy::in_clear_check(url, scheme, &registry)?;
                    }
                }
                let token = self.fetch_token(&token_url, send.then(|| self.auth.basic()).flatten());
                match token {
                    Err(TransportError::Status {
                        status: 401 | 403,
                        detail,
                        ..
                    }) if !send && self.auth.has_credentials() => {
                        return Err(TransportError::CredentialsWithheld {
                            url: token_url,
                            host: realm_host.display(),
                            registry: self.auth.registry(),
                            detail,
                        })
                    }
                    token => format!("Bearer {}", token?),
                }
            }
            _ => return Err(unauthorized()),
        };
        *self.authorization.lock().expect("not poisoned") = Some(value);
        Ok(())
    }

    /// A token from the token service at `token_url`, asked with `basic` credentials or
    /// anonymously.
    fn fetch_token(
        &self,
        token_url: &str,
        basic: Option<String>,
    ) -> Result<String, TransportError> {
        let mut request = http::Request::builder().method("GET").uri(token_url);
        if let Some(basic) = &basic {
            request = request.header("Authorization", basic);
        }
        let request = request
            .body(SendBody::none())
            .map_err(|e| Self::http_error("GET", token_url, ureq::Error::Http(e)))?;
        let response = self
            .agent
            .run(request)
            .map_err(|e| Self::http_error("GET", token_url, e))?;
        if response.status() != 200 {
            return Err(Self::status_error("GET", token_url, response));
        }
        let body = self.read_small(
            response,
            "GET",
            token_url,
            "the token answer",
            MAX_SMALL_BODY,
        )?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let what = || format!("the token answer of {token_url}");
        let token: Token =
            serde_json::from_slice(&body).map_err(|e| TransportError::malformed(what(), e))?;
        token
            .token
            .or(token.access_token)
            .ok_or_else(|| TransportError::malformed(what(), "it has no token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(scheme: &'static str, host: &str, allowed: &[&str]) -> Policy {
        let credentials = Some(Credentials {
            username: "u".into(),
            password: "p".into(),
        });
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        Policy::new(credentials, scheme, host, &allowed).unwrap()
    }

    /// issue 19: credentials only to their registry, never in clear to another machine.
    #[test]
    fn credentials_go_only_to_their_registry_and_never_in_clear() {
        use Decision::*;
        let remote = policy("https", "registry.example", &["auth.example"]);
        for (url, expected) in [
            ("https://registry.example/token", Send),
            ("https://REGISTRY.example:443/v2/", Send),
            ("https://registry.example:5001/token", Withhold),
            ("https://evil.example/token", Withhold),
            ("https://auth.example/token", Send),
            ("https://auth.example:8443/token", Send),
            ("not a url", Withhold),
            // Another port (80 is not 443): another service.
            ("http://registry.example/token", Withhold),
        ] {
            assert_eq!(remote.decide(url).unwrap(), expected, "{url}");
        }
        // The same host, or an allowed one, over plain HTTP: refused, naming the host.
        for url in [
            "http://registry.example:443/token",
            "http://auth.example:8080/token",
        ] {
            let err = remote.decide(url).unwrap_err();
            assert!(
                matches!(&err, TransportError::CleartextCredentials { .. }),
                "{url}: {err:?}"
            );
            let host = Authority::of_url(url).unwrap().1.display();
            assert!(err.to_string().contains(&host), "{err}");
        }
        // An insecure registry that is not this machine: its own basic credentials are refused.
        let insecure = policy("http", "10.0.0.5:5000", &[]);
        let err = insecure.decide("http://10.0.0.5:5000/v2/os/").unwrap_err();
        assert!(err.to_string().contains("to 10.0.0.5:5000"), "{err}");
        assert_eq!(
            insecure.decide("http://10.0.0.6:5000/token").unwrap(),
            Withhold
        );
        // Loopback registries get them over plain HTTP.
        let local = policy("http", "127.0.0.1:5000", &["localhost:5001"]);
        assert_eq!(local.decide("http://127.0.0.1:5000/t").unwrap(), Send);
        assert_eq!(local.decide("http://localhost:5001/t").unwrap(), Send);
        assert_eq!(local.decide("http://localhost:5002/t").unwrap(), Withhold);
        assert_eq!(local.decide("http://127.0.0.1:5002/t").unwrap(), Withhold);
        // No credentials: nothing to decide.
        let none = Policy::new(None, "https", "registry.example", &[]).unwrap();
        assert_eq!(none.decide("https://registry.example/").unwrap(), Withhold);
        assert!(Policy::new(None, "https", "r", &["bad:host:x".into()]).is_err());
    }
}
