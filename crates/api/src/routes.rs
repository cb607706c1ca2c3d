//! The route table: the one list of what the server serves, used for dispatch and checked
//! against `api/openapi.yaml` by the tests.

use crate::types::Role;

/// What a route does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Version,
    Status,
    Reboot,
    Shutdown,
    Reset,
    Upgrade,
    Rollback,
    Pin,
    UploadBundle,
    Events,
    Logs,
    Dmesg,
    ShowConfig,
    ApplyConfig,
    BootExplain,
    ImageSummary,
    SnapshotList,
    SnapshotUpgrade,
    Services,
    ControlService,
    /// `GET /metrics`, answered before the site by `metrics.rs` for every server.
    Metrics,
}

/// One route: method, path and the least role allowed to call it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The exact path, e.g. `/v1/status`.
    pub path: &'static str,
    /// The least privileged role allowed.
    pub role: Role,
    pub endpoint: Endpoint,
}

const fn route(method: &'static str, path: &'static str, role: Role, endpoint: Endpoint) -> Route {
    Route {
        method,
        path,
        role,
        endpoint,
    }
}

/// Every route the server serves.
pub const ROUTES: &[Route] = &[
    route("GET", "/v1/version", Role::Reader, Endpoint::Version),
    route("GET", "/v1/status", Role::Reader, Endpoint::Status),
    route("POST", "/v1/reboot", Role::Operator, Endpoint::Reboot),
    // Operator, as reboot: the node goes down in order and stays down until powered on.
    route("POST", "/v1/shutdown", Role::Operator, Endpoint::Shutdown),
    route("POST", "/v1/reset", Role::Admin, Endpoint::Reset),
    // Operator: the rollout operator upgrades nodes with an operator certificate; what may be
    // installed is still bounded by the node's signature policy.
    route("POST", "/v1/upgrade", Role::Operator, Endpoint::Upgrade),
    // Admin: going back to an older version is the admin's call, as a downgrade is.
    route("POST", "/v1/rollback", Role::Admin, Endpoint::Rollback),
    // Admin: a pin holds ESP space that upgrades would otherwise reclaim.
    route("POST", "/v1/pins", Role::Admin, Endpoint::Pin),
    route("POST", "/v1/bundles", Role::Admin, Endpoint::UploadBundle),
    route("GET", "/v1/events", Role::Reader, Endpoint::Events),
    route("GET", "/v1/logs", Role::Reader, Endpoint::Logs),
    route("GET", "/v1/dmesg", Role::Reader, Endpoint::Dmesg),
    route("GET", "/v1/config", Role::Reader, Endpoint::ShowConfig),
    route("POST", "/v1/config", Role::Admin, Endpoint::ApplyConfig),
    route("GET", "/v1/boot", Role::Reader, Endpoint::BootExplain),
    // Reader: what the running image holds is what its bundle holds, nothing of the node's
    // own; the work it costs (reading and hashing the booted UKI) runs one at a time.
    route("GET", "/v1/image", Role::Reader, Endpoint::ImageSummary),
    // A Btrfs snapshot root's snapshots and boot entries.
    route("GET", "/v1/snapshots", Role::Reader, Endpoint::SnapshotList),
    // Admin: the command runs as root in the new snapshot, whatever it is.
    route(
        "POST",
        "/v1/snapshots/upgrade",
        Role::Admin,
        Endpoint::SnapshotUpgrade,
    ),
    route("GET", "/v1/services", Role::Reader, Endpoint::Services),
    route(
        "POST",
        "/v1/services",
        Role::Operator,
        Endpoint::ControlService,
    ),
    // Reader: Prometheus scrapes with a reader certificate; nothing here names a secret.
    route("GET", "/metrics", Role::Reader, Endpoint::Metrics),
];

/// What a node in maintenance mode (no machine configuration yet) serves, to a client that
/// presents the token it printed on its console.
pub const MAINTENANCE_ENDPOINTS: &[Endpoint] = &[Endpoint::Version, Endpoint::ApplyConfig];

/// The route for an endpoint.
pub fn route_of(endpoint: Endpoint) -> &'static Route {
    ROUTES
        .iter()
        .find(|r| r.endpoint == endpoint)
        .expect("every endpoint has a route")
}

/// What the shared request path needs of a route, whichever table it comes from: the node's
/// [`Route`]s or a service's [`crate::ServiceRoute`]s.
pub(crate) trait TableRoute {
    fn method(&self) -> &str;
    fn path(&self) -> &str;
    fn role(&self) -> Role;
}

impl TableRoute for Route {
    fn method(&self) -> &str {
        self.method
    }
    fn path(&self) -> &str {
        self.path
    }
    fn role(&self) -> Role {
        self.role
    }
}

/// How a request matches a table.
#[derive(Debug)]
pub(crate) enum Match<'a, R> {
    Found(&'a R),
    /// The path exists with other methods (for the `Allow` header).
    WrongMethod(Vec<&'a str>),
    NotFound,
}

pub(crate) fn lookup<'a, R: TableRoute>(table: &'a [R], method: &str, path: &str) -> Match<'a, R> {
    let mut allowed = Vec::new();
    for r in table.iter().filter(|r| r.path() == path) {
        if r.method() == method {
            return Match::Found(r);
        }
        allowed.push(r.method());
    }
    if allowed.is_empty() {
        Match::NotFound
    } else {
        Match::WrongMethod(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_distinguishes_unknown_paths_and_methods() {
        assert!(
            matches!(lookup(ROUTES, "GET", "/v1/status"), Match::Found(r) if r.endpoint == Endpoint::Status)
        );
        assert!(
            matches!(lookup(ROUTES, "POST", "/v1/status"), Match::WrongMethod(m) if m == ["GET"])
        );
        assert!(matches!(lookup(ROUTES, "GET", "/v1/nope"), Match::NotFound));
        assert!(matches!(
            lookup(ROUTES, "GET", "/v1/status/"),
            Match::NotFound
        ));
        for r in ROUTES {
            assert_eq!(route_of(r.endpoint), r);
        }
    }
}
