//! The rollout dashboard: HTML pages on the operator API's own listener, so they are served
//! with its mutual TLS, its role certificates and its limits (docs/operator.md "Dashboard").
//!
//! - `GET /ui` (reader): the fleet at a glance, each group's rollout with its waves, failure
//!   budget and timeline, the recent events ([`overview`], [`timeline`]).
//! - `GET /ui/node?id=ID` (reader): one node ([`node_page`]).
//!
//! Nothing here changes the fleet: the page's pause, resume and abort buttons post to
//! `/v1/fleet/pause|resume|abort`, the routes `slate fleet` uses, so the server refuses a reader
//! there exactly as it refuses `slate fleet pause` with a reader's certificate. The pages read
//! what `slate fleet status` reads, and everything from nodes and etcd is escaped
//! ([`slate_api::escape_html`]).

pub mod node_page;
pub mod overview;
pub mod query;
pub mod timeline;

use std::collections::BTreeMap;

use slate_api::{BackendError, Caller, Page, Role, ServiceRoute};
use slate_rollout::{progress, Event, GroupProgress, PolicySet, Rollout};

use crate::leader::now_unix;
use crate::service::{FleetStatus, OperatorService};
use crate::state;
use query::{is_name, Clamped, Query};

pub use crate::service::{UI_NODE as NODE, UI_OVERVIEW as OVERVIEW};

/// Events listed on the overview unless `?events=` says otherwise, and the most it lists.
pub const DEFAULT_EVENTS: usize = 50;
pub const MAX_EVENTS: usize = 1000;
/// Nodes listed on the overview (the counts cover all of them), and the most.
pub const DEFAULT_NODES: usize = 200;
pub const MAX_NODES: usize = 5000;
/// Events the timeline and a node's page read: one bounded read, however long the log.
pub const TIMELINE_EVENTS: usize = 2000;

/// The page's script: refreshes `<main>` from the same URL every few seconds (the server
/// renders; the script only swaps the result in), and sends the buttons' posts to the
/// operator API, showing its answer — a refusal's message included.
pub const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// What a page shows, read from etcd for one request.
#[derive(Debug)]
pub struct View {
    pub now: u64,
    /// As `GET /v1/fleet/status` answers it (so as `slate fleet status` shows it).
    pub status: FleetStatus,
    pub progress: Vec<GroupProgress>,
    pub policies: PolicySet,
    pub inventory: std::sync::Arc<slate_rollout::Inventory>,
    pub rollouts: BTreeMap<String, Rollout>,
    /// The last events, oldest first, as many as the page asked for.
    pub events: Vec<Event>,
    /// The caller's role: the page says what its buttons will do.
    pub role: Role,
}

fn failed(e: impl std::fmt::Display) -> BackendError {
    BackendError::Failed(e.to_string())
}

fn invalid(e: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidArgument(e.to_string())
}

impl View {
    fn read(
        service: &OperatorService,
        caller: &Caller,
        events: usize,
    ) -> Result<View, BackendError> {
        let fleet = service.read_fleet()?;
        let status = service.status_of(&fleet)?;
        // Stored policies were checked when set; unreadable ones cover nothing here, as in
        // the metrics.
        let policies = PolicySet::parse(&fleet.policies_text).unwrap_or(PolicySet {
            policies: Vec::new(),
        });
        let (inventory, rollouts) = (fleet.inventory, fleet.rollouts);
        Ok(View {
            now: now_unix(),
            progress: progress(&inventory, &policies, &rollouts),
            status,
            policies,
            inventory,
            rollouts,
            events: state::events(&service.state, events).map_err(failed)?,
            role: caller.role,
        })
    }
}

