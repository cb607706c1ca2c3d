//! Image references: where a bundle lives and which of its images is meant.
//!
//! ```text
//! host[:port]/repository/path[:tag][@sha256:<hex>]   an OCI registry
//! oci-layout:PATH[:TAG][@sha256:<hex>]                a local OCI image layout directory
//! ```
//!
//! The grammar is the OCI distribution one (distribution/reference), with two deliberate
//! restrictions: the registry host is always explicit (no implied Docker Hub, no `library/`), and
//! a digest is sha256 in canonical form ([`Digest::parse`]). Nothing here touches the network or
//! the disk.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use slate_bundle::Digest;

/// The prefix of a local layout reference.
pub const LAYOUT_PREFIX: &str = "oci-layout:";

/// Longest repository name with its host (distribution/reference's limit).
const MAX_NAME_LEN: usize = 255;
/// Longest tag (OCI distribution spec).
const MAX_TAG_LEN: usize = 128;

/// Why a reference was refused: the input and a sentence saying what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {input:?}: {reason}")]
pub struct ReferenceError {
    pub input: String,
    pub reason: String,
}

/// Where the images are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A repository on an OCI registry; `host` includes the port when one was given.
    Registry { host: String, repository: String },
    /// A local OCI image layout directory.
    Layout { path: PathBuf },
}

/// A parsed reference: a location and, optionally, a tag and a digest. When both are given the
/// digest decides what is fetched and the tag is the name it gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    location: Location,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl Reference {
    /// Parse `host[:port]/repo/path[:tag][@sha256:<hex>]` or `oci-layout:PATH[:TAG][@digest]`.
    pub fn parse(input: &str) -> Result<Self, ReferenceError> {
        let fail = |reason: String| ReferenceError {
            input: input.to_owned(),
            reason,
        };
        if input.is_empty() {
            return Err(fail("it is empty".into()));
        }
        if let Some(c) = input.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(fail(format!("it contains {c:?}")));
        }
        match input.strip_prefix(LAYOUT_PREFIX) {
            Some(rest) => parse_layout(rest).map_err(fail),
            None => parse_registry(input).map_err(fail),
        }
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// `sha256:<hex>`, when the reference pins one.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_ref().map(Digest::as_str)
    }

    /// The registry host (with its port), for a registry reference.
    pub fn registry(&self) -> Option<&str> {
        match &self.location {
            Location::Registry { host, .. } => Some(host),
            Location::Layout { .. } => None,
        }
    }

    /// The repository path, for a registry reference.
    pub fn repository(&self) -> Option<&str> {
        match &self.location {
            Location::Registry { repository, .. } => Some(repository),
            Location::Layout { .. } => None,
        }
    }

    /// The directory, for a local layout reference.
    pub fn layout_path(&self) -> Option<&Path> {
        match &self.location {
            Location::Layout { path } => Some(path),
            Location::Registry { .. } => None,
        }
    }

    /// The same location with another tag and no digest.
    pub fn with_tag(&self, tag: &str) -> Result<Self, ReferenceError> {
        check_tag(tag).map_err(|reason| ReferenceError {
            input: tag.to_owned(),
            reason,
        })?;
        Ok(Reference {
            location: self.location.clone(),
            tag: Some(tag.to_owned()),
            digest: None,
        })
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reference::parse(s)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Location::Registry { host, repository } => write!(f, "{host}/{repository}")?,
            Location::Layout { path } => write!(f, "{LAYOUT_PREFIX}{}", path.display())?,
        }
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Split off `@algorithm:encoded` when the text after the last `@` looks like a digest.
fn split_digest(s: &str) -> Result<(&str, Option<Digest>), String> {
    let Some((rest, digest)) = s.rsplit_once('@') else {
        return Ok((s, None));
    };
    let Some((algorithm, _)) = digest.split_once(':') else {
        return Ok((s, None));
    };
    let algorithm_like = !algorithm.is_empty()
        && algorithm
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+._-".contains(&b));
    if !algorithm_like {
        return Ok((s, None));
    }
    let digest = Digest::parse(digest).map_err(|e| e.to_string())?;
    Ok((rest, Some(digest)))
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
pub(crate) fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() {
        return Err("the tag after `:` is empty".into());
    }
    if tag.len() > MAX_TAG_LEN {
        return Err(format!("the tag is longer than {MAX_TAG_LEN} characters"));
    }
    let mut bytes = tag.bytes();
    let first = bytes.next().unwrap_or_default();
    if !(first.is_ascii_alphanumeric() || first == b'_') {
        return Err(format!(
            "the tag {tag:?} must start with a letter, a digit or `_`"
        ));
    }
    if let Some(bad) = tag
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "the tag {tag:?} contains {bad:?} (letters, digits, `_`, `.`, `-` only)"
        ));
    }
    Ok(())
}

