//! `slate push` and `slate pull`: installer bundles to and from OCI registries and local layouts
//! (`slate-transport`), with progress bars.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;
use slate_bundle::Bundle;
use slate_transport::Reference;

use crate::args::{OutputFormat, RegistryArgs};
use crate::progress::{pull_to_cache, TransferBars};

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The installer bundle (an OCI image layout directory); every tag in it is pushed.
    #[arg(long)]
    pub bundle: PathBuf,
    /// Where to: `host[:port]/repository[:tag]` or `oci-layout:PATH[:TAG]`. A tag the bundle
    /// does not have becomes the name of its only image.
    #[arg(long)]
    pub image: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Show what would be pushed (read from the bundle alone); contact nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// What to pull: `host[:port]/repository:tag`, `host/repository@sha256:…`, or
    /// `oci-layout:PATH[:TAG]`.
    #[arg(long)]
    pub image: String,
    /// The local layout cache (created when missing). Blobs already in it are not fetched
    /// again; an interrupted pull resumes.
    #[arg(long)]
    pub cache: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[arg(long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

fn parse(image: &str) -> Result<Reference> {
    Ok(Reference::parse(image)?)
}

pub fn push(args: PushArgs) -> Result<()> {
    let reference = parse(&args.image)?;
    if args.dry_run {
        let plan = slate_transport::plan_push(&args.bundle, &reference)
            .with_context(|| format!("reading {}", args.bundle.display()))?;
        for image in &plan.images {
            println!(
                "would push {} ({}) as {}",
                image.source_tag.as_deref().unwrap_or("(untagged)"),
                image.manifest_digest,
                image.destination
            );
        }
        println!(
            "{} blobs, {} bytes at most (blobs the destination has are skipped)",
            plan.blobs.len(),
            plan.total_bytes()
        );
        return Ok(());
    }
    let options = args.registry.options()?;
    let mut bars = TransferBars::default();
    let pushed =
        slate_transport::push_with(&args.bundle, &reference, &options, &mut |e| bars.event(e))
            .with_context(|| format!("pushing {} to {reference}", args.bundle.display()))?;
    drop(bars);
    for reference in &pushed.references {
        println!("pushed {reference}");
    }
    println!(
        "{} bytes sent, {} bytes already there",
        pushed.uploaded_bytes, pushed.skipped_bytes
    );
    Ok(())
}

pub fn pull(args: PullArgs) -> Result<()> {
    let reference = parse(&args.image)?;
    let pulled = pull_to_cache(&reference, &args.cache, &args.registry)?;
    let bundle = Bundle::open(&pulled.layout_dir, Some(&pulled.tag)).with_context(|| {
        format!(
            "{reference} was pulled into {}, but it is not a slate installer bundle",
            pulled.layout_dir.display()
        )
    })?;
    let layout = std::path::absolute(&pulled.layout_dir).unwrap_or(pulled.layout_dir.clone());
    let manifest = bundle.manifest();
    match args.output {
        OutputFormat::Json => {
            let value = serde_json::json!({
                "layout": layout,
                "tag": pulled.tag,
                "digest": pulled.manifest_digest,
                "signature_tag": pulled.signature_tag,
                "name": manifest.name,
                "version": manifest.version,
                "fetched_bytes": pulled.fetched_bytes,
                "cached_bytes": pulled.cached_bytes,
            });
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &value)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            println!("layout:    {}", layout.display());
            println!("tag:       {}", pulled.tag);
            println!("digest:    {}", pulled.manifest_digest);
            println!(
                "signature: {}",
                pulled.signature_tag.as_deref().unwrap_or("none")
            );
            println!("bundle:    {} {}", manifest.name, manifest.version);
            println!(
                "fetched:   {} bytes ({} bytes were cached)",
                pulled.fetched_bytes, pulled.cached_bytes
            );
        }
    }
    if pulled.signature_tag.is_none() {
        eprintln!("note: {reference} has no signature ({reference} carries no sha256-….sig tag)");
    }
    Ok(())
}
