//! Where a boot's time went (`slate status --boot-times`, docs/node.md "Boot breakdown"):
//! systemd-boot's own timestamps for the firmware and the loader, slate init's milestones
//! (left in `/run`), machined's own, and every phase and task of Initialize, Install and Boot
//! as the sequencer timed them. All of it is kept in memory, bounded.

use std::sync::Mutex;
use std::time::Instant;

use slate_api::{BootSpan, BootTimes, Milestone};
use slate_sequencer::{SequenceKind, Span};

/// Spans kept: a boot has a few dozen; later sequences (upgrades, reboots) are not kept.
const MAX_SPANS: usize = 128;

/// What machined records as it boots.
#[derive(Debug, Default)]
pub struct BootRecord {
    milestones: Mutex<Vec<Milestone>>,
    spans: Mutex<Vec<BootSpan>>,
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl BootRecord {
    /// Records `name` now.
    pub fn milestone(&self, name: &str) {
        let at_us = micros(slate_host::since_boot());
        let mut all = self.milestones.lock().unwrap_or_else(|p| p.into_inner());
        if !all.iter().any(|m| m.name == name) {
            all.push(Milestone {
                name: name.to_owned(),
                at_us,
            });
        }
    }

    /// Records a span of the boot's sequences, its start placed on the boot's clock.
    pub fn span(&self, span: &Span) {
        if !matches!(
            span.sequence,
            SequenceKind::Initialize | SequenceKind::Install | SequenceKind::Boot
        ) {
            return;
        }
        let ago = Instant::now().saturating_duration_since(span.started);
        let start = slate_host::since_boot().saturating_sub(ago);
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        if spans.len() < MAX_SPANS {
            spans.push(BootSpan {
                sequence: format!("{:?}", span.sequence),
                phase: span.phase.clone(),
                task: span.task.clone(),
                start_us: micros(start),
                took_us: micros(span.took),
                ok: span.ok,
            });
        }
    }

    /// The breakdown as it stands: systemd-boot's timestamps (`LoaderTimeInitUSec`,
    /// `LoaderTimeExecUSec`), init's milestones, then machined's.
    pub fn times(&self) -> BootTimes {
        let loader_var =
            |name| slate_host::read_loader_string(name).and_then(|v| v.trim().parse::<u64>().ok());
        let (init, exec) = (
            loader_var("LoaderTimeInitUSec"),
            loader_var("LoaderTimeExecUSec"),
        );
        let mut milestones: Vec<Milestone> = std::fs::read_to_string(slate_host::INIT_MILESTONES)
            .map(|text| slate_host::parse_milestones(&text))
            .unwrap_or_default()
            .into_iter()
            .map(|(name, at_us)| Milestone { name, at_us })
            .collect();
        milestones.extend(
            self.milestones
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        BootTimes {
            firmware_us: init,
            loader_us: init.zip(exec).map(|(i, e)| e.saturating_sub(i)),
            milestones,
            spans: self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_boot_sequences_spans_are_kept_on_the_boot_clock() {
        let record = BootRecord::default();
        record.milestone("machined started");
        record.milestone("machined started");
        let started = Instant::now() - Duration::from_millis(30);
        for sequence in [SequenceKind::Boot, SequenceKind::Upgrade] {
            record.span(&Span {
                sequence,
                phase: "network".into(),
                task: Some("network".into()),
                started,
                took: Duration::from_millis(20),
                ok: true,
            });
        }
        let times = record.times();
        let names: Vec<&str> = times.milestones.iter().map(|m| m.name.as_str()).collect();
        assert!(names.ends_with(&["machined started"]), "{names:?}");
        assert_eq!(times.spans.len(), 1, "only the boot's sequences");
        let span = &times.spans[0];
        assert_eq!((span.sequence.as_str(), span.took_us), ("Boot", 20_000));
        let now = micros(slate_host::since_boot());
        assert!(span.start_us + 30_000 <= now + 5_000 && span.start_us + 25_000 <= now);
    }
}
