//! What a FleetLock request must look like (`docs/formats.md §8`): `POST` to one of two
//! paths, the header `fleet-lock-protocol: true`, and a JSON body naming the client and its
//! group. Checked in the order airlock checks (header, then body), after the route.

use std::fmt;

use serde::Deserialize;
use thiserror::Error;

/// `RecursiveLock`: take a reboot slot.
pub const PRE_REBOOT_PATH: &str = "/v1/pre-reboot";
/// `UnlockIfHeld`: give the slot back.
pub const STEADY_STATE_PATH: &str = "/v1/steady-state";
/// The header every request carries, with exactly the value [`PROTOCOL_HEADER_VALUE`], so that
/// a request redirected from elsewhere is never taken for a lock operation.
pub const PROTOCOL_HEADER: &str = "fleet-lock-protocol";
pub const PROTOCOL_HEADER_VALUE: &str = "true";

/// Request bodies are about 100 bytes (zincati's pretty-printed JSON with a 32-character id);
/// the cap leaves room for a 256-byte id escaped six times over and unknown fields.
pub const MAX_BODY_LEN: usize = 8 * 1024;
/// Longest client id, in bytes. zincati sends 32 hex digits; node names fit easily.
pub const MAX_ID_LEN: usize = 256;
/// Longest group name, in bytes: keeps `<group>.json` a valid file name and keys short.
pub const MAX_GROUP_LEN: usize = 128;

/// The two operations of FleetLock v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `POST /v1/pre-reboot`: `RecursiveLock`.
    Lock,
    /// `POST /v1/steady-state`: `UnlockIfHeld`.
    Unlock,
}

impl Operation {
    pub fn path(self) -> &'static str {
        match self {
            Operation::Lock => PRE_REBOOT_PATH,
            Operation::Unlock => STEADY_STATE_PATH,
        }
    }

    /// Exact match, as Go's `ServeMux` matches airlock's two patterns: no trailing slash, no
    /// prefix (the query string is not part of `path`).
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            PRE_REBOOT_PATH => Some(Operation::Lock),
            STEADY_STATE_PATH => Some(Operation::Unlock),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Operation::Lock => "lock",
            Operation::Unlock => "unlock",
        }
    }
}

/// Why a route is refused: an unknown path, or a known one with a method other than POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    NotFound,
    MethodNotAllowed { method: String },
}

/// Which operation `method` `path` asks for. The path is judged first, so that any method on
/// an unknown path is 404 and only the two endpoints answer 405.
pub fn route(method: &str, path: &str) -> Result<Operation, RouteError> {
    let op = Operation::from_path(path).ok_or(RouteError::NotFound)?;
    if method != "POST" {
        return Err(RouteError::MethodNotAllowed {
            // Methods are tokens; the cap keeps a hostile one out of the answer.
            method: method.chars().take(32).collect(),
        });
    }
    Ok(op)
}

/// What is wrong with a client id or a group name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentityError {
    // The first two texts are airlock's own.
    #[error("empty client ID")]
    EmptyId,
    #[error("empty client group")]
    EmptyGroup,
    #[error("client ID is {len} bytes, at most {MAX_ID_LEN} are allowed")]
    IdTooLong { len: usize },
    #[error("client ID contains a control character")]
    IdControl,
    #[error(
        "client ID contains U+{code:04X}, a bidirectional or invisible formatting character \
         (it would make the id print as another)"
    )]
    IdFormatting { code: u32 },
    #[error("client group is {len} bytes, at most {MAX_GROUP_LEN} are allowed")]
    GroupTooLong { len: usize },
    #[error("client group must match ^[a-zA-Z0-9.-]+$")]
    GroupChars,
}

