//! `slate status --boot-times`: a node's boot breakdown as text (docs/node.md, "Boot
//! breakdown").

use std::fmt::Write as _;

use slate_api::BootTimes;

fn secs(us: u64) -> String {
    format!("{:.3}", us as f64 / 1e6)
}

/// The breakdown: the firmware and the loader (systemd-boot's timestamps), each step between
/// two milestones from the kernel's start on, then machined's phases and tasks by sequence.
pub fn render(times: &BootTimes) -> String {
    let mut out = String::new();
    let before_kernel = times.firmware_us.zip(times.loader_us).map(|(f, l)| f + l);
    let _ = writeln!(out, "{:>9} {:>8}  step", "at (s)", "took (s)");
    if times.firmware_us.is_none() {
        // systemd-boot leaves its TSC timer off under a hypervisor (the TSC may not be
        // virtualized), and so sets neither variable in a VM.
        let _ = writeln!(
            out,
            "{:>9} {:>8}  firmware and systemd-boot: not measured (no LoaderTimeInitUSec)",
            "-", "-"
        );
    }
    if let (Some(firmware), Some(loader)) = (times.firmware_us, times.loader_us) {
        let _ = writeln!(
            out,
            "{:>9} {:>8}  firmware, to systemd-boot (LoaderTimeInitUSec)",
            "-",
            secs(firmware)
        );
        let _ = writeln!(
            out,
            "{:>9} {:>8}  systemd-boot, to the kernel (LoaderTimeExecUSec)",
            "-",
            secs(loader)
        );
    }
    let mut previous = ("kernel started", 0u64);
    for m in &times.milestones {
        let took = m.at_us.saturating_sub(previous.1);
        let _ = writeln!(
            out,
            "{:>9} {:>8}  {} → {}",
            secs(m.at_us),
            secs(took),
            previous.0,
            m.name
        );
        previous = (&m.name, m.at_us);
    }
    // In start order: a phase before its tasks (they end first, so they were recorded first).
    let mut spans: Vec<&slate_api::BootSpan> = times.spans.iter().collect();
    spans.sort_by_key(|s| (s.start_us, s.task.is_some()));
    let mut sequence = "";
    for span in spans {
        if span.sequence != sequence {
            sequence = &span.sequence;
            let _ = writeln!(out, "machined: {sequence} sequence");
        }
        let what = match &span.task {
            Some(task) => format!("    task {task}"),
            None => format!("  phase {}", span.phase),
        };
        let _ = writeln!(
            out,
            "{:>9} {:>8}  {what}{}",
            secs(span.start_us),
            secs(span.took_us),
            if span.ok { "" } else { " (failed)" }
        );
    }
    if let Some(running) = times.milestones.iter().find(|m| m.name == "running") {
        let _ = write!(
            out,
            "Running {} s after the kernel started",
            secs(running.at_us)
        );
        if let Some(before) = before_kernel {
            let _ = write!(out, ", {} s after power-on", secs(before + running.at_us));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use slate_api::{BootSpan, Milestone};

    use super::*;

    #[test]
    fn the_breakdown_reads_in_boot_order() {
        let milestone = |name: &str, at_us| Milestone {
            name: name.into(),
            at_us,
        };
        let times = BootTimes {
            firmware_us: Some(2_500_000),
            loader_us: Some(400_000),
            milestones: vec![
                milestone("init started", 1_000_000),
                milestone("root mounted", 2_250_000),
                milestone("running", 5_000_000),
            ],
            spans: vec![
                BootSpan {
                    sequence: "Boot".into(),
                    phase: "network".into(),
                    task: Some("network".into()),
                    start_us: 3_000_000,
                    took_us: 1_500_000,
                    ok: true,
                },
                BootSpan {
                    sequence: "Boot".into(),
                    phase: "network".into(),
                    task: None,
                    start_us: 3_000_000,
                    took_us: 1_600_000,
                    ok: false,
                },
            ],
        };
        let text = render(&times);
        let unmeasured = render(&BootTimes {
            firmware_us: None,
            loader_us: None,
            ..times.clone()
        });
        assert!(
            unmeasured.contains("firmware and systemd-boot: not measured")
                && unmeasured.ends_with("Running 5.000 s after the kernel started\n"),
            "{unmeasured}"
        );
        let expected = [
            "   at (s) took (s)  step",
            "        -    2.500  firmware, to systemd-boot (LoaderTimeInitUSec)",
            "        -    0.400  systemd-boot, to the kernel (LoaderTimeExecUSec)",
            "    1.000    1.000  kernel started → init started",
            "    2.250    1.250  init started → root mounted",
            "    5.000    2.750  root mounted → running",
            "machined: Boot sequence",
            "    3.000    1.600    phase network (failed)",
            "    3.000    1.500      task network",
            "Running 5.000 s after the kernel started, 7.900 s after power-on",
            "",
        ]
        .join("\n");
        assert_eq!(text, expected);
    }
}
