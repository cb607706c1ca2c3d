//! Talking to a node's API: `slate --node ADDR status|version|reboot|reset|upgrade|logs|dmesg`,
//! and `slate gen certs` to make the identities both sides use.

use std::io::Write as _;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::args::{print_json, NodeTarget, OutputFormat, RebootModeArg};
use crate::wait::{Progress, Reporter, WaitArgs};

/// `slate gen certs`.
pub fn gen_certs(out: PathBuf, sans: Vec<String>, dry_run: bool) -> Result<()> {
    if dry_run {
        println!(
            "would write the client CA, the fleet CA, the service certificate ({}) and \
             admin/operator/reader certificates to {}",
            sans.join(", "),
            out.display()
        );
        return Ok(());
    }
    let generated = slate_api::gen_certs(&out, &sans)
        .with_context(|| format!("generating certificates in {}", out.display()))?;
    for file in generated.files {
        println!("{}", file.display());
    }
    Ok(())
}

/// `enabled (db: CN=…)`, `setup mode`, `disabled`.
fn secure_boot_line(sb: &slate_api::SecureBootStatus) -> String {
    let state = match (sb.enabled, sb.setup_mode) {
        (true, _) => "enabled",
        (false, true) => "setup mode (no keys enrolled, nothing enforced)",
        (false, false) => "disabled",
    };
    if sb.db.is_empty() {
        state.to_string()
    } else {
        format!(
            "{state} (updates must be signed under {})",
            sb.db.join("; ")
        )
    }
}

/// `slate gen secureboot-keys`.
pub fn gen_secureboot_keys(out: &std::path::Path, name: &str, dry_run: bool) -> Result<()> {
    if dry_run {
        println!(
            "would write {} to {} (certificates \"{name} PK|KEK|db\")",
            slate_imager::SECURE_BOOT_KEY_FILES.join(" "),
            out.display()
        );
        return Ok(());
    }
    let files = slate_imager::gen_secureboot_keys(out, name)
        .with_context(|| format!("generating Secure Boot keys in {}", out.display()))?;
    for file in files {
        println!("{}", file.display());
    }
    Ok(())
}

fn print_line(line: &str) -> ControlFlow<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|_| out.flush()) {
        Ok(()) => ControlFlow::Continue(()),
        Err(_) => ControlFlow::Break(()),
    }
}

pub fn status(target: &NodeTarget, output: OutputFormat, boot_times: bool) -> Result<()> {
    let status = target
        .client()?
        .status()
        .context("asking the node for its status")?;
    if boot_times {
        let times = status
            .boot_times
            .context("the node reports no boot breakdown (an older version?)")?;
        return match output {
            OutputFormat::Json => print_json(&times),
            OutputFormat::Text => {
                print!("{}", crate::boot_times::render(&times));
                Ok(())
            }
        };
    }
    // Loud whatever the format: on stderr, so a script reading the JSON still hears it.
    for warning in &status.warnings {
        eprintln!("WARNING: {warning}");
    }
    match output {
        OutputFormat::Json => print_json(&status),
        OutputFormat::Text => {
            println!("version:  {}", status.version);
            println!(
                "booted:   {}",
                status.booted_entry.as_deref().unwrap_or("unknown")
            );
            println!("stage:    {:?}", status.stage);
            println!("mode:     {:?}", status.mode);
            if let Some(seq) = &status.running_sequence {
                println!("running:  {seq}");
            }
            if let Some(name) = &status.node_name {
                println!("node:     {name}");
            }
            if let Some(hostname) = &status.hostname {
                println!("hostname: {hostname}");
            }
            if let Some(id) = &status.machine_id {
                println!("machine:  {id}");
            }
            println!(
                "boot:     {}",
                if status.committed {
                    "committed"
                } else {
                    "not committed yet"
                }
            );
            if let Some(failure) = &status.last_failure {
                println!("failed:   {} ({})", failure.version, failure.reason);
            }
            if let Some(rollback) = &status.last_rollback {
                println!(
                    "rollback: {} -> {} at {}: {}",
                    rollback.from,
                    rollback.to,
                    rfc3339(rollback.time),
                    rollback.reason
                );
            }
            if !status.pinned.is_empty() {
                println!("pinned:   {}", status.pinned.join(", "));
            }
            if let Some(sb) = &status.secure_boot {
                println!("secureboot: {}", secure_boot_line(sb));
            }
            if let Some(var) = &status.var {
                let encrypted = match (&var.unlocked, var.encrypted) {
                    (Some(how), true) => format!("encrypted, unlocked by {how}"),
                    (None, true) => "encrypted".to_owned(),
                    _ => "not encrypted".to_owned(),
                };
                println!("var:      {}, {encrypted} ({})", var.mode, var.prepared);
            }
            if let Some(memory) = &status.memory {
                println!(
                    "memory:   machined {} KiB resident, journal {} KiB",
                    memory.rss_kib,
                    memory.journal_bytes.div_ceil(1024)
                );
            }
            if let Some(agent) = &status.agent {
                print_agent(agent);
            }
            Ok(())
        }
    }
}

