//! A rollout's timeline as an inline SVG chart, drawn from the event log: how many of the
//! group's nodes ran the target version and how many an older one, over time; failures marked
//! where they happened; pauses, resumes and the end as vertical lines. Drawn by the server
//! (no script, no library): a page that works offline.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use slate_api::escape_html as esc;
use slate_rollout::{Event, EventKind, Rollout, RolloutState};

use super::clock;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 40.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 34.0;

/// What the chart plots, from the events of one rollout.
#[derive(Debug, Default, PartialEq)]
pub struct Series {
    /// (time, nodes on the target) after each change, from the start.
    pub on_target: Vec<(u64, usize)>,
    /// (time, node, detail) of each failure.
    pub failures: Vec<(u64, String, String)>,
    /// (time, what) of pauses, resumes, the abort and the completion.
    pub marks: Vec<(u64, &'static str)>,
    /// The first event of the rollout was not among those read (the chart starts late).
    pub truncated: bool,
}

/// The series of `rollout` from `events` (oldest first, any group): nodes already on the
/// target when it started count from the start; a commit adds one; a failure of a node that
/// had committed (its soak failed) takes it back.
pub fn series(rollout: &Rollout, events: &[Event]) -> Series {
    let mine: Vec<&Event> = events
        .iter()
        .filter(|e| e.group == rollout.group && e.rollout == rollout.id)
        .collect();
    let mut on: BTreeSet<&str> = rollout
        .nodes
        .iter()
        .filter(|(_, p)| p.from.is_none())
        .map(|(id, _)| id.as_str())
        .collect();
    let mut s = Series {
        on_target: vec![(rollout.created, on.len())],
        truncated: mine
            .first()
            .is_none_or(|e| e.kind != EventKind::RolloutStarted),
        ..Series::default()
    };
    for e in mine {
        let node = e.node.as_deref().unwrap_or("");
        let changed = match e.kind {
            EventKind::Committed => on.insert(node),
            EventKind::Failed => {
                s.failures.push((e.at, node.to_owned(), e.detail.clone()));
                on.remove(node)
            }
            EventKind::Paused => {
                s.marks.push((e.at, "paused"));
                false
            }
            EventKind::Resumed => {
                s.marks.push((e.at, "resumed"));
                false
            }
            EventKind::Aborted => {
                s.marks.push((e.at, "aborted"));
                false
            }
            EventKind::Completed => {
                s.marks.push((e.at, "completed"));
                false
            }
            _ => false,
        };
        if changed {
            s.on_target.push((e.at, on.len()));
        }
    }
    s
}

/// The chart of `rollout` in a group of `members` nodes, up to `now` (or its end).
pub fn svg(rollout: &Rollout, events: &[Event], members: usize, now: u64) -> String {
    let s = series(rollout, events);
    let start = rollout.created;
    let end = match rollout.state {
        RolloutState::Completed { at } | RolloutState::Aborted { at, .. } => at,
        _ => now,
    }
    .max(start + 1);
    let most = members
        .max(s.on_target.iter().map(|p| p.1).max().unwrap_or(0))
        .max(1);
    let x = |t: u64| LEFT + (t.clamp(start, end) - start) as f64 / (end - start) as f64 * plot_w();
    let y = |n: usize| TOP + plot_h() * (1.0 - n as f64 / most as f64);
    let mut out = format!(
        "<figure class=\"timeline\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" \
         height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" data-group=\"{g}\" \
         aria-label=\"rollout of {g} to {t}: nodes on each version over time\">",
        g = esc(&rollout.group),
        t = esc(&rollout.target),
    );
    // Axes and their labels.
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#888\"/>\
         <text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{most}</text>\
         <text x=\"{lx}\" y=\"{b}\" text-anchor=\"end\">0</text>\
         <text x=\"{LEFT}\" y=\"{tx}\">{from}</text>\
         <text x=\"{r}\" y=\"{tx}\" text-anchor=\"end\">{to}</text>",
        b = TOP + plot_h(),
        r = LEFT + plot_w(),
        lx = LEFT - 4.0,
        ty = TOP + 8.0,
        tx = TOP + plot_h() + 14.0,
        from = clock(start),
        to = clock(end),
    );
    // Steps: on the target (green), on an older version (grey): the group minus the target's.
    let mut target = String::new();
    let mut older = String::new();
    let mut last: Option<usize> = None;
    for &(t, n) in &s.on_target {
        if let Some(prev) = last {
            let _ = write!(target, " L{:.1},{:.1}", x(t), y(prev));
            let _ = write!(
                older,
                " L{:.1},{:.1}",
                x(t),
                y(members.saturating_sub(prev))
            );
        }
        let (cmd_t, cmd_o) = if last.is_none() {
            ("M", "M")
        } else {
            (" L", " L")
        };
        let _ = write!(target, "{cmd_t}{:.1},{:.1}", x(t), y(n));
        let _ = write!(
            older,
            "{cmd_o}{:.1},{:.1}",
            x(t),
            y(members.saturating_sub(n))
        );
        last = Some(n);
    }
    if let Some(n) = last {
        let _ = write!(target, " L{:.1},{:.1}", x(end), y(n));
        let _ = write!(older, " L{:.1},{:.1}", x(end), y(members.saturating_sub(n)));
    }
    let _ = write!(
        out,
        "<path d=\"{older}\" fill=\"none\" stroke=\"#8a8f98\" stroke-width=\"2\" \
         stroke-dasharray=\"5 3\"><title>nodes on an older version</title></path>\
         <path d=\"{target}\" fill=\"none\" stroke=\"#1a7f37\" stroke-width=\"2.5\" \
         data-series=\"target\"><title>nodes on {t}</title></path>",
        t = esc(&rollout.target)
    );
    for (i, (t, what)) in s.marks.iter().enumerate() {
        // Labels near the right edge end at their line; successive ones alternate in height,
        // so that a pause and a quick resume stay readable.
        let near_end = x(*t) > LEFT + plot_w() * 0.8;
        let _ = write!(
            out,
            "<line x1=\"{xx:.1}\" y1=\"{TOP}\" x2=\"{xx:.1}\" y2=\"{b}\" stroke=\"#a15c00\" \
             stroke-dasharray=\"3 3\" data-mark=\"{what}\"><title>{what} at {at}</title></line>\
             <text x=\"{tx:.1}\" y=\"{ty}\" fill=\"#a15c00\" text-anchor=\"{anchor}\">{what}\
             </text>",
            xx = x(*t),
            tx = if near_end { x(*t) - 3.0 } else { x(*t) + 3.0 },
            anchor = if near_end { "end" } else { "start" },
            ty = TOP + 10.0 + 12.0 * (i % 2) as f64,
            b = TOP + plot_h(),
            at = clock(*t),
        );
    }
    for (t, node, detail) in &s.failures {
        let (cx, cy) = (x(*t), TOP + plot_h() - 6.0);
        let _ = write!(
            out,
            "<path d=\"M{:.1},{:.1} L{:.1},{:.1} M{:.1},{:.1} L{:.1},{:.1}\" stroke=\"#b00020\" \
             stroke-width=\"2.5\" data-failure=\"{n}\"><title>{n} failed at {at}: {d}</title>\
             </path>",
            cx - 5.0,
            cy - 5.0,
            cx + 5.0,
            cy + 5.0,
            cx - 5.0,
            cy + 5.0,
            cx + 5.0,
            cy - 5.0,
            n = esc(node),
            at = clock(*t),
            d = esc(detail),
        );
    }
    out.push_str("</svg><figcaption>");
    let _ = write!(
        out,
        "<span style=\"color:#1a7f37\">━ on {}</span> · <span style=\"color:#8a8f98\">╌ \
         older versions</span> · <span style=\"color:#b00020\">✕ failed \
         (<span data-field=\"failures\">{}</span>)</span>",
        esc(&rollout.target),
        s.failures.len()
    );
    if s.truncated {
        let _ = write!(
            out,
            " · drawn from the last {} events: the rollout's start is older",
            super::TIMELINE_EVENTS
        );
    }
    out.push_str("</figcaption></figure>");
    out
}

