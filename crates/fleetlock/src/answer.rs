//! The answers: 200 with an empty body, or a status with `{"kind":…,"value":…}`. The kinds are
//! a closed set (the protocol requires bounded cardinality: zincati labels a metric with them);
//! the ones airlock emits keep airlock's names and statuses.

use crate::request::{RequestError, RouteError, PRE_REBOOT_PATH, STEADY_STATE_PATH};

/// Every kind slate's server answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: bad or missing header, bad JSON, bad or empty id or group (airlock).
    InvalidClientIdentity,
    /// 400: a well-formed group the server has no slots for (airlock).
    UnknownGroup,
    /// 404: any path but the two endpoints.
    NotFound,
    /// 405: a method other than POST on an endpoint (as poseidon/fleetlock answers).
    MethodNotAllowed,
    /// 413: a body over [`crate::request::MAX_BODY_LEN`].
    BodyTooLarge,
    /// 500: the group's semaphore could not be read (store unreachable, value corrupt) (airlock).
    FailedSemInit,
    /// 500: the lock or unlock did not happen: every slot taken, a compare-and-swap conflict
    /// that outlived the retries, or a failed write (airlock).
    FailedLock,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::InvalidClientIdentity,
        ErrorKind::UnknownGroup,
        ErrorKind::NotFound,
        ErrorKind::MethodNotAllowed,
        ErrorKind::BodyTooLarge,
        ErrorKind::FailedSemInit,
        ErrorKind::FailedLock,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidClientIdentity => "invalid_client_identity",
            ErrorKind::UnknownGroup => "unknown_group",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::BodyTooLarge => "body_too_large",
            ErrorKind::FailedSemInit => "failed_sem_init",
            ErrorKind::FailedLock => "failed_lock",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidClientIdentity | ErrorKind::UnknownGroup => 400,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::BodyTooLarge => 413,
            ErrorKind::FailedSemInit | ErrorKind::FailedLock => 500,
        }
    }
}

/// A refused request: its kind and a human-readable value (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: ErrorKind,
    pub value: String,
}

impl Refusal {
    pub fn new(kind: ErrorKind, value: impl Into<String>) -> Self {
        Refusal {
            kind,
            value: value.into(),
        }
    }

    /// `{"kind":"…","value":"…"}`.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::json!({ "kind": self.kind.as_str(), "value": self.value })
            .to_string()
            .into_bytes()
    }
}

/// A refusal as a client reads it off a server: `{"kind":…,"value":…}` with any kind (airlock
/// and other servers name kinds slate's does not). What slate's update agent parses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ReceivedRefusal {
    pub kind: String,
    pub value: String,
}

impl ReceivedRefusal {
    /// The refusal in `body`, when it is one.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }
}

impl From<RouteError> for Refusal {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::NotFound => Refusal::new(
                ErrorKind::NotFound,
                format!(
                    "no such endpoint: FleetLock v1 serves POST {PRE_REBOOT_PATH} and POST \
                     {STEADY_STATE_PATH}"
                ),
            ),
            RouteError::MethodNotAllowed { method } => Refusal::new(
                ErrorKind::MethodNotAllowed,
                format!("method {method} not allowed: FleetLock requests are POST"),
            ),
        }
    }
}

impl From<RequestError> for Refusal {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::TooLarge { .. } => Refusal::new(ErrorKind::BodyTooLarge, e.to_string()),
            // airlock's prefix, so that logs read the same from either server.
            _ => Refusal::new(
                ErrorKind::InvalidClientIdentity,
                format!("failed to validate client identity: {e}"),
            ),
        }
    }
}

/// A whole HTTP answer, as the server writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// Empty on success; the refusal's JSON otherwise.
    pub body: Vec<u8>,
    /// The `Allow` header a 405 carries.
    pub allow: Option<&'static str>,
    /// One line for the server's log: what was asked and what happened.
    pub summary: String,
    /// What happened, from a closed set for the server's metrics: the change on success
    /// (`locked`, `already_held`, `unlocked`, `not_held`; `ok` if not said), else the kind.
    pub outcome: &'static str,
}

impl Answer {
    pub fn ok(summary: String) -> Self {
        Answer {
            status: 200,
            body: Vec::new(),
            allow: None,
            summary,
            outcome: "ok",
        }
    }

    /// The same answer with `outcome` (one of a closed set of snake_case names).
    pub fn with_outcome(self, outcome: &'static str) -> Self {
        Answer { outcome, ..self }
    }

    pub fn refused(refusal: &Refusal, summary: String) -> Self {
        Answer {
            status: refusal.kind.status(),
            body: refusal.to_json(),
            allow: (refusal.kind == ErrorKind::MethodNotAllowed).then_some("POST"),
            summary,
            outcome: refusal.kind.as_str(),
        }
    }

    /// The content type of [`Answer::body`], if it has one.
    pub fn content_type(&self) -> Option<&'static str> {
        (!self.body.is_empty()).then_some("application/json")
    }
}

/// For callers that refuse a body before reading it whole (a `Content-Length` over the cap).
pub fn body_too_large(len: usize) -> Refusal {
    RequestError::TooLarge { len }.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_a_closed_set_of_snake_case_names() {
        let mut names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        for name in names {
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
    }

    #[test]
    fn a_refusal_is_kind_and_value() {
        let r = Refusal::new(
            ErrorKind::FailedLock,
            "all 1 semaphore slots currently locked",
        );
        let a = Answer::refused(&r, String::new());
        assert_eq!(a.status, 500);
        assert_eq!(
            a.body,
            br#"{"kind":"failed_lock","value":"all 1 semaphore slots currently locked"}"#
        );
        assert_eq!(a.content_type(), Some("application/json"));
        let ok = Answer::ok(String::new());
        assert_eq!(
            (ok.status, ok.body.len(), ok.content_type()),
            (200, 0, None)
        );
        let m = Answer::refused(
            &RouteError::MethodNotAllowed {
                method: "GET".into(),
            }
            .into(),
            String::new(),
        );
        assert_eq!((m.status, m.allow), (405, Some("POST")));
    }
}