/// Unix seconds (the node's clock) as RFC 3339 in UTC, as every other time slate prints.
fn rfc3339(unix: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `updates:  fleet-lock on stable from REG/REPO; waiting for 2.0.0 (newest 2.0.0): lock …`
fn print_agent(agent: &slate_api::AgentStatus) {
    let source = agent
        .image
        .as_deref()
        .map(|image| format!(" from {image}"))
        .unwrap_or_default();
    println!("updates:  {} on {}{source}", agent.strategy, agent.channel);
    let target = agent
        .target
        .as_deref()
        .map(|t| format!(" {t}"))
        .unwrap_or_default();
    let newest = agent
        .newest_available
        .as_deref()
        .map(|n| format!(" (newest available {n})"))
        .unwrap_or_default();
    let reason = agent
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    println!("agent:    {}{target}{newest}{reason}", agent.state);
    if !agent.skipped.is_empty() {
        println!("skipped:  {}", agent.skipped.join(", "));
    }
}

pub fn version(target: &NodeTarget, output: OutputFormat) -> Result<()> {
    let version = target
        .client()?
        .version()
        .context("asking the node for its version")?;
    match output {
        OutputFormat::Json => print_json(&version),
        OutputFormat::Text => {
            println!(
                "{} ({}) kernel {} entry {}",
                version.version,
                version.arch,
                version.kernel.as_deref().unwrap_or("?"),
                version.booted_entry.as_deref().unwrap_or("?")
            );
            Ok(())
        }
    }
}

pub fn reboot(
    target: &NodeTarget,
    mode: RebootModeArg,
    entry: Option<&str>,
    dry_run: bool,
    wait: &WaitArgs,
    output: OutputFormat,
) -> Result<()> {
    let client = target.client()?;
    if dry_run {
        match entry {
            Some(entry) => println!(
                "would reboot {} into {entry} once ({mode:?})",
                client.addr()
            ),
            None => println!("would reboot {} ({mode:?})", client.addr()),
        }
        return Ok(());
    }
    let before = wait
        .wait
        .then(|| crate::wait::status_before(target))
        .transpose()?;
    match entry {
        Some(entry) => client
            .reboot_once_into(entry, mode.into())
            .with_context(|| format!("rebooting the node into {entry} once"))?,
        None => client.reboot(mode.into()).context("rebooting the node")?,
    }
    let Some(before) = before else {
        println!("reboot accepted by {}", client.addr());
        return Ok(());
    };
    let reporter = Reporter::new(output);
    reporter.report(&Progress::Accepted {
        operation: "reboot".into(),
    });
    crate::wait::follow(target, &before, None, wait, &reporter)
}

pub fn rollback(
    target: &NodeTarget,
    req: &slate_api::RollbackRequest,
    wait: &WaitArgs,
    output: OutputFormat,
) -> Result<()> {
    let client = target.client()?;
    let before = (wait.wait && !req.dry_run)
        .then(|| crate::wait::status_before(target))
        .transpose()?;
    let result = client
        .rollback(req)
        .with_context(|| format!("rolling back {}", client.addr()))?;
    if let Some(before) = before {
        let reporter = Reporter::new(output);
        reporter.report(&Progress::Accepted {
            operation: format!("rollback to {} ({} on trial)", result.version, result.to),
        });
        return crate::wait::follow(target, &before, Some(result.version), wait, &reporter);
    }
    match output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&result)?),
        OutputFormat::Text if result.dry_run => println!(
            "would roll back {} to {}: {} boots next on trial, {} kept to return to (dry run: \
             nothing written)",
            client.addr(),
            result.version,
            result.to,
            result.from
        ),
        OutputFormat::Text => println!(
            "rollback to {} accepted by {}: {} boots next on trial, {} kept to return to; the \
             node reboots",
            result.version,
            client.addr(),
            result.to,
            result.from
        ),
    }
    Ok(())
}

