//! `slate meta`: list, get, set and delete META values on a disk, and encode or decode the
//! kernel-argument payload.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use base64::Engine as _;
use clap::{Args, Subcommand};
use serde::Serialize;
use slate_disk::{Disk, FileDisk};
use slate_meta::{parse_tag, payload, tag_name, MetaStore};

use crate::args::{read_bytes, OutputFormat, MAX_SMALL_FILE_BYTES};

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
        #[command(flatten)]
        force: Force,
    },
    /// Delete one value and write META.
    Delete {
        tag: String,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        force: Force,
    },
    /// Lay down an empty META (both ADV copies and the legacy area), erasing what the area held.
    Format {
        #[command(flatten)]
        target: Target,
        /// Say what would be erased, without writing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        force: Force,
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

/// Writing where slate's format is not: refused unless asked for.
#[derive(Debug, Args)]
pub struct Force {
    /// Write even into a partition not labelled META with the Linux data type, over an area
    /// whose copies are neither valid nor blank, or (format) over values META holds.
    #[arg(long)]
    force: bool,
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

/// How META is opened: to read, or for a change (`--dry-run` opens read-only but is refused
/// exactly as the change would be).
#[derive(Debug, Clone, Copy)]
struct Access {
    write: bool,
    /// Refuse a partition that is not labelled META with the Linux data type.
    check_partition: bool,
    /// Refuse an area whose copies are neither valid nor blank.
    check_content: bool,
}

const READ: Access = Access {
    write: false,
    check_partition: false,
    check_content: false,
};

/// The access a set or delete needs.
fn change(dry_run: bool, force: &Force) -> Access {
    Access {
        write: !dry_run,
        check_partition: !force.force,
        check_content: !force.force,
    }
}

fn open(target: &Target, access: Access) -> Result<MetaStore<Box<dyn Disk>>> {
    let mut file = if access.write {
        FileDisk::open(&target.disk)
    } else {
        FileDisk::open_read_only(&target.disk)
    }
    .with_context(|| format!("opening {}", target.disk.display()))?;
    let disk: Box<dyn Disk> = if target.raw {
        Box::new(file)
    } else {
        // The table's own warnings (a damaged primary read through the backup) are worth
        // knowing before anything else is said about META.
        if let Ok(table) = slate_layout::read_gpt(&mut file) {
            for warning in &table.warnings {
                eprintln!("warning: {warning}");
            }
        }
        if access.check_partition {
            check_meta_partition(&mut file, target)?;
        }
        Box::new(
            slate_layout::open_partition(file, &target.partition)
                .with_context(|| format!("finding META on {}", target.disk.display()))?,
        )
    };
    let mut store = MetaStore::open(disk).with_context(|| "reading META".to_string())?;
    for warning in store.warnings() {
        eprintln!("warning: {warning}");
    }
    if access.check_content {
        store
            .check_writable()
            .with_context(|| format!("META on {}", target.disk.display()))?;
    }
    if access.write {
        // Checked above, or --force: the caller's write goes ahead.
        store.overwrite_unrecognized();
    }
    Ok(store)
}

fn check_meta_partition(disk: &mut FileDisk, target: &Target) -> Result<()> {
    let info = slate_layout::find_partition(&mut *disk, &target.partition)
        .with_context(|| format!("finding META on {}", target.disk.display()))?;
    if info.label != slate_layout::META_LABEL || info.type_guid != slate_layout::LINUX_DATA_TYPE {
        bail!(
            "partition {:?} on {} is not a META partition (label {:?}, type {}; META is labelled \
             {:?} with type {}): refusing to write there without --force",
            target.partition,
            target.disk.display(),
            info.label,
            info.type_guid,
            slate_layout::META_LABEL,
            slate_layout::LINUX_DATA_TYPE
        );
    }
    Ok(())
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
            let store = open(&target, READ)?;
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
            let store = open(&target, READ)?;
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
            force,
        } => {
            let tag = parse_tag_arg(&tag)?;
            let value = match (value, from_file) {
                (Some(value), _) => value.into_bytes(),
                (None, Some(path)) => read_bytes(&path, MAX_SMALL_FILE_BYTES, "the value file")?,
                (None, None) => bail!("give a VALUE or --from-file"),
            };
            let mut store = open(&target, change(dry_run, &force))?;
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
            force,
        } => {
            let tag = parse_tag_arg(&tag)?;
            let mut store = open(&target, change(dry_run, &force))?;
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
        MetaCommand::Format {
            target,
            dry_run,
            force,
        } => format(&target, dry_run, &force, &mut out)?,
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

/// `slate meta format`: the deliberate overwrite of what the area holds, but only of a
/// partition that says it is META (a raw area only if it is not recognizably something else),
/// and not over values META holds, unless `--force`.
fn format(target: &Target, dry_run: bool, force: &Force, out: &mut impl Write) -> Result<()> {
    let store = open(
        target,
        Access {
            write: !dry_run,
            check_partition: !force.force,
            check_content: target.raw && !force.force,
        },
    )?;
    let held = store.entries();
    if !held.is_empty() && !force.force {
        let tags: Vec<String> = held.iter().map(|e| describe(e.tag)).collect();
        bail!(
            "META on {} holds {} value(s) ({}); formatting erases them: add --force to do it",
            target.disk.display(),
            held.len(),
            tags.join(", ")
        );
    }
    let disk = store.into_disk();
    if dry_run {
        writeln!(
            out,
            "would format META on {} ({} bytes)",
            target.disk.display(),
            disk.len()
        )?;
        return Ok(());
    }
    MetaStore::format(disk)
        .with_context(|| format!("formatting META on {}", target.disk.display()))?;
    writeln!(out, "formatted META on {}", target.disk.display())?;
    Ok(())
}
