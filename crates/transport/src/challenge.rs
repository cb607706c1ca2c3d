//! The pure half of registry authentication: a `WWW-Authenticate` challenge taken apart, and
//! the host and port a URL or `host[:port]` names (which decide where credentials may go,
//! `registry/auth.rs`). Built without the HTTP stack, so the fuzz targets reach it.

/// Whether `host` (with its port) is this machine: such registries are spoken to over plain
/// HTTP, as Docker does, and may receive credentials over it.
pub fn is_loopback(host: &str) -> bool {
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        host.split(':').next().unwrap_or_default()
    };
    name.eq_ignore_ascii_case("localhost")
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `key="value"` pairs of a `WWW-Authenticate` challenge, and its scheme.
pub fn parse_challenge(value: &str) -> (String, Vec<(String, String)>) {
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

/// A host and port as a URL or a `host[:port]` names them: the host lower-cased (IPv6 in
/// brackets), the port absent when it was not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub host: String,
    pub port: Option<u16>,
}

impl Authority {
    /// `host`, `host:port`, `[v6]`, `[v6]:port`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.rsplit('@').next()?;
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (v6, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            };
            (format!("[{}]", v6.to_ascii_lowercase()), port)
        } else {
            match text.split_once(':') {
                Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
                None => (text.to_ascii_lowercase(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return None;
        }
        let port = match port {
            Some(p) => Some(p.parse::<u16>().ok()?),
            None => None,
        };
        Some(Authority { host, port })
    }

    /// The scheme (`http` or `https`) and the authority of an absolute URL.
    pub fn of_url(url: &str) -> Option<(&str, Self)> {
        let (scheme, rest) = url.split_once("://")?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => "http",
            "https" => "https",
            _ => return None,
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        Some((scheme, Authority::parse(&rest[..end])?))
    }

    /// The port, or the default of `scheme` (`https` 443, otherwise 80).
    pub fn port_for(&self, scheme: &str) -> u16 {
        self.port
            .unwrap_or(if scheme == "https" { 443 } else { 80 })
    }

    /// Whether both name the same host and port (an absent port being the scheme's default).
    pub fn same(&self, scheme: &str, other: &Authority, other_scheme: &str) -> bool {
        self.host == other.host && self.port_for(scheme) == other.port_for(other_scheme)
    }

    /// `host[:port]` as written back.
    pub fn display(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.host),
            None => self.host.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "localhost",
            "LOCALHOST:5000",
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
    fn authorities_parse_and_compare() {
        let a = |s: &str| Authority::parse(s).unwrap();
        assert_eq!(a("Reg.Example:5000").host, "reg.example");
        assert_eq!(a("[::1]:5000").port, Some(5000));
        assert_eq!(a("[::1]").port, None);
        for bad in ["", ":5000", "host:port", "host:99999", "[::1", "[]"] {
            assert!(Authority::parse(bad).is_none(), "{bad}");
        }
        let (scheme, url) = Authority::of_url("HTTPS://user@Auth.Example/token?x=1").unwrap();
        assert_eq!((scheme, url.clone()), ("https", a("auth.example")));
        assert!(url.same("https", &a("auth.example:443"), "https"));
        assert!(!url.same("https", &a("auth.example"), "http"));
        assert!(Authority::of_url("ftp://x/y").is_none());
    }
}
