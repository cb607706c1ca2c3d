//! Which waiting nodes a tick starts: in wave order, each one every covering policy allows,
//! counting it against those policies' limits at once.

use slate_machine_config::minute_of_week;
use slate_release::Release;

use crate::held::Held;
use crate::limits::{Counts, Phase};
use crate::node::NodeRecord;
use crate::rollout::{EventKind, NodeProgress, Order, Step, RATE_MEMORY_SECONDS};
use crate::tick::GroupTick;

impl<'t> GroupTick<'t, '_> {
    /// Why `rec` cannot start whatever the policies say, if so.
    fn own_reason(&self, rec: &NodeRecord, release: &Release) -> Option<String> {
        let r = &rec.report;
        if self.stale(rec) {
            Some(format!(
                "silent for {} s",
                self.t.now.saturating_sub(rec.last_seen)
            ))
        } else if r.busy {
            Some("busy with another sequence".into())
        } else if !r.healthy || !r.committed {
            Some("not healthy and committed".into())
        } else if !release.reachable_from(&r.version) {
            Some(format!(
                "{} upgrades only from {} or newer",
                release.version,
                release.min_from.as_deref().unwrap_or("?")
            ))
        } else {
            None
        }
    }

    pub(crate) fn start_nodes(&mut self, rollout: &mut Held<'_>) {
        let now = self.t.now;
        let Some(release) = self.t.index.get(&rollout.target).cloned() else {
            return;
        };
        let mut counts: Vec<Counts> = self
            .views
            .iter()
            .map(|v| {
                let phases = v.at.iter().map(|&i| self.phases[i]);
                Counts::of(v, phases, rollout, self.t.now, |rec| {
                    !self.stale(rec) && rec.report.healthy && !rec.report.busy
                })
            })
            .collect();
        // Without reasons to give, a policy that refused a member refuses every later one
        // this tick (see `tick`): `closed` remembers it, and once all are, nobody can start.
        let mut closed = vec![false; self.views.len()];
        let minute = minute_of_week(now);
        let ordered = std::mem::take(&mut self.ordered);
        for &(rec, at) in &ordered {
            if !self.explain && closed.iter().all(|c| *c) {
                break;
            }
            let r = &rec.report;
            if self.phases[at].is_some() {
                continue;
            }
            let own = self.own_reason(rec, &release);
            if own.is_some() && !self.explain {
                continue;
            }
            let blocked = own.or_else(|| {
                self.views
                    .iter()
                    .zip(&counts)
                    .zip(closed.iter_mut())
                    .find_map(|((v, c), closed)| {
                        let position = v.position_at(at)?;
                        if *closed && !self.explain {
                            return Some(String::new());
                        }
                        let reason = c.blocks(v, position, minute);
                        *closed |= reason.is_some();
                        reason
                    })
            });
            if let Some(reason) = blocked {
                if self.explain {
                    self.out.waiting.insert(r.id.clone(), reason);
                }
                continue;
            }
            for (v, c) in self.views.iter().zip(counts.iter_mut()) {
                if v.position_at(at).is_some() {
                    c.unavailable += 1;
                    c.healthy_up = c.healthy_up.saturating_sub(1);
                    c.recent_starts += 1;
                }
            }
            let strategy = self.t.policies.strategy_of(r);
            self.phases[at] = Some(Phase::Upgrading);
            let rollout = rollout.to_mut();
            rollout.nodes.insert(
                r.id.clone(),
                NodeProgress {
                    from: Some(r.version.clone()),
                    started: Some(now),
                    strategy,
                    step: Step::Upgrading {
                        issued: false,
                        prior_failure: r.last_failure.clone(),
                    },
                },
            );
            rollout.recent_starts.push((r.id.clone(), now));
            let detail = format!("{} → {}", r.version, rollout.target);
            self.event(rollout, Some(&r.id), EventKind::Started, detail);
            self.out.orders.push(Order {
                group: rollout.group.clone(),
                rollout: rollout.id,
                node: r.id.clone(),
                endpoint: r.endpoint.clone(),
                image: rollout.image.clone(),
                strategy,
            });
        }
        self.ordered = ordered;
        let forgotten = |(_, at): &(String, u64)| at + RATE_MEMORY_SECONDS <= now;
        if rollout.recent_starts.iter().any(forgotten) {
            rollout
                .to_mut()
                .recent_starts
                .retain(|start| !forgotten(start));
        }
    }
}