fn plot_w() -> f64 {
    WIDTH - LEFT - RIGHT
}

fn plot_h() -> f64 {
    HEIGHT - TOP - BOTTOM
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_rollout::{NodeProgress, Step, Strategy};

    fn event(at: u64, node: &str, kind: EventKind) -> Event {
        Event {
            at,
            group: "web".into(),
            rollout: 2,
            node: (!node.is_empty()).then(|| node.into()),
            kind,
            detail: "<b>why</b>".into(),
        }
    }

    fn rollout() -> Rollout {
        let mut nodes = std::collections::BTreeMap::new();
        nodes.insert(
            "already".to_owned(),
            NodeProgress {
                from: None,
                started: None,
                strategy: Strategy::InPlace,
                step: Step::Done { at: 100 },
            },
        );
        Rollout {
            id: 2,
            group: "web".into(),
            target: "2<x>".into(),
            image: String::new(),
            created: 100,
            state: RolloutState::Running,
            nodes,
            recent_starts: Vec::new(),
            acknowledged: Default::default(),
        }
    }

    #[test]
    fn the_series_follows_commits_and_failures() {
        let events = [
            event(100, "", EventKind::RolloutStarted),
            event(101, "a", EventKind::Started),
            event(105, "a", EventKind::Committed),
            event(106, "b", EventKind::Failed),
            event(107, "", EventKind::Paused),
            event(108, "a", EventKind::Failed),
            Event {
                rollout: 1,
                ..event(109, "c", EventKind::Committed)
            },
        ];
        let s = series(&rollout(), &events);
        assert_eq!(s.on_target, vec![(100, 1), (105, 2), (108, 1)]);
        assert_eq!(s.failures.len(), 2);
        assert_eq!(s.marks, vec![(107, "paused")]);
        assert!(!s.truncated);
        let svg = svg(&rollout(), &events, 4, 110);
        assert!(svg.contains("data-failure=\"b\""), "{svg}");
        assert!(
            !svg.contains("<b>") && !svg.contains("2<x>"),
            "escaped: {svg}"
        );
        assert!(series(&rollout(), &events[2..]).truncated);
    }
}
