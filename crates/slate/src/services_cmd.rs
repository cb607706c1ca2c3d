//! `slate services` and `slate service start|stop|restart NAME`: the node's services, and an
//! operator's hand on one of them.

use anyhow::{bail, Context as _, Result};
use clap::Subcommand;
use slate_api::{NodeServiceStatus, ServiceAction, ServiceControlRequest};

use crate::args::{print_json, NodeTarget, OutputFormat};

#[derive(Subcommand, Debug)]
pub enum ServiceCommand {
    /// Start a stopped (or exited, or failed) service.
    Start(ServiceArgs),
    /// Stop a service: its stop signal, its grace period, then its whole cgroup killed. It
    /// stays stopped until started or until the next boot.
    Stop(ServiceArgs),
    /// Stop, then start.
    Restart(ServiceArgs),
}

#[derive(clap::Args, Debug)]
pub struct ServiceArgs {
    /// The service's name (`slate services` lists them).
    name: String,
    /// Say what would be done, and do nothing.
    #[arg(long)]
    dry_run: bool,
    #[arg(long, value_enum, default_value_t)]
    output: OutputFormat,
}

/// `slate services`.
pub fn list(target: &NodeTarget, output: OutputFormat) -> Result<()> {
    let view = target
        .client()?
        .services()
        .context("asking the node for its services")?;
    match output {
        OutputFormat::Json => print_json(&view),
        OutputFormat::Text => {
            print!("{}", table(&view.services));
            Ok(())
        }
    }
}

/// One row per service: what `slate services` prints.
fn table(services: &[NodeServiceStatus]) -> String {
    if services.is_empty() {
        return "no services\n".to_owned();
    }
    let mut out = format!(
        "{:<20} {:<9} {:>7} {:>5} {:>8} {:>9}  {}\n",
        "NAME", "STATE", "PID", "READY", "RESTARTS", "MEMORY", "LAST EXIT"
    );
    for s in services {
        let pid = s.pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
        let memory = s
            .memory_bytes
            .map_or_else(|| "-".to_owned(), |b| format!("{} KiB", b / 1024));
        let mut last = s.last_exit.clone().unwrap_or_else(|| "-".to_owned());
        if let Some(ms) = s.restart_in_ms {
            last.push_str(&format!(" (restart in {ms} ms)"));
        }
        out.push_str(&format!(
            "{:<20} {:<9} {:>7} {:>5} {:>8} {:>9}  {last}\n",
            s.name,
            s.state,
            pid,
            if s.ready { "yes" } else { "no" },
            s.restarts,
            memory
        ));
    }
    out
}

/// `slate service start|stop|restart NAME`.
pub fn run(target: &NodeTarget, command: ServiceCommand) -> Result<()> {
    let (action, args) = match command {
        ServiceCommand::Start(args) => (ServiceAction::Start, args),
        ServiceCommand::Stop(args) => (ServiceAction::Stop, args),
        ServiceCommand::Restart(args) => (ServiceAction::Restart, args),
    };
    let client = target.client()?;
    let verb = format!("{action:?}").to_lowercase();
    if args.dry_run {
        let view = client
            .services()
            .context("asking the node for its services")?;
        let Some(service) = view.services.iter().find(|s| s.name == args.name) else {
            bail!("the node runs no service {:?}", args.name);
        };
        println!(
            "would {verb} service {} ({}); dry run: nothing done",
            service.name, service.state
        );
        return Ok(());
    }
    let status = client
        .control_service(&ServiceControlRequest {
            name: args.name.clone(),
            action,
        })
        .with_context(|| format!("asking the node to {verb} service {}", args.name))?;
    match args.output {
        OutputFormat::Json => print_json(&status),
        OutputFormat::Text => {
            print!("{}", table(std::slice::from_ref(&status)));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_what_an_operator_looks_for() {
        let running = NodeServiceStatus {
            name: "web".into(),
            state: "running".into(),
            pid: Some(312),
            since: 0,
            restarts: 0,
            ready: true,
            last_exit: None,
            memory_bytes: Some(2 << 20),
            restart_in_ms: None,
        };
        let crashing = NodeServiceStatus {
            name: "crash".into(),
            state: "backoff".into(),
            pid: None,
            restarts: 4,
            ready: false,
            last_exit: Some("exit code 3".into()),
            memory_bytes: None,
            restart_in_ms: Some(1500),
            ..running.clone()
        };
        let text = table(&[running, crashing]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(
            lines[1].starts_with("web")
                && lines[1].contains("312")
                && lines[1].contains("2048 KiB")
        );
        assert!(
            lines[2].contains("backoff") && lines[2].ends_with("exit code 3 (restart in 1500 ms)"),
            "{text}"
        );
        assert_eq!(table(&[]), "no services\n");
    }
}