fn parse_layout(rest: &str) -> Result<Reference, String> {
    let (rest, digest) = split_digest(rest)?;
    let (path, tag) = match rest.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') => {
            check_tag(tag)?;
            (path, Some(tag.to_owned()))
        }
        _ => (rest, None),
    };
    if path.is_empty() {
        return Err(format!(
            "no directory after `{LAYOUT_PREFIX}` (write {LAYOUT_PREFIX}PATH[:TAG])"
        ));
    }
    Ok(Reference {
        location: Location::Layout { path: path.into() },
        tag,
        digest,
    })
}

fn parse_registry(input: &str) -> Result<Reference, String> {
    if let Some((scheme, _)) = input.split_once("://") {
        return Err(format!(
            "drop the `{scheme}://`: write host[:port]/repository:tag (plain HTTP is chosen for \
             localhost, or with --insecure)"
        ));
    }
    let (name, digest) = split_digest(input)?;
    let Some((host, path)) = name.split_once('/') else {
        return Err(format!(
            "no registry host: write host[:port]/repository:tag (or {LAYOUT_PREFIX}PATH for a \
             local layout)"
        ));
    };
    check_host(host)?;
    let (repository, tag) = match path.rsplit_once(':') {
        Some((repository, tag)) => {
            if tag.contains('/') {
                return Err(format!("{path:?} is not repository[:tag]"));
            }
            check_tag(tag)?;
            (repository, Some(tag.to_owned()))
        }
        None => (path, None),
    };
    check_repository(repository)?;
    if host.len() + 1 + repository.len() > MAX_NAME_LEN {
        return Err(format!("the name is longer than {MAX_NAME_LEN} characters"));
    }
    Ok(Reference {
        location: Location::Registry {
            host: host.to_owned(),
            repository: repository.to_owned(),
        },
        tag,
        digest,
    })
}

/// A DNS name or IPv4 address with an optional port, or a bracketed IPv6 address; and it has to
/// look like a host (a `.`, a port, `localhost` or brackets), so `repo/path:tag` is refused
/// rather than sent to some default registry.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("the registry host before the first `/` is empty".into());
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("the IPv6 host {host:?} lacks its `]`"))?;
        if addr.is_empty()
            || !addr
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err(format!("{host:?} is not a bracketed IPv6 address"));
        }
        let port =
            match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(|| {
                    format!("{host:?}: only `:port` may follow the IPv6 address")
                })?),
            };
        (None, port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        }
    };
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
        if !valid {
            return Err(format!(
                "{host:?}: the port must be a number from 1 to 65535"
            ));
        }
    }
    if let Some(name) = name {
        if name.is_empty() {
            return Err(format!("{host:?}: the host name is empty"));
        }
        for label in name.split('.') {
            let valid = !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !valid {
                return Err(format!(
                    "{host:?} is not a host name (labels of letters, digits and inner `-`, \
                     separated by `.`)"
                ));
            }
        }
        if port.is_none() && !name.contains('.') && name != "localhost" {
            return Err(format!(
                "{host:?} is not a registry host (no `.`, no port, not localhost): write the \
                 registry explicitly, e.g. registry.example:5000/{host}/..."
            ));
        }
    }
    Ok(())
}

/// `component(/component)*`, each `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn check_repository(repository: &str) -> Result<(), String> {
    if repository.is_empty() {
        return Err("no repository after the registry host".into());
    }
    for component in repository.split('/') {
        if component.is_empty() {
            return Err(format!("{repository:?} has an empty path component"));
        }
        if component.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(format!("{repository:?}: repository names are lowercase"));
        }
        if !valid_component(component) {
            return Err(format!(
                "{repository:?}: the component {component:?} must be lowercase letters and \
                 digits, joined by `.`, `_`, `__` or dashes"
            ));
        }
    }
    Ok(())
}

fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        // A run of alphanumerics.
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        // A separator: `.`, `_`, `__` or one or more `-`.
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += if bytes.get(i + 1) == Some(&b'_') {
                    2
                } else {
                    1
                }
            }
            b'-' => {
                while bytes.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn ok(s: &str) -> Reference {
        let r = Reference::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(r.to_string(), s, "display round-trips");
        assert_eq!(Reference::parse(&r.to_string()).unwrap(), r);
        r
    }

    fn err(s: &str, contains: &str) {
        let e = Reference::parse(s).expect_err(s).to_string();
        assert!(e.contains(contains), "{s}: {e:?} lacks {contains:?}");
    }

    #[test]
    fn registry_with_port_and_tag() {
        let r = ok("127.0.0.1:5000/slate/demo/installer:2.0.0");
        assert_eq!(r.registry(), Some("127.0.0.1:5000"));
        assert_eq!(r.repository(), Some("slate/demo/installer"));
        assert_eq!(r.tag(), Some("2.0.0"));
        assert_eq!(r.digest(), None);
        assert_eq!(r.layout_path(), None);
    }

    #[test]
    fn registry_by_digest_and_both() {
        let r = ok(&format!("registry.example/os@sha256:{HEX}"));
        assert_eq!(r.registry(), Some("registry.example"));
        assert_eq!(r.repository(), Some("os"));
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest(), Some(format!("sha256:{HEX}").as_str()));
        let r = ok(&format!("localhost:5000/os:v2@sha256:{HEX}"));
        assert_eq!(r.tag(), Some("v2"));
        assert!(r.digest().is_some());
    }

    #[test]
    fn registry_hosts() {
        ok("localhost/os:1");
        ok("[::1]:5000/os:1");
        ok("[::1]/os:1");
        ok("a-b.example.com/x/y/z:latest");
        ok("example.com/os"); // no tag: a push destination
        ok("r.example/a__b/c.d/e--f/g_h:_x.Y-1");
    }

    #[test]
    fn layouts() {
        let r = ok("oci-layout:/var/cache/slate");
        assert_eq!(r.layout_path(), Some(Path::new("/var/cache/slate")));
        assert_eq!(r.tag(), None);
        let r = ok("oci-layout:bundle-v2:2.0.0");
        assert_eq!(r.layout_path(), Some(Path::new("bundle-v2")));
        assert_eq!(r.tag(), Some("2.0.0"));
        let r = ok("oci-layout:/tmp/a:b/c");
        assert_eq!(r.layout_path(), Some(Path::new("/tmp/a:b/c")));
        assert_eq!(r.tag(), None);
        let r = ok("oci-layout:/tmp/x:y:v1");
        assert_eq!(r.layout_path(), Some(Path::new("/tmp/x:y")));
        let r = ok(&format!("oci-layout:dir:v1@sha256:{HEX}"));
        assert_eq!(r.tag(), Some("v1"));
        assert!(r.digest().is_some());
        let r = ok("oci-layout:me@host/dir");
        assert_eq!(r.layout_path(), Some(Path::new("me@host/dir")));
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        err("", "empty");
        err("os:1.0", "no registry host");
        err("ubuntu/os:1.0", "not a registry host");
        err("https://r.example/os:1", "drop the `https://`");
        err("r.example/OS:1", "lowercase");
        err("r.example/os:", "tag after `:` is empty");
        err("r.example/os:-x", "must start with");
        err("r.example/os:a+b", "contains '+'");
        err(
            &format!("r.example/os:{}", "a".repeat(129)),
            "longer than 128",
        );
        err("r.example/os@sha512:abcd", "sha256 only");
        err("r.example/os@sha256:abcd", "64 lowercase hex");
        err(
            &format!("r.example/os@sha256:{}", HEX.to_uppercase()),
            "64 lowercase hex",
        );
        err("r.example:0/os:1", "port must be");
        err("r.example:99999/os:1", "port must be");
        err("r.example:http/os:1", "port must be");
        err("-r.example/os:1", "not a host name");
        err("r..example/os:1", "not a host name");
        err("r.example/", "no repository");
        err("r.example//os", "empty path component");
        err("r.example/os-/x:1", "component \"os-\"");
        err("r.example/a...b:1", "component");
        err("/os:1", "host before the first `/` is empty");
        err("[::1/os:1", "lacks its `]`");
        err("[zz]:5000/os:1", "IPv6");
        err("r.example/os 1", "contains ' '");
        err("oci-layout:", "no directory");
        err("oci-layout::v1", "no directory");
        err("oci-layout:dir:", "tag after `:` is empty");
        err("oci-layout:dir:a b", "contains ' '");
        err("oci-layout:dir@sha256:xyz", "64 lowercase hex");
        err(
            &format!("r.example/a{}:1", "/a".repeat(130)),
            "longer than 255",
        );
    }

    #[test]
    fn with_tag_keeps_the_location() {
        let r = ok(&format!("localhost:5000/os@sha256:{HEX}"));
        assert_eq!(
            r.with_tag("sha256-x.sig").unwrap().to_string(),
            "localhost:5000/os:sha256-x.sig"
        );
        assert!(r.with_tag("bad tag").is_err());
    }
}
