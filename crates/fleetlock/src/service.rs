//! One request in, one answer out: the whole FleetLock server except the sockets. The order
//! of the checks fixes which answer a request with several faults gets: path (404), method
//! (405), body size (413), header and body (400 `invalid_client_identity`), group (400
//! `unknown_group`), then the semaphore (200 or 500).

use crate::answer::{Answer, ErrorKind, Refusal};
use crate::groups::Groups;
use crate::request::{parse_request, route, ClientParams, Operation};
use crate::store::{self, Applied, ApplyError, SemaphoreStore, StoreError};

/// A request as the HTTP layer hands it over.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The path alone, without the query string.
    pub path: &'a str,
    /// The first `fleet-lock-protocol` header's value, if any.
    pub protocol_header: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// The configured groups over a store.
#[derive(Debug)]
pub struct Service<S> {
    groups: Groups,
    store: S,
}

impl<S: SemaphoreStore> Service<S> {
    pub fn new(groups: Groups, store: S) -> Self {
        Service { groups, store }
    }

    pub fn groups(&self) -> &Groups {
        &self.groups
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Where the store and the configuration disagree, one line each, for the server to say
    /// on start: a configured slot count that differs from the stored one (it applies from the
    /// next lock), and an unconfigured group that still has holders (they keep their slots,
    /// and nobody can unlock them through this server: `slate fleetlock release` can).
    pub fn drift(&self) -> Result<Vec<String>, StoreError> {
        let mut lines = Vec::new();
        for group in self.store.groups()? {
            let Some((_, sem)) = self.store.load(&group)? else {
                continue;
            };
            match self.groups.slots(&group) {
                None if !sem.holders().is_empty() => lines.push(format!(
                    "group {group} is not configured but still has {} holder(s): {}",
                    sem.holders().len(),
                    sem.holders().join(", ")
                )),
                Some(slots) if slots != sem.total_slots() => lines.push(format!(
                    "group {group}: {slots} slots configured, {} stored; the configured count \
                     applies from the next lock",
                    sem.total_slots()
                )),
                _ => {}
            }
        }
        Ok(lines)
    }

    /// The whole request at once (tests, and servers that read the body before routing).
    pub fn handle(&self, req: &Request<'_>) -> Answer {
        let op = match route(req.method, req.path) {
            Ok(op) => op,
            Err(e) => {
                let summary = format!("{} {}: refused", req.method, req.path);
                return Answer::refused(&e.into(), summary);
            }
        };
        self.serve(op, req.protocol_header, req.body)
    }

    /// A routed request: header and body checked, then the operation done. An HTTP layer
    /// calls [`route`] first, so that it reads no body for a request that is refused anyway,
    /// and reads at most [`crate::request::MAX_BODY_LEN`] bytes.
    pub fn serve(&self, op: Operation, protocol_header: Option<&[u8]>, body: &[u8]) -> Answer {
        let ClientParams { id, group } = match parse_request(protocol_header, body) {
            Ok(params) => params,
            Err(e) => {
                let refusal = Refusal::from(e);
                let summary = format!("{}: refused: {}", op.name(), refusal.value);
                return Answer::refused(&refusal, summary);
            }
        };
        let who = format!("{} {group}/{id}", op.name());
        let Some(slots) = self.groups.slots(&group) else {
            // airlock's text.
            let refusal = Refusal::new(
                ErrorKind::UnknownGroup,
                format!("unknown group {:?}", group.as_str()),
            );
            return Answer::refused(&refusal, format!("{who}: unknown group"));
        };
        let result = match op {
            Operation::Lock => store::lock(&self.store, &group, &id, slots),
            Operation::Unlock => store::unlock(&self.store, &group, id.as_str()),
        };
        match result {
            Ok(Applied { change, semaphore }) => {
                let held = semaphore.as_ref().map_or(0, |s| s.holders().len());
                Answer::ok(format!(
                    "{who}: {} ({held}/{slots} slots held)",
                    change.as_str()
                ))
                .with_outcome(change.label())
            }
            Err(e) => {
                let kind = match e {
                    ApplyError::Load(_) => ErrorKind::FailedSemInit,
                    ApplyError::Full(_) | ApplyError::Conflict | ApplyError::Write(_) => {
                        ErrorKind::FailedLock
                    }
                };
                let refusal = Refusal::new(kind, e.to_string());
                Answer::refused(&refusal, format!("{who}: {e}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::GroupSpec;
    use crate::request::{GroupName, MAX_BODY_LEN};
    use crate::store::MemStore;

    fn service(groups: &[&str]) -> Service<MemStore> {
        let specs = groups.iter().map(|g| g.parse::<GroupSpec>().unwrap());
        Service::new(Groups::new(specs).unwrap(), MemStore::new())
    }

    fn body(id: &str, group: &str) -> Vec<u8> {
        format!(r#"{{"client_params":{{"id":"{id}","group":"{group}"}}}}"#).into_bytes()
    }

    fn post(s: &Service<MemStore>, path: &str, body: &[u8]) -> (u16, String) {
        let a = s.handle(&Request {
            method: "POST",
            path,
            protocol_header: Some(b"true"),
            body,
        });
        (a.status, String::from_utf8(a.body).unwrap())
    }

    #[test]
    fn the_protocol_table() {
        let s = service(&["default=1", "workers=2"]);
        let lock = "/v1/pre-reboot";
        let unlock = "/v1/steady-state";
        assert_eq!(post(&s, lock, &body("a", "default")), (200, String::new()));
        assert_eq!(post(&s, lock, &body("a", "default")), (200, String::new()));
        assert_eq!(
            post(&s, lock, &body("b", "default")),
            (
                500,
                r#"{"kind":"failed_lock","value":"all 1 semaphore slots currently locked"}"#.into()
            )
        );
        assert_eq!(
            post(&s, unlock, &body("b", "default")),
            (200, String::new())
        );
        let held = s
            .store()
            .load(&GroupName::default_group())
            .unwrap()
            .unwrap()
            .1;
        assert_eq!(held.holders(), ["a"]);
        assert_eq!(
            post(&s, unlock, &body("a", "default")),
            (200, String::new())
        );
        assert_eq!(
            post(&s, unlock, &body("a", "default")),
            (200, String::new())
        );
        assert_eq!(post(&s, lock, &body("b", "default")), (200, String::new()));
        assert_eq!(
            post(&s, lock, &body("a", "other")),
            (
                400,
                r#"{"kind":"unknown_group","value":"unknown group \"other\""}"#.into()
            )
        );
        let (status, text) = post(&s, lock, &body("a", "a/b"));
        assert_eq!(status, 400);
        assert!(text.starts_with(r#"{"kind":"invalid_client_identity","value":"failed to validate client identity: client group must match"#), "{text}");
        let (status, text) = post(&s, lock, &body("", "default"));
        assert_eq!(
            (status, text.as_str()),
            (
                400,
                r#"{"kind":"invalid_client_identity","value":"failed to validate client identity: empty client ID"}"#
            )
        );
    }

    #[test]
    fn routing_and_header_come_first() {
        let s = service(&[]);
        let req = |method, path, header: Option<&'static [u8]>, body: &'static [u8]| {
            let a = s.handle(&Request {
                method,
                path,
                protocol_header: header,
                body,
            });
            (a.status, a.allow)
        };
        assert_eq!(req("GET", "/nope", None, b""), (404, None));
        assert_eq!(req("GET", "/v1/pre-reboot", None, b""), (405, Some("POST")));
        assert_eq!(req("POST", "/v1/pre-reboot", None, b"{"), (400, None));
        assert_eq!(
            req("POST", "/v1/pre-reboot", Some(b"false"), b"{"),
            (400, None)
        );
        let big = vec![b' '; MAX_BODY_LEN + 1];
        let a = s.serve(Operation::Lock, Some(b"true"), &big);
        assert_eq!(a.status, 413);
        assert!(
            s.store().groups().unwrap().is_empty(),
            "nothing was written"
        );
    }

    #[test]
    fn drift_between_store_and_configuration() {
        let s = service(&["default=1", "workers=2"]);
        s.serve(Operation::Lock, Some(b"true"), &body("a", "default"));
        s.serve(Operation::Lock, Some(b"true"), &body("b", "workers"));
        assert!(s.drift().unwrap().is_empty());
        let restarted = Service::new(
            Groups::new(["workers=3".parse::<GroupSpec>().unwrap()]).unwrap(),
            s.store,
        );
        assert_eq!(
            restarted.drift().unwrap(),
            [
                "group default is not configured but still has 1 holder(s): a",
                "group workers: 3 slots configured, 2 stored; the configured count applies \
                 from the next lock"
            ]
        );
    }

    #[test]
    fn summaries_say_what_happened() {
        let s = service(&["workers=2"]);
        let a = s.serve(Operation::Lock, Some(b"true"), &body("n1", "workers"));
        assert_eq!(a.summary, "lock workers/n1: locked (1/2 slots held)");
        let a = s.serve(Operation::Unlock, Some(b"true"), &body("n2", "workers"));
        assert_eq!(a.summary, "unlock workers/n2: not held (1/2 slots held)");
        assert_eq!(a.outcome, "not_held");
        let a = s.serve(Operation::Lock, Some(b"true"), &body("n1", "workers"));
        assert_eq!(a.outcome, "already_held");
        let a = s.serve(Operation::Lock, Some(b"true"), &body("n1", "nope"));
        assert_eq!(a.outcome, "unknown_group");
    }
}
