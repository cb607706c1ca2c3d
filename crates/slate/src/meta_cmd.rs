//! `slate meta`: list, get, set and delete META values on a disk, and encode or decode the
//! kernel-argument payload.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use base64::Engine as _;
use clap::{Args, Subcommand};
use serde::Serialize;
use slate_disk::{Disk, FileDisk};
use slate_meta::{parse_tag, payload, tag_name, MetaStore};

use crate::args::OutputFormat;

#[derive(Debug, Subcommand)]
pub enum MetaCommand {
    /// List every value.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Print one value.
    Get {
        /// Tag name (e.g. Upgrade) or number (6, 0x6).
        tag: String,
        #[command(flatten)]
        target: Target,
    },
    /// Set one value and write META.
    Set {
        tag: String,
        #[arg(required_unless_present = "from_file")]
        value: Option<String>,
        /// Take the value from a file (exact bytes) instead of the command line.
        #[arg(long, value_name = "PATH", conflicts_with = "value")]
        from_file: Option<PathBuf>,
        #[command(flatten)]
        target: Target,
        /// Check that the value fits and show what would change, without writing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete one value and write META.
    Delete {
        tag: String,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        dry_run: bool,
    },
    /// Encode TAG=VALUE pairs as a kernel-argument payload.
    Encode {
        #[arg(required = true, value_name = "TAG=VALUE")]
        values: Vec<String>,
    },
    /// Decode a kernel-argument payload.
    Decode {
        payload: String,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

/// Where META lives.
#[derive(Debug, Args)]
pub struct Target {
    /// A whole disk (image file or block device) with a GPT, or with --raw the META area itself.
    #[arg(long)]
    disk: PathBuf,
    /// Label of the META partition.
    #[arg(long, default_value = "META", conflicts_with = "raw")]
    partition: String,
    /// DISK is the META area itself, not a partitioned disk.
    #[arg(long)]
    raw: bool,
}

fn parse_tag_arg(text: &str) -> Result<u8> {
    parse_tag(text)
        .with_context(|| format!("{text:?} is neither a known tag name nor a number from 0 to 255"))
}

fn describe(tag: u8) -> String {
    match tag_name(tag) {
        Some(name) => format!("{tag} ({name})"),
        None => tag.to_string(),
    }
}

fn open(target: &Target, writable: bool) -> Result<MetaStore<Box<dyn Disk>>> {
    let file = if writable {
        FileDisk::open(&target.disk)
    } else {
        FileDisk::open_read_only(&target.disk)
    }
    .with_context(|| format!("opening {}", target.disk.display()))?;
    let disk: Box<dyn Disk> = if target.raw {
        Box::new(file)
    } else {
        Box::new(
            slate_layout::open_partition(file, &target.partition)
                .with_context(|| format!("finding META on {}", target.disk.display()))?,
        )
    };
    let store = MetaStore::open(disk).with_context(|| "reading META".to_string())?;
    for warning in store.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(store)
}

#[derive(Debug, Serialize)]
struct JsonEntry {
    tag: u8,
    name: Option<&'static str>,
    value: String,
    value_base64: String,
    legacy: bool,
}

pub fn run(cmd: MetaCommand) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match cmd {
        MetaCommand::List { target, output } => {
            let store = open(&target, false)?;
            let entries = store.entries();
            match output {
                OutputFormat::Json => {
                    let json: Vec<JsonEntry> = entries
                        .iter()
                        .map(|e| JsonEntry {
                            tag: e.tag,
                            name: tag_name(e.tag),
                            value: String::from_utf8_lossy(e.value).into_owned(),
                            value_base64: base64::engine::general_purpose::STANDARD.encode(e.value),
                            legacy: e.legacy,
                        })
                        .collect();
                    serde_json::to_writer_pretty(&mut out, &json)?;
                    writeln!(out)?;
                }
                OutputFormat::Text => {
                    for e in entries {
                        let legacy = if e.legacy { " [legacy]" } else { "" };
                        writeln!(
                            out,
                            "{}{legacy}\t{}",
                            describe(e.tag),
                            String::from_utf8_lossy(e.value)
                        )?;
                    }
                }
            }
        }
        MetaCommand::Get { tag, target } => {
            let tag = parse_tag_arg(&tag)?;
            let store = open(&target, false)?;
            let Some(value) = store.get(tag) else {
                bail!("tag {} is not set", describe(tag));
            };
            out.write_all(value)?;
            writeln!(out)?;
        }
        MetaCommand::Set {
            tag,
            value,
            from_file,
            target,
            dry_run,
        } => {
            let tag = parse_tag_arg(&tag)?;
            let value = match (value, from_file) {
                (Some(value), _) => value.into_bytes(),
                (None, Some(path)) => std::fs::read(&path)
                    .with_context(|| format!("reading the value from {}", path.display()))?,
                (None, None) => bail!("give a VALUE or --from-file"),
            };
            let mut store = open(&target, !dry_run)?;
            let old = store
                .get(tag)
                .map(|v| String::from_utf8_lossy(v).into_owned());
            store
                .set(tag, value.clone())
                .with_context(|| format!("setting tag {}", describe(tag)))?;
            if dry_run {
                let new = String::from_utf8_lossy(&value);
                writeln!(out, "would set {}: {old:?} -> {new:?}", describe(tag))?;
                return Ok(());
            }
            store
                .flush()
                .with_context(|| format!("writing META on {}", target.disk.display()))?;
        }
        MetaCommand::Delete {
            tag,
            target,
            dry_run,
        } => {
            let tag = parse_tag_arg(&tag)?;
            let mut store = open(&target, !dry_run)?;
            if !store.delete(tag) {
                bail!("tag {} is not set", describe(tag));
            }
            if dry_run {
                writeln!(out, "would delete {}", describe(tag))?;
                return Ok(());
            }
            store
                .flush()
                .with_context(|| format!("writing META on {}", target.disk.display()))?;
        }
        MetaCommand::Encode { values } => {
            let pairs = values
                .iter()
                .map(|pair| {
                    let (tag, value) = pair
                        .split_once('=')
                        .with_context(|| format!("{pair:?} is not TAG=VALUE"))?;
                    Ok((parse_tag_arg(tag)?, value))
                })
                .collect::<Result<Vec<_>>>()?;
            writeln!(out, "{}", payload::encode(&pairs)?)?;
        }
        MetaCommand::Decode {
            payload: text,
            output,
        } => {
            let values = payload::decode(&text).context("decoding the META payload")?;
            match output {
                OutputFormat::Json => {
                    let json: Vec<_> = values
                        .iter()
                        .map(|(tag, value)| {
                            serde_json::json!({"tag": tag, "name": tag_name(*tag), "value": value})
                        })
                        .collect();
                    serde_json::to_writer_pretty(&mut out, &json)?;
                    writeln!(out)?;
                }
                OutputFormat::Text => {
                    for (tag, value) in values {
                        writeln!(out, "{tag:#x}={value}")?;
                    }
                }
            }
        }
    }
    Ok(())
}
