//! `GET /ui/node?id=ID`: one node as the operator knows it (its last report, its step in its
//! group's rollout, its events) and, asked while the page is made, as the node tells it (its
//! status: booted entry, last failure, last rollback; its boot entries).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use slate_api::{escape_html as esc, Client, Role, Status};
use slate_rollout::Step;

use super::overview::event_row;
use super::{clock, View};

/// How long the page waits for the node: a node that is down (rebooting) must not hold the
/// page for long.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// What the node said, asked with the operator's certificate (as orders are sent): its
/// status, and its boot entries (`GET /v1/boot/explain`, which not every node answers).
pub type Live = Result<(Status, Result<Value, String>), String>;

/// Asks the node at `endpoint`, whose certificate must name `id`.
pub fn ask_node(certs: &Path, endpoint: &str, id: &str) -> Live {
    let client = Client::from_dir(endpoint, certs, Role::Operator)
        .and_then(|c| c.with_server_name(id))
        .map_err(|e| e.to_string())?
        .with_timeout(ASK_TIMEOUT);
    let status = client.status().map_err(|e| e.to_string())?;
    let boot = client.boot_explain().map_err(|e| e.to_string());
    Ok((status, boot))
}

fn row(out: &mut String, name: &str, value: &str) {
    let _ = write!(
        out,
        "<tr><th>{name}</th><td data-field=\"{name}\">{value}</td></tr>"
    );
}

/// The node page's `<main>`; the caller checked that `id` is in the inventory.
pub fn render(view: &View, id: &str, live: Option<&Live>) -> String {
    let mut out = String::new();
    let Some(record) = view.inventory.get(id) else {
        return out;
    };
    let r = &record.report;
    let status = view.status.nodes.iter().find(|n| n.node == id);
    let _ = write!(
        out,
        "<h1 data-node=\"{id}\">Node {id}</h1><section id=\"report\"><h2>As the operator \
         knows it</h2><table>",
        id = esc(id)
    );
    row(
        &mut out,
        "group",
        &format!("<a href=\"/ui?group={0}\">{0}</a>", esc(&r.group)),
    );
    row(&mut out, "version", &esc(&r.version));
    row(&mut out, "channel", &esc(&r.channel));
    row(&mut out, "endpoint", &esc(&r.endpoint));
    let yes = |b: bool| if b { "yes" } else { "no" };
    row(&mut out, "committed", yes(r.committed));
    row(&mut out, "healthy", yes(r.healthy));
    row(&mut out, "busy", yes(r.busy));
    let labels: Vec<String> = r
        .labels
        .iter()
        .map(|(k, v)| format!("{}={}", esc(k), esc(v)))
        .collect();
    row(&mut out, "labels", &labels.join(", "));
    row(
        &mut out,
        "last report",
        &format!(
            "{} ({} s ago)",
            clock(record.last_seen),
            view.now.saturating_sub(record.last_seen)
        ),
    );
    row(
        &mut out,
        "last failure",
        &r.last_failure.as_ref().map_or("none".into(), |f| {
            format!("{}: {}", esc(&f.version), esc(&f.reason))
        }),
    );
    if let Some(s) = status {
        row(&mut out, "state", &esc(&s.state));
        row(
            &mut out,
            "wave",
            &s.wave.map_or("-".to_owned(), |w| w.to_string()),
        );
        row(&mut out, "target", &esc(s.target.as_deref().unwrap_or("-")));
    }
    out.push_str("</table>");
    if let Some(rollout) = view.rollouts.get(&r.group) {
        match rollout.nodes.get(id) {
            Some(p) => {
                let step = match &p.step {
                    Step::Upgrading { issued, .. } => format!(
                        "upgrading ({})",
                        if *issued {
                            "the node took the order"
                        } else {
                            "ordered"
                        }
                    ),
                    Step::Soaking { committed } => {
                        format!("soaking since {}", clock(*committed))
                    }
                    Step::Done { at } => format!("done at {}", clock(*at)),
                    Step::Failed { at, reason } => {
                        format!("failed at {}: {}", clock(*at), esc(reason))
                    }
                };
                let _ = write!(
                    out,
                    "<p>In rollout #{} to {}: <span data-field=\"step\">{step}</span>{}.</p>",
                    rollout.id,
                    esc(&rollout.target),
                    p.from.as_deref().map_or(
                        " (it was already on the target)".into(),
                        |f| format!(
                            " (from {}{})",
                            esc(f),
                            p.started
                                .map_or(String::new(), |s| format!(", started {}", clock(s)))
                        )
                    ),
                );
            }
            None => {
                let _ = write!(
                    out,
                    "<p>Not yet started by rollout #{} to {}.</p>",
                    rollout.id,
                    esc(&rollout.target)
                );
            }
        }
    }
    out.push_str("</section>");
    out.push_str(&live_section(live));
    out.push_str(
        "<section id=\"node-events\"><h2>Its events</h2><table><tr><th>when</th>\
         <th>group</th><th>rollout</th><th>node</th><th>what</th><th>detail</th></tr>",
    );
    for e in view
        .events
        .iter()
        .rev()
        .filter(|e| e.node.as_deref() == Some(id))
    {
        out.push_str(&event_row(e));
    }
    let _ = write!(
        out,
        "</table><p class=\"note\">From the last {} events of the fleet.</p></section>",
        super::TIMELINE_EVENTS
    );
    out
}