pub fn reset(target: &NodeTarget, dry_run: bool) -> Result<()> {
    let client = target.client()?;
    if dry_run {
        println!(
            "would reset {}: wipe STATE and EPHEMERAL, reboot",
            client.addr()
        );
        return Ok(());
    }
    client.reset().context("resetting the node")?;
    println!("reset accepted by {}", client.addr());
    Ok(())
}

pub fn shutdown(target: &NodeTarget, dry_run: bool) -> Result<()> {
    let client = target.client()?;
    if dry_run {
        println!("would shut {} down: teardown, power off", client.addr());
        return Ok(());
    }
    client.shutdown().context("shutting the node down")?;
    println!(
        "shutdown accepted by {}; it powers off once its teardown is done",
        client.addr()
    );
    Ok(())
}

/// `slate logs`, `slate logs --service NAME` (the service's output and what machined said of
/// it), `slate dmesg`.
pub fn logs(target: &NodeTarget, follow: bool, kernel: bool, service: Option<&str>) -> Result<()> {
    let client = target.client()?;
    if kernel {
        return client
            .dmesg(follow, print_line)
            .context("reading the kernel log");
    }
    match service {
        None => client
            .logs(follow, print_line)
            .context("reading machined's log"),
        Some(name) => client
            .logs(follow, |line| {
                if of_service(line, name) {
                    print_line(line)
                } else {
                    ControlFlow::Continue(())
                }
            })
            .with_context(|| format!("reading the log of service {name}")),
    }
}

/// Whether a journal line is service `name`'s: its output (`NAME: …`) or machined's words on it
/// (`service NAME: …`, an error's too).
fn of_service(line: &str, name: &str) -> bool {
    let line = line.strip_prefix("error: ").unwrap_or(line);
    let line = line.strip_prefix("service ").unwrap_or(line);
    line.strip_prefix(name)
        .is_some_and(|rest| rest.starts_with(": "))
}

/// `slate pin VERSION` / `slate unpin VERSION`.
pub fn pin(target: &NodeTarget, req: &slate_api::PinRequest, output: OutputFormat) -> Result<()> {
    let client = target.client()?;
    let verb = if req.pin { "pin" } else { "unpin" };
    let result = client
        .pin(req)
        .with_context(|| format!("{verb}ning {} on {}", req.version, client.addr()))?;
    match output {
        OutputFormat::Json => print_json(&result),
        OutputFormat::Text => {
            let pinned = if result.pinned.is_empty() {
                "none".to_owned()
            } else {
                result.pinned.join(", ")
            };
            let what = match (result.dry_run, result.changed) {
                (true, true) => format!("would {verb} {} (dry run: nothing written)", req.version),
                (_, false) => format!("{} was already {verb}ned: nothing to write", req.version),
                (false, true) => format!("{verb}ned {}", req.version),
            };
            println!("{what}; pinned: {pinned}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod service_log_tests {
    use super::of_service;

    #[test]
    fn a_services_lines_are_its_output_and_machineds_words_on_it() {
        for line in [
            "web: GET /index.html",
            "service web: started, pid 312",
            "error: service web: not ready after 60 s (tcp 127.0.0.1:8080)",
        ] {
            assert!(of_service(line, "web"), "{line}");
        }
        for line in [
            "webhook: started",
            "service webhook: started, pid 1",
            "stage Running",
            "web:no space",
        ] {
            assert!(!of_service(line, "web"), "{line}");
        }
    }
}

#[cfg(test)]
mod time_tests {
    use super::rfc3339;

    #[test]
    fn times_are_rfc_3339_in_utc() {
        assert_eq!(rfc3339(1796083200), "2026-12-01T00:00:00Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
