//! A group's tick, following its nodes: each started node moved along by what it last
//! reported (upgrading, soaking, done or failed), and the covered nodes already on the target
//! marked done.

use slate_release::compare;

use crate::held::Held;
use crate::limits::Phase;
use crate::rollout::{EventKind, NodeProgress, Step};
use crate::tick::{failed, join, GroupTick};

impl GroupTick<'_, '_> {
    /// Moves every started node along by what it last reported, and marks covered nodes found
    /// on the target (or past it) as done.
    pub(crate) fn follow_nodes(&mut self, rollout: &mut Held<'_>) {
        let now = self.t.now;
        self.phases = join(&self.covered, &rollout.nodes);
        let target = rollout.target.as_str();
        // Decided over the rollout as it stands, applied after: the rollout is copied only
        // when a node moves.
        let mut moves: Vec<(String, Step)> = Vec::new();
        for (id, progress) in &rollout.nodes {
            if progress.step.is_finished() {
                continue;
            }
            let id = id.as_str();
            let record = self.record(id);
            let started = progress.started.unwrap_or(0);
            let next = match (&progress.step, record) {
                (Step::Upgrading { prior_failure, .. }, Some(rec)) => {
                    let r = &rec.report;
                    let new_failure = r
                        .last_failure
                        .as_ref()
                        .filter(|f| f.version == target && Some(*f) != prior_failure.as_ref());
                    let timeout = self.t.policies.upgrade_timeout_of(r).as_secs();
                    if let Some(f) = new_failure {
                        Some(failed(now, format!("reverted from {target}: {}", f.reason)))
                    } else if r.version == target
                        && r.committed
                        && r.healthy
                        && !r.busy
                        && rec.last_seen >= started
                    {
                        Some(Step::Soaking { committed: now })
                    } else if now >= started + timeout {
                        Some(failed(
                            now,
                            format!("no healthy commit of {target} within {timeout} s"),
                        ))
                    } else {
                        None
                    }
                }
                (Step::Upgrading { .. }, None) => {
                    let timeout = crate::policy::DEFAULT_UPGRADE_TIMEOUT.as_secs();
                    (now >= started + timeout)
                        .then(|| failed(now, "left the inventory while upgrading".into()))
                }
                (Step::Soaking { committed }, rec) => {
                    let committed = *committed;
                    match rec {
                        Some(rec) if self.stale(rec) => Some(failed(
                            now,
                            format!("stopped reporting while soaking on {target}"),
                        )),
                        Some(rec) if rec.last_seen >= committed && rec.report.version != target => {
                            Some(failed(
                                now,
                                format!("went back to {} while soaking", rec.report.version),
                            ))
                        }
                        Some(rec) if rec.last_seen >= committed && !rec.report.healthy => {
                            Some(failed(now, format!("unhealthy while soaking on {target}")))
                        }
                        None => Some(failed(now, "left the inventory while soaking".into())),
                        Some(_) if self.t.probes.get(id) == Some(&false) => Some(failed(
                            now,
                            format!("its probe failed while soaking on {target}"),
                        )),
                        Some(_)
                            if now >= committed + self.soak_of(id)
                                && (!self.probed(id) || self.t.probes.get(id) == Some(&true)) =>
                        {
                            Some(Step::Done { at: now })
                        }
                        Some(_) => None,
                    }
                }
                (Step::Done { .. } | Step::Failed { .. }, _) => None,
            };
            if let Some(step) = next {
                moves.push((id.to_owned(), step));
            }
        }
        for (id, step) in moves {
            let kind = match &step {
                Step::Soaking { .. } => EventKind::Committed,
                Step::Done { .. } => EventKind::Soaked,
                _ => EventKind::Failed,
            };
            let detail = match &step {
                Step::Failed { reason, .. } => reason.clone(),
                _ => String::new(),
            };
            self.event(rollout, Some(&id), kind, detail);
            if let Ok(i) = self
                .covered
                .binary_search_by(|rec| rec.report.id.as_str().cmp(&id))
            {
                self.phases[i] = Some(Phase::of(&step));
            }
            if let Some(p) = rollout.to_mut().nodes.get_mut(&id) {
                p.step = step;
            }
        }
        // A fleet runs few versions: each is compared with the target once a tick.
        let mut reached: Vec<(&str, bool)> = Vec::new();
        for (i, rec) in self.covered.iter().enumerate() {
            let r = &rec.report;
            if self.phases[i].is_some() {
                continue;
            }
            let at_or_past = match reached.iter().find(|(v, _)| *v == r.version) {
                Some((_, known)) => *known,
                None => {
                    let known = compare(&r.version, &rollout.target).is_ge();
                    reached.push((&r.version, known));
                    known
                }
            };
            if at_or_past {
                self.phases[i] = Some(Phase::Done);
                rollout.to_mut().nodes.insert(
                    r.id.clone(),
                    NodeProgress {
                        from: None,
                        started: None,
                        strategy: self.t.policies.strategy_of(r),
                        step: Step::Done { at: now },
                    },
                );
            }
        }
    }

    /// Whether a covering policy probes this node.
    fn probed(&self, id: &str) -> bool {
        self.views
            .iter()
            .any(|v| v.policy.probe.is_some() && v.contains(id))
    }

    /// The soak a node's waves ask for: the longest over its policies.
    fn soak_of(&self, id: &str) -> u64 {
        self.views
            .iter()
            .filter_map(|v| v.wave_of(id).map(|w| v.policy.waves[w].soak.as_secs()))
            .max()
            .unwrap_or(0)
    }
}
