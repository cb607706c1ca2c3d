//! A node's part of `GET /metrics`: its status and the backend's counters as gauges and
//! counters. One node per scrape target, so no label names the node; every label takes values
//! from a small set (stages, agent states, outcomes, the node's own health checks and phases).

use slate_metrics::{label, Scrape};

use crate::backend::NodeMetrics;
use crate::types::{Stage, Status};

/// The update agent's states (docs/node.md, "The update agent"): each is a series, 1 for the
/// current one, so that a state the agent is not in reads 0 rather than nothing.
const AGENT_STATES: &[&str] = &[
    "idle",
    "checking",
    "downloading",
    "waiting",
    "locking",
    "upgrading",
];

fn stage_name(stage: Stage) -> String {
    serde_json::to_value(stage)
        .ok()
        .and_then(|v| v.as_str().map(str::to_lowercase))
        .unwrap_or_default()
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// The text exposition of a node's state and counters.
pub fn node_metrics(status: &Status, counted: &NodeMetrics) -> String {
    let s = Scrape::new();
    s.gauge_vec(
        "slate_node_version_info",
        "The running OS version and the boot entry it was booted from (1).",
        &["version", "booted_entry"],
    )
    .with_label_values(&[
        &label(&status.version),
        &label(status.booted_entry.as_deref().unwrap_or("")),
    ])
    .set(1.0);
    let stages = s.gauge_vec(
        "slate_node_stage",
        "The node's lifecycle stage: 1 for the current one.",
        &["stage"],
    );
    for stage in Stage::ALL {
        stages
            .with_label_values(&[&stage_name(stage)])
            .set(flag(stage == status.stage));
    }
    s.gauge(
        "slate_node_committed",
        "1 when this boot is committed (healthy, nothing left to decide); 0 while the running \
         version is on trial and a reboot may still return to the older one.",
        flag(status.committed),
    );
    s.gauge(
        "slate_node_sequence_running",
        "1 while a sequence (boot, upgrade, reboot, ...) holds the node's lock.",
        flag(status.running_sequence.is_some()),
    );
    if let Some(rollback) = &status.last_rollback {
        s.gauge(
            "slate_node_last_rollback_timestamp_seconds",
            "When the node last returned to an older version (Unix seconds, the node's clock).",
            rollback.time as f64,
        );
    }
    let upgrades = s.counter_vec(
        "slate_node_upgrades_total",
        "Upgrades by outcome, kept across boots: installed (the new version set to boot on \
         trial), failed, staged (for the next boot), stage_failed, committed (a version on \
         trial committed at its boot), reverted (it did not stay: the older version is back).",
        &["outcome"],
    );
    for (outcome, n) in &counted.upgrades {
        upgrades.with_label_values(&[&label(outcome)]).inc_by(*n);
    }
    let rollbacks = s.counter_vec(
        "slate_node_rollbacks_total",
        "Returns to an older version by outcome, kept across boots: done and failed (asked \
         through the API), reverted (a failing boot of a version on trial went back), \
         fallback (boot counting brought the older version back).",
        &["outcome"],
    );
    for (outcome, n) in &counted.rollbacks {
        rollbacks.with_label_values(&[&label(outcome)]).inc_by(*n);
    }
    if !counted.boots.is_empty() {
        let boots = s.counter_vec(
            "slate_node_boots_total",
            "Boots by how they ended, kept across boots: committed (settled at stage \
             Running), failed (the fatal path).",
            &["outcome"],
        );
        for (outcome, n) in &counted.boots {
            boots.with_label_values(&[&label(outcome)]).inc_by(*n);
        }
    }
    if let Some(cpu) = counted.cpu_seconds {
        s.float_counter(
            "process_cpu_seconds_total",
            "CPU time machined has used, user and system, in seconds.",
            cpu,
        );
    }
    if !counted.last_upgrade_phases.is_empty() {
        let phases = s.gauge_vec(
            "slate_node_last_upgrade_phase_duration_seconds",
            "How long each phase of the last upgrade this boot ran took.",
            &["phase"],
        );
        for (phase, secs) in &counted.last_upgrade_phases {
            phases.with_label_values(&[&label(phase)]).set(*secs);
        }
    }
    s.counter(
        "slate_node_download_bytes_total",
        "Bytes of bundles the node downloaded since machined started.",
        counted.bytes_downloaded,
    );
    s.counter(
        "slate_node_download_reused_bytes_total",
        "Bytes of bundles the node already had in its cache and did not download again.",
        counted.bytes_reused,
    );
    if !counted.health_checks.is_empty() {
        let checks = s.gauge_vec(
            "slate_node_health_check_passing",
            "Each health check of the machine configuration: 1 when it last passed.",
            &["check"],
        );
        for (check, ok) in &counted.health_checks {
            checks.with_label_values(&[&label(check)]).set(flag(*ok));
        }
    }
    s.gauge(
        "slate_node_watchdog_enabled",
        "1 when machined feeds a hardware watchdog.",
        flag(counted.watchdog.is_some()),
    );
    if let Some(timeout) = counted.watchdog {
        s.gauge(
            "slate_node_watchdog_timeout_seconds",
            "The hardware watchdog's timeout.",
            timeout,
        );
    }
    if let Some(agent) = &status.agent {
        let states = s.gauge_vec(
            "slate_node_update_agent_state",
            "The update agent's state: 1 for the current one.",
            &["state"],
        );
        for state in AGENT_STATES {
            states
                .with_label_values(&[state])
                .set(flag(agent.state == *state));
        }
        s.gauge_vec(
            "slate_node_update_agent_info",
            "The update agent's strategy and channel (1).",
            &["strategy", "channel"],
        )
        .with_label_values(&[&label(&agent.strategy), &label(&agent.channel)])
        .set(1.0);
    }
    if let Some(at) = counted.next_window {
        s.gauge(
            "slate_node_update_agent_next_window_timestamp_seconds",
            "When the update agent's next maintenance window opens (Unix seconds).",
            at as f64,
        );
    }
    s.counter(
        "slate_node_journal_lines_dropped_total",
        "Journal lines dropped from the tail machined keeps for readers (the oldest, beyond \
         its bound) since it started.",
        counted.journal_lines_dropped,
    );
    if let Some(memory) = &status.memory {
        s.gauge(
            "slate_node_machined_resident_bytes",
            "machined's resident set.",
            (memory.rss_kib * 1024) as f64,
        );
        s.gauge(
            "slate_node_journal_bytes",
            "Bytes of journal lines machined keeps for readers.",
            memory.journal_bytes as f64,
        );
    }
    s.encode(&[])
}
