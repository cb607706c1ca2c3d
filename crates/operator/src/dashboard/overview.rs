//! `GET /ui`: the fleet at a glance, each group's rollout, the nodes, the recent events. Every
//! number a test or a person might check carries `data-*` attributes naming what it counts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use slate_api::escape_html as esc;
use slate_rollout::{Event, RolloutState};

use super::query::Clamped;
use super::{clamp_note, clock, timeline, View};

/// Steps in the order a node goes through them (`idle`: outside its group's rollout).
const STATES: &[&str] = &["idle", "upgrading", "soaking", "done", "failed"];

/// The overview's `<main>`: of one group when `group` is given.
pub fn render(view: &View, group: Option<&str>, events: &Clamped, nodes: &Clamped) -> String {
    let groups: BTreeSet<&str> = view
        .status
        .nodes
        .iter()
        .map(|n| n.group.as_str())
        .chain(view.rollouts.keys().map(String::as_str))
        .filter(|g| group.is_none_or(|want| want == *g))
        .collect();
    let mut out = String::new();
    let leader = view.status.leader.as_deref().unwrap_or("none elected");
    let _ = write!(
        out,
        "<p>Leader: <span data-field=\"leader\">{}</span>. {} nodes in {} groups.{}</p>",
        esc(leader),
        view.status.nodes.len(),
        groups.len(),
        group.map_or(String::new(), |g| format!(
            " Group <b>{}</b> only (<a href=\"/ui\">every group</a>).",
            esc(g)
        )),
    );
    out.push_str(&glance(view, &groups));
    for g in &groups {
        out.push_str(&rollout_section(view, g));
    }
    out.push_str(&node_table(view, group, nodes));
    out.push_str(&event_list(view, group, events));
    out
}