fn live_section(live: Option<&Live>) -> String {
    let mut out = String::from("<section id=\"live\"><h2>As the node tells it</h2>");
    let (status, boot) = match live {
        None => {
            out.push_str(
                "<p>This replica was started without the certificates to ask nodes.</p>\
                 </section>",
            );
            return out;
        }
        Some(Err(e)) => {
            let _ = write!(
                out,
                "<p class=\"error\" data-field=\"unreachable\">The node did not answer: {}</p>\
                 </section>",
                esc(e)
            );
            return out;
        }
        Some(Ok(live)) => live,
    };
    out.push_str("<table>");
    row(&mut out, "running", &esc(&status.version));
    row(
        &mut out,
        "booted entry",
        &esc(status.booted_entry.as_deref().unwrap_or("-")),
    );
    row(&mut out, "stage", &esc(&format!("{:?}", status.stage)));
    row(
        &mut out,
        "sequence",
        &esc(status.running_sequence.as_deref().unwrap_or("none")),
    );
    row(
        &mut out,
        "node says committed",
        if status.committed { "yes" } else { "no" },
    );
    row(
        &mut out,
        "its last failure",
        &status.last_failure.as_ref().map_or("none".into(), |f| {
            format!("{}: {}", esc(&f.version), esc(&f.reason))
        }),
    );
    row(
        &mut out,
        "last rollback",
        &status.last_rollback.as_ref().map_or("none".into(), |r| {
            format!(
                "{} → {} at {}: {}",
                esc(&r.from),
                esc(&r.to),
                clock(r.time),
                esc(&r.reason)
            )
        }),
    );
    row(&mut out, "pinned", &esc(&status.pinned.join(", ")));
    for w in &status.warnings {
        row(&mut out, "warning", &esc(w));
    }
    out.push_str("</table><h3>Boot entries</h3>");
    match boot {
        Err(e) => {
            let _ = write!(out, "<p class=\"note\">Not told: {}</p>", esc(e));
        }
        Ok(explained) => out.push_str(&boot_entries(explained)),
    }
    out.push_str("</section>");
    out
}

/// `GET /v1/boot/explain`'s entries as a table, read by field name (the node may be a newer
/// version than this operator: unknown fields are ignored, missing ones shown as `-`).
fn boot_entries(v: &Value) -> String {
    let text = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    };
    let mut out = String::from(
        "<table><tr><th>#</th><th>entry</th><th>version</th><th>tries left</th>\
         <th>tries done</th></tr>",
    );
    for e in v["entries"].as_array().map_or(&[][..], Vec::as_slice) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            text(&e["position"]),
            text(&e["name"]),
            text(&e["version"]),
            text(&e["tries_left"]),
            text(&e["tries_done"]),
        );
    }
    let _ = write!(
        out,
        "</table><p>Next boot: {} ({})</p>",
        text(&v["next_boot"]),
        text(&v["reason_text"])
    );
    out
}