/// A page with the dashboard's head, style, header and script around `main`.
pub fn document(title: &str, role: Role, now: u64, main: &str) -> Page {
    let esc = slate_api::escape_html;
    let acts = if role >= Role::Operator {
        "your certificate's role may pause, resume and abort"
    } else {
        "your certificate's role may look but not act: the buttons will be refused"
    };
    Page {
        html: format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width\">\
             <title>{title}</title><style>{STYLE}</style></head><body>\
             <header><a href=\"/ui\"><b>slate</b> fleet</a> <span class=\"role\" \
             data-role=\"{role}\">role {role}: {acts}</span> <span id=\"updated\" \
             data-now=\"{now}\">as of {at}</span></header>\
             <div id=\"message\" role=\"status\" hidden></div>\
             <main id=\"main\">{main}</main><script>{SCRIPT}</script></body></html>\n",
            title = esc(title),
            role = role.as_str(),
            at = clock(now),
        ),
        scripts: &[SCRIPT],
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn clock(unix: u64) -> String {
    let (days, secs) = (unix / 86_400, unix % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A sentence for a count the page bounded.
pub fn clamp_note(what: &str, c: &Clamped) -> String {
    match &c.asked {
        Some(asked) => format!(
            "<p class=\"note\" data-clamped=\"{what}\">Showing at most {} {what}: {} were \
             asked for, and a page lists at most {} (the bound keeps each page's work small).\
             </p>",
            c.value,
            slate_api::escape_html(asked),
            c.value
        ),
        None => String::new(),
    }
}

impl OperatorService {
    /// A page route's document.
    pub(crate) fn render_page(
        &self,
        route: &ServiceRoute,
        caller: &Caller,
        query: Option<&str>,
    ) -> Result<Page, BackendError> {
        match *route {
            OVERVIEW => {
                let q = Query::parse(query, &["events", "nodes", "group"]).map_err(invalid)?;
                let events = q
                    .count("events", DEFAULT_EVENTS, MAX_EVENTS)
                    .map_err(invalid)?;
                let nodes = q
                    .count("nodes", DEFAULT_NODES, MAX_NODES)
                    .map_err(invalid)?;
                let group = q.get("group");
                if let Some(g) = group.filter(|g| !is_name(g)) {
                    return Err(invalid(format!(
                        "group {:?} is not a group name (1-128 of [A-Za-z0-9-_.])",
                        g.chars().take(64).collect::<String>()
                    )));
                }
                let view = View::read(self, caller, TIMELINE_EVENTS)?;
                if let Some(g) = group {
                    if !view.status.nodes.iter().any(|n| n.group == g)
                        && !view.rollouts.contains_key(g)
                    {
                        return Err(BackendError::NotFound(format!(
                            "no group {g:?}: no node reports it and it has no rollout"
                        )));
                    }
                }
                let main = overview::render(&view, group, &events, &nodes);
                Ok(document("slate fleet", caller.role, view.now, &main))
            }
            NODE => {
                let q = Query::parse(query, &["id"]).map_err(invalid)?;
                let id = q.get("id").ok_or_else(|| {
                    invalid("which node? /ui/node?id=NODE (a node id from the fleet page)")
                })?;
                if !is_name(id) {
                    return Err(invalid(format!(
                        "{:?} is not a node id (1-128 of [A-Za-z0-9-_.])",
                        id.chars().take(64).collect::<String>()
                    )));
                }
                let view = View::read(self, caller, TIMELINE_EVENTS)?;
                if !view.inventory.contains_key(id) {
                    return Err(BackendError::NotFound(format!(
                        "no node {id:?} in the inventory: it never reported to the operator, \
                         or was named otherwise"
                    )));
                }
                let live = self.node_certs.as_deref().map(|certs| {
                    node_page::ask_node(certs, &view.inventory[id].report.endpoint, id)
                });
                let main = node_page::render(&view, id, live.as_ref());
                Ok(document(
                    &format!("{id} — slate fleet"),
                    caller.role,
                    view.now,
                    &main,
                ))
            }
            _ => Err(BackendError::NotFound(format!("no page {}", route.path))),
        }
    }
}
