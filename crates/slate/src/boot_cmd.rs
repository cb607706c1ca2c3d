//! `slate boot explain --disk D`: every boot entry on a slate disk in menu order, and which one
//! boots next and why, from `slate_bootloader`'s selection model (systemd-boot or GRUB).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Subcommand;
use slate_bootloader::{BootExplanation, ExplainedEntry, LoaderKind, MemEfiVars};
use slate_disk::FileDisk;

use crate::args::{NodeTarget, OutputFormat};

#[derive(Debug, Subcommand)]
pub enum BootCommand {
    /// Every boot entry in menu order (version, tries, good/bad, fallback) and which one boots
    /// next, and why.
    Explain {
        /// The disk (image file or block device) holding a slate installation; read only.
        /// Without it, the node (`--node`) answers, with its firmware's variables.
        #[arg(long)]
        disk: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

pub fn run(target: &NodeTarget, cmd: BootCommand) -> Result<()> {
    let BootCommand::Explain { disk, output } = cmd;
    let Some(disk) = disk else {
        let value = target
            .client()?
            .boot_explain()
            .context("asking the node to explain its next boot")?;
        let explanation: BootExplanation = serde_json::from_value(value)
            .context("the node answered an explanation this slate cannot read")?;
        return print(&explanation, output);
    };
    let file =
        FileDisk::open_read_only(&disk).with_context(|| format!("opening {}", disk.display()))?;
    // Offline there are no firmware variables to read; the disk alone decides.
    let mut explanation = slate_bootloader::probe(file, MemEfiVars::new())
        .and_then(|loader| loader.explain())
        .with_context(|| {
            format!(
                "reading the boot entries on {} (is it a slate disk?)",
                disk.display()
            )
        })?;
    if explanation.loader == LoaderKind::SystemdBoot {
        explanation.warnings.push(
            "offline: the machine's LoaderEntryOneShot/LoaderEntryDefault were not read; if set \
             there, they come first"
                .to_owned(),
        );
    }
    print(&explanation, output)
}

fn print(explanation: &BootExplanation, output: OutputFormat) -> Result<()> {
    match output {
        OutputFormat::Json => {
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, explanation)?;
            writeln!(out)?;
        }
        OutputFormat::Text => print_text(explanation),
    }
    Ok(())
}

/// One line per entry in menu order, `>` marking the next boot; then the reason.
fn print_text(x: &BootExplanation) {
    println!("{} menu:", x.loader_name());
    let width = x.entries.iter().map(|e| e.name.len()).max().unwrap_or(0);
    for e in &x.entries {
        let marker = if e.next_boot { '>' } else { ' ' };
        println!("{marker} {:<width$}  {}", e.name, entry_facts(e).join(", "));
    }
    match &x.next_boot {
        Some(next) => println!("next boot: {next} because {}", x.reason_text),
        None => println!("next boot: nothing, because {}", x.reason_text),
    }
    if let Some(renamed) = &x.renamed_to {
        println!("  a boot attempt: systemd-boot renames it to {renamed} before starting it");
    }
    for w in &x.warnings {
        println!("warning: {w}");
    }
}

fn entry_facts(e: &ExplainedEntry) -> Vec<String> {
    let mut facts = vec![e.version.as_deref().unwrap_or("version unknown").to_owned()];
    facts.push(e.state.as_str().to_owned());
    if let Some(left) = e.tries_left {
        facts.push(format!(
            "tries {left} left, {} done",
            e.tries_done.unwrap_or(0)
        ));
    }
    if let Some(g) = &e.grub {
        if !g.complete {
            facts.push("incomplete".to_owned());
        }
        if g.saved_entry {
            facts.push("saved_entry".to_owned());
        }
        if g.next_entry {
            facts.push("next_entry".to_owned());
        }
    }
    if e.fallback {
        facts.push("fallback (META Upgrade)".to_owned());
    }
    facts
}