/// Nodes by version and state, one table per group.
fn glance(view: &View, groups: &BTreeSet<&str>) -> String {
    let mut out = String::from("<section id=\"glance\"><h2>The fleet at a glance</h2>");
    for g in groups {
        let mut counts: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        let mut states: BTreeSet<&str> = BTreeSet::new();
        let mut total = 0;
        for n in view.status.nodes.iter().filter(|n| n.group == *g) {
            *counts
                .entry(n.version.as_str())
                .or_default()
                .entry(n.state.as_str())
                .or_default() += 1;
            states.insert(n.state.as_str());
            total += 1;
        }
        // The usual steps in their order, then any other the status named.
        let mut columns: Vec<&str> = STATES
            .iter()
            .copied()
            .filter(|s| states.contains(s))
            .collect();
        columns.extend(states.iter().filter(|s| !STATES.contains(s)));
        let _ = write!(
            out,
            "<h3>Group <a href=\"/ui?group={g}\">{g}</a>: <span data-group=\"{g}\" \
             data-field=\"nodes\">{total}</span> nodes</h3><table class=\"glance\" \
             data-group=\"{g}\"><tr><th>version</th>",
            g = esc(g)
        );
        for s in &columns {
            let _ = write!(out, "<th>{}</th>", esc(s));
        }
        out.push_str("</tr>");
        for (version, by_state) in &counts {
            let _ = write!(out, "<tr><td>{}</td>", esc(version));
            for s in &columns {
                let n = by_state.get(s).copied().unwrap_or(0);
                let _ = write!(
                    out,
                    "<td class=\"n\" data-group=\"{}\" data-version=\"{}\" data-state=\"{}\">\
                     {n}</td>",
                    esc(g),
                    esc(version),
                    esc(s)
                );
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>");
    }
    if groups.is_empty() {
        out.push_str("<p>No node has reported yet.</p>");
    }
    out.push_str("</section>");
    out
}

/// One group's rollout: its numbers, its buttons, its waves and its timeline.
fn rollout_section(view: &View, group: &str) -> String {
    let g = esc(group);
    let Some(rollout) = view.rollouts.get(group) else {
        return format!(
            "<section class=\"rollout\" data-group=\"{g}\"><h2>Group {g}</h2>\
             <p>No rollout yet: every node is on the newest version its channel offers, or no \
             policy covers the group.</p></section>"
        );
    };
    let mut out = String::new();
    let why = match &rollout.state {
        RolloutState::Paused { reason, since } => {
            format!(" since {}: {}", clock(*since), esc(reason))
        }
        RolloutState::Aborted { reason, at } => format!(" at {}: {}", clock(*at), esc(reason)),
        RolloutState::Completed { at } => format!(" at {}", clock(*at)),
        RolloutState::Running => String::new(),
    };
    let state = rollout.state.name();
    let _ = write!(
        out,
        "<section class=\"rollout\" data-group=\"{g}\"><h2>Group {g}: rollout \
         #<span data-field=\"rollout\">{id}</span> to <span data-field=\"target\">{target}\
         </span></h2><p>Started {created}; <span class=\"state-{state}\" \
         data-field=\"state\">{state}</span>{why}</p>",
        id = rollout.id,
        target = esc(&rollout.target),
        created = clock(rollout.created),
    );
    if let Some(p) = view.progress.iter().find(|p| p.group == group) {
        let wave = p.wave.map_or("-".to_owned(), |w| w.to_string());
        let budget = p
            .failure_budget_left
            .map_or("no budget".to_owned(), |b| b.to_string());
        let _ = write!(
            out,
            "<p class=\"numbers\"><span>wave <b data-field=\"wave\">{wave}</b> of \
             <b data-field=\"waves\">{}</b></span><span>done <b data-field=\"done\">{}</b>\
             </span><span>in flight <b data-field=\"in_flight\">{}</b></span><span>failed \
             <b data-field=\"failed\">{}</b></span><span>failure budget left <b \
             data-field=\"budget\">{budget}</b></span></p>",
            p.waves, p.done, p.in_flight, p.failed
        );
    }
    if rollout.state.is_active() {
        let _ = write!(
            out,
            "<p><button data-action=\"pause\" data-group=\"{g}\">Pause</button>\
             <button data-action=\"resume\" data-group=\"{g}\">Resume</button>\
             <button data-action=\"abort\" data-group=\"{g}\">Abort</button></p>"
        );
    }
    out.push_str(&wave_table(view, group));
    let members = view
        .status
        .nodes
        .iter()
        .filter(|n| n.group == group)
        .count();
    out.push_str(&timeline::svg(rollout, &view.events, members, view.now));
    out.push_str("</section>");
    out
}

/// Each wave's nodes by step (the waves `slate fleet status` gives each node), with the
/// percent and soak of the policy that makes them.
fn wave_table(view: &View, group: &str) -> String {
    let members: Vec<_> = view
        .status
        .nodes
        .iter()
        .filter(|n| n.group == group)
        .collect();
    let mut waves: BTreeMap<usize, BTreeMap<&str, usize>> = BTreeMap::new();
    for n in &members {
        if let Some(w) = n.wave {
            *waves
                .entry(w)
                .or_default()
                .entry(n.state.as_str())
                .or_default() += 1;
        }
    }
    if waves.is_empty() {
        return "<p>No waves: every covered node may start as the limits allow.</p>".into();
    }
    let spec = members
        .iter()
        .filter_map(|n| view.inventory.get(&n.node))
        .find_map(|rec| {
            view.policies
                .for_node(&rec.report)
                .find(|p| !p.waves.is_empty())
        });
    let mut out = String::from(
        "<table class=\"waves\"><tr><th>wave</th><th>percent</th><th>soak</th><th>nodes</th>",
    );
    for s in STATES {
        let _ = write!(out, "<th>{s}</th>");
    }
    out.push_str("</tr>");
    for (w, by_state) in &waves {
        let (percent, soak) = spec
            .and_then(|p| p.waves.get(w - 1))
            .map_or(("-".to_owned(), "-".to_owned()), |s| {
                (format!("{}%", s.percent), format!("{} s", s.soak.as_secs()))
            });
        let total: usize = by_state.values().sum();
        let _ = write!(
            out,
            "<tr data-group=\"{g}\" data-wave=\"{w}\"><td>{w}</td><td>{percent}</td>\
             <td>{soak}</td><td class=\"n\" data-field=\"nodes\">{total}</td>",
            g = esc(group)
        );
        for s in STATES {
            let n = by_state.get(s).copied().unwrap_or(0);
            let _ = write!(out, "<td class=\"n\" data-state=\"{s}\">{n}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

fn node_link(id: &str) -> String {
    // Node ids are `[A-Za-z0-9-_.]` (checked on every heartbeat): nothing to encode in a URL,
    // but escaped all the same, as everything from etcd is.
    format!("<a href=\"/ui/node?id={0}\">{0}</a>", esc(id))
}

fn node_table(view: &View, group: Option<&str>, limit: &Clamped) -> String {
    let nodes: Vec<_> = view
        .status
        .nodes
        .iter()
        .filter(|n| group.is_none_or(|g| n.group == g))
        .collect();
    let mut out = format!(
        "<section id=\"nodes\"><h2>Nodes</h2>{}<table><tr><th>node</th><th>group</th>\
         <th>version</th><th>target</th><th>state</th><th>wave</th><th>silent for</th>\
         <th>last error</th></tr>",
        clamp_note("nodes", limit)
    );
    for n in nodes.iter().take(limit.value) {
        let _ = write!(
            out,
            "<tr data-node=\"{id}\"><td>{link}</td><td>{group}</td><td>{version}</td>\
             <td>{target}</td><td class=\"state-{state}\">{state}</td><td>{wave}</td>\
             <td>{silent} s</td><td>{error}</td></tr>",
            id = esc(&n.node),
            link = node_link(&n.node),
            group = esc(&n.group),
            version = esc(&n.version),
            target = esc(n.target.as_deref().unwrap_or("-")),
            state = esc(&n.state),
            wave = n.wave.map_or("-".to_owned(), |w| w.to_string()),
            silent = n.silent_for,
            error = esc(n.last_error.as_deref().unwrap_or("")),
        );
    }
    out.push_str("</table>");
    if nodes.len() > limit.value {
        let _ = write!(
            out,
            "<p class=\"note\">{} more not listed (<code>?nodes=N</code> lists up to {}).</p>",
            nodes.len() - limit.value,
            super::MAX_NODES
        );
    }
    out.push_str("</section>");
    out
}

/// One event as a table row.
pub fn event_row(e: &Event) -> String {
    format!(
        "<tr class=\"event-{kind}\"><td>{at}</td><td>{group}</td><td>#{rollout}</td>\
         <td>{node}</td><td>{kind}</td><td>{detail}</td></tr>",
        at = clock(e.at),
        group = esc(&e.group),
        rollout = e.rollout,
        node = e.node.as_deref().map_or(String::new(), node_link),
        kind = kind_name(e),
        detail = esc(&e.detail),
    )
}

/// The event's kind as its JSON names it.
pub fn kind_name(e: &Event) -> String {
    serde_json::to_value(e.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn event_list(view: &View, group: Option<&str>, limit: &Clamped) -> String {
    let mut out = format!(
        "<section id=\"events\"><h2>Recent events</h2>{}<table><tr><th>when</th>\
         <th>group</th><th>rollout</th><th>node</th><th>what</th><th>detail</th></tr>",
        clamp_note("events", limit)
    );
    let shown = view
        .events
        .iter()
        .rev()
        .filter(|e| group.is_none_or(|g| e.group == g))
        .take(limit.value);
    for e in shown {
        out.push_str(&event_row(e));
    }
    out.push_str("</table></section>");
    out
}