/// Characters that change how the text around them is shown without being seen: the
/// bidirectional embeddings, overrides, isolates and marks (a "Trojan Source" id prints as
/// another one in `status` and in logs), zero-width spaces and joiners, the byte-order mark.
fn is_formatting(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

/// A client id: non-empty, case-sensitive, at most [`MAX_ID_LEN`] bytes, no control or
/// bidirectional/invisible formatting characters (it ends up in logs, in `slate fleetlock status` and in the stored semaphore).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(String);

impl ClientId {
    pub fn new(id: impl Into<String>) -> Result<Self, IdentityError> {
        let id = id.into();
        if id.is_empty() {
            return Err(IdentityError::EmptyId);
        }
        if id.len() > MAX_ID_LEN {
            return Err(IdentityError::IdTooLong { len: id.len() });
        }
        if id.chars().any(char::is_control) {
            return Err(IdentityError::IdControl);
        }
        if let Some(c) = id.chars().find(|&c| is_formatting(c)) {
            return Err(IdentityError::IdFormatting { code: c as u32 });
        }
        Ok(ClientId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A group name: `^[a-zA-Z0-9.-]+$` as the protocol says, at most [`MAX_GROUP_LEN`] bytes.
/// No `/`, so it is safe as a file name component and in an etcd key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(String);

impl GroupName {
    pub fn new(group: impl Into<String>) -> Result<Self, IdentityError> {
        let group = group.into();
        if group.is_empty() {
            return Err(IdentityError::EmptyGroup);
        }
        if group.len() > MAX_GROUP_LEN {
            return Err(IdentityError::GroupTooLong { len: group.len() });
        }
        if !group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        {
            return Err(IdentityError::GroupChars);
        }
        Ok(GroupName(group))
    }

    /// The group zincati uses unless configured otherwise, and the one slate serves when no
    /// `--group` is given.
    pub fn default_group() -> Self {
        GroupName("default".to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for GroupName {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, IdentityError> {
        GroupName::new(s)
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated request: who asks, and for which group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientParams {
    pub id: ClientId,
    pub group: GroupName,
}

/// Why a request's header or body is refused; every variant answers 400
/// `invalid_client_identity` except [`RequestError::TooLarge`] (413).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    // airlock's text.
    #[error("wrong 'fleet-lock-protocol' header")]
    Header,
    #[error("request body is {len} bytes, at most {MAX_BODY_LEN} are allowed")]
    TooLarge { len: usize },
    #[error("body is not a FleetLock request: {0}")]
    Json(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

// Unknown fields are ignored, as airlock's Go decoder ignores them, so that a client that
// sends more (a newer zincati) is still served; `id` and `group` are both required: the
// protocol calls them mandatory and zincati always sends both (its default group is `default`
// on the client side).
#[derive(Deserialize)]
struct RawBody {
    client_params: RawParams,
}

#[derive(Deserialize)]
struct RawParams {
    id: String,
    group: String,
}

/// Checks the `fleet-lock-protocol` header (`None`: absent) and the body, in that order.
pub fn parse_request(header: Option<&[u8]>, body: &[u8]) -> Result<ClientParams, RequestError> {
    if header != Some(PROTOCOL_HEADER_VALUE.as_bytes()) {
        return Err(RequestError::Header);
    }
    parse_body(body)
}

/// The body alone: `{"client_params":{"id":"…","group":"…"}}`, whitespace anywhere (zincati
/// pretty-prints), nothing after the object.
pub fn parse_body(body: &[u8]) -> Result<ClientParams, RequestError> {
    if body.len() > MAX_BODY_LEN {
        return Err(RequestError::TooLarge { len: body.len() });
    }
    let raw: RawBody =
        serde_json::from_slice(body).map_err(|e| RequestError::Json(e.to_string()))?;
    // Group before id, in airlock's order, so both servers give the same first complaint.
    let group = GroupName::new(raw.client_params.group)?;
    let id = ClientId::new(raw.client_params.id)?;
    Ok(ClientParams { id, group })
}

/// The body a client sends (compact JSON), for slate's own client and for tests.
pub fn encode_body(params: &ClientParams) -> Vec<u8> {
    serde_json::json!({
        "client_params": { "id": params.id.as_str(), "group": params.group.as_str() }
    })
    .to_string()
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRUE: Option<&[u8]> = Some(b"true");

    /// What zincati sends: `serde_json::to_string_pretty` of its `ClientParameters`.
    const ZINCATI: &str = "{\n  \"client_params\": {\n    \"id\": \"de35106b6ec24688b63afddaa156679b\",\n    \"group\": \"default\"\n  }\n}";

    #[test]
    fn zincatis_pretty_body_is_accepted() {
        let p = parse_request(TRUE, ZINCATI.as_bytes()).unwrap();
        assert_eq!(p.id.as_str(), "de35106b6ec24688b63afddaa156679b");
        assert_eq!(p.group.as_str(), "default");
        // Field order and unknown fields do not matter.
        let p = parse_request(
            TRUE,
            br#"{"x":1,"client_params":{"group":"workers","id":"Node-A","extra":[]}}"#,
        )
        .unwrap();
        assert_eq!((p.id.as_str(), p.group.as_str()), ("Node-A", "workers"));
    }

    #[test]
    fn the_header_must_be_exactly_true() {
        for h in [
            None,
            Some(&b"false"[..]),
            Some(b"True"),
            Some(b"true "),
            Some(b""),
        ] {
            assert_eq!(
                parse_request(h, ZINCATI.as_bytes()),
                Err(RequestError::Header),
                "{h:?}"
            );
        }
    }

    #[test]
    fn bodies_that_are_refused() {
        type Check = fn(&RequestError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, RequestError::Json(_))),
            ("{", |e| matches!(e, RequestError::Json(_))),
            ("[]", |e| matches!(e, RequestError::Json(_))),
            (
                r#"{"client_params":{"id":"a"}}"#,
                |e| matches!(e, RequestError::Json(m) if m.contains("group")),
            ),
            (
                r#"{"client_params":{"group":"default"}}"#,
                |e| matches!(e, RequestError::Json(m) if m.contains("id")),
            ),
            // The pre-2020 name of the id field is not the id.
            (
                r#"{"client_params":{"node_uuid":"a","group":"default"}}"#,
                |e| matches!(e, RequestError::Json(_)),
            ),
            (r#"{"client_params":{"id":1,"group":"default"}}"#, |e| {
                matches!(e, RequestError::Json(_))
            }),
            (
                r#"{"client_params":{"id":"a","id":"b","group":"default"}}"#,
                |e| matches!(e, RequestError::Json(m) if m.contains("duplicate")),
            ),
            (r#"{"client_params":{"id":"a","group":"default"}} x"#, |e| {
                matches!(e, RequestError::Json(_))
            }),
            (r#"{"client_params":{"id":"","group":"default"}}"#, |e| {
                *e == RequestError::Identity(IdentityError::EmptyId)
            }),
            (r#"{"client_params":{"id":"a","group":""}}"#, |e| {
                *e == RequestError::Identity(IdentityError::EmptyGroup)
            }),
            (r#"{"client_params":{"id":"","group":""}}"#, |e| {
                *e == RequestError::Identity(IdentityError::EmptyGroup)
            }),
            (r#"{"client_params":{"id":"a","group":"a/b"}}"#, |e| {
                *e == RequestError::Identity(IdentityError::GroupChars)
            }),
            (r#"{"client_params":{"id":"a","group":"a b"}}"#, |e| {
                *e == RequestError::Identity(IdentityError::GroupChars)
            }),
            (r#"{"client_params":{"id":"a","group":"grüppe"}}"#, |e| {
                *e == RequestError::Identity(IdentityError::GroupChars)
            }),
            (
                r#"{"client_params":{"id":"a\nb","group":"default"}}"#,
                |e| *e == RequestError::Identity(IdentityError::IdControl),
            ),
            // "Trojan Source": shown right to left, "node-a\u{202E}b-edon" reads as another id.
            (
                r#"{"client_params":{"id":"node-a\u202eb-edon","group":"default"}}"#,
                |e| *e == RequestError::Identity(IdentityError::IdFormatting { code: 0x202E }),
            ),
            (
                "{\"client_params\":{\"id\":\"a\u{2067}b\",\"group\":\"default\"}}",
                |e| *e == RequestError::Identity(IdentityError::IdFormatting { code: 0x2067 }),
            ),
            (
                r#"{"client_params":{"id":"a\u200bb","group":"default"}}"#,
                |e| *e == RequestError::Identity(IdentityError::IdFormatting { code: 0x200B }),
            ),
            (
                r#"{"client_params":{"id":"a\u0007","group":"default"}}"#,
                |e| *e == RequestError::Identity(IdentityError::IdControl),
            ),
        ];
        for (body, ok) in cases {
            let err = parse_request(TRUE, body.as_bytes()).unwrap_err();
            assert!(ok(&err), "{body:?} gave {err:?}");
        }
    }

    #[test]
    fn lengths_are_bounded() {
        let body = |id: &str, group: &str| {
            format!(r#"{{"client_params":{{"id":"{id}","group":"{group}"}}}}"#)
        };
        let max_id = "i".repeat(MAX_ID_LEN);
        let max_group = "g".repeat(MAX_GROUP_LEN);
        assert!(parse_request(TRUE, body(&max_id, &max_group).as_bytes()).is_ok());
        assert_eq!(
            parse_request(TRUE, body(&format!("{max_id}i"), "g").as_bytes()),
            Err(IdentityError::IdTooLong {
                len: MAX_ID_LEN + 1
            }
            .into())
        );
        assert_eq!(
            parse_request(TRUE, body("i", &format!("{max_group}g")).as_bytes()),
            Err(IdentityError::GroupTooLong {
                len: MAX_GROUP_LEN + 1
            }
            .into())
        );
        let big = vec![b' '; MAX_BODY_LEN + 1];
        assert_eq!(
            parse_request(TRUE, &big),
            Err(RequestError::TooLarge {
                len: MAX_BODY_LEN + 1
            })
        );
    }

    #[test]
    fn ids_are_case_sensitive_and_may_be_any_printable_text() {
        let a = ClientId::new("Node-A").unwrap();
        let b = ClientId::new("node-a").unwrap();
        assert_ne!(a, b);
        assert!(ClientId::new("ノード 1 \"quoted\"").is_ok());
    }

    #[test]
    fn routes() {
        assert_eq!(route("POST", "/v1/pre-reboot"), Ok(Operation::Lock));
        assert_eq!(route("POST", "/v1/steady-state"), Ok(Operation::Unlock));
        for path in [
            "/",
            "/v1/pre-reboot/",
            "/v1/Pre-Reboot",
            "/base/v1/pre-reboot",
            "/v2/pre-reboot",
        ] {
            assert_eq!(route("POST", path), Err(RouteError::NotFound), "{path}");
            assert_eq!(route("GET", path), Err(RouteError::NotFound), "{path}");
        }
        for method in ["GET", "PUT", "HEAD", "DELETE", "post"] {
            assert_eq!(
                route(method, "/v1/steady-state"),
                Err(RouteError::MethodNotAllowed {
                    method: method.into()
                })
            );
        }
    }

    #[test]
    fn the_encoded_body_parses_back() {
        let params = ClientParams {
            id: ClientId::new("a \"b\" \\ c").unwrap(),
            group: GroupName::new("web.eu-1").unwrap(),
        };
        assert_eq!(parse_request(TRUE, &encode_body(&params)), Ok(params));
    }
}
