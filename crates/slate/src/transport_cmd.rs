//! `slate push` and `slate pull`: installer bundles to and from OCI registries and local layouts
//! (`slate-transport`), with progress bars; `slate pull --dry-run` (resolve only, write nothing)
//! and `slate pull --gc` (keep the last pulls of the cache).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Args;
use slate_bundle::Bundle;
use slate_transport::{CaCertificates, Client, GcReport, Pulled, Reference, Resolved};

use crate::args::{OutputFormat, RegistryArgs};
use crate::progress::TransferBars;

/// How to reach a registry beyond [`RegistryArgs`]: a private CA, and the hosts its credentials
/// may go to besides its own.
#[derive(Debug, Args)]
pub struct AccessArgs {
    /// A PEM file of CA certificates trusted besides the compiled-in roots: for a registry whose
    /// certificate comes from a private CA.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// A host (HOST or HOST:PORT) besides the registry's own that may receive its credentials:
    /// its token service, when the registry's 401 names one on another host (repeatable).
    /// Credentials never go to any other host, nor over plain HTTP to another machine.
    #[arg(long = "auth-host", value_name = "HOST")]
    pub auth_hosts: Vec<String>,
}

impl AccessArgs {
    fn client(&self, registry: &RegistryArgs) -> Result<Client> {
        let mut client = Client::new(registry.options()?);
        client.credential_hosts = self.auth_hosts.clone();
        if let Some(path) = &self.ca_file {
            client.ca = CaCertificates::from_pem_file(path)
                .with_context(|| format!("reading --ca-file {}", path.display()))?;
        }
        Ok(client)
    }
}

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
    #[command(flatten)]
    pub access: AccessArgs,
    /// Show what would be pushed (read from the bundle alone); contact nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// What to pull: `host[:port]/repository:tag`, `host/repository@sha256:…`, or
    /// `oci-layout:PATH[:TAG]`. Optional with --gc.
    #[arg(long, required_unless_present = "gc")]
    pub image: Option<String>,
    /// The local layout cache (created when missing). Blobs already in it are not fetched
    /// again; an interrupted pull resumes; pulls into one cache take turns.
    #[arg(long)]
    pub cache: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub access: AccessArgs,
    /// The most blob bytes (config and layers) an image may declare: a larger one is refused
    /// before anything is fetched.
    #[arg(long, value_name = "BYTES", default_value_t = slate_transport::DEFAULT_MAX_IMAGE_BYTES)]
    pub max_image_size: u64,
    /// Resolve the image (its digest, sizes, bundle, signature, what the cache already has)
    /// and write nothing; with --gc, show what would be removed.
    #[arg(long)]
    pub dry_run: bool,
    /// Garbage-collect the cache (after the pull, if --image is given): keep the images of the
    /// last --keep pulls and their signatures, remove every other image, the blobs only they
    /// use, and unfinished transfers.
    #[arg(long)]
    pub gc: bool,
    /// How many of the last pulled images --gc keeps.
    #[arg(long, value_name = "N", default_value_t = slate_transport::DEFAULT_KEEP, requires = "gc")]
    pub keep: usize,
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
    let client = args.access.client(&args.registry)?;
    let mut bars = TransferBars::default();
    let pushed = client
        .push(&args.bundle, &reference, &mut |e| bars.event(e))
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
    let mut client = args.access.client(&args.registry)?;
    client.max_image_bytes = args.max_image_size;
    let pulled = match &args.image {
        Some(image) => {
            let reference = parse(image)?;
            Some(if args.dry_run {
                let resolved = client
                    .resolve(&reference)
                    .with_context(|| format!("resolving {reference} (dry run)"))?;
                print_resolved(&args, &reference, &resolved)
            } else {
                pull_one(&args, &client, &reference)?
            })
        }
        None => None,
    };
    let gc = if args.gc {
        let report = slate_transport::gc(&args.cache, args.keep, args.dry_run)
            .with_context(|| format!("collecting garbage in {}", args.cache.display()))?;
        Some(report)
    } else {
        None
    };
    match args.output {
        OutputFormat::Json => {
            let mut value = pulled.unwrap_or_else(|| serde_json::json!({}));
            if let Some(report) = &gc {
                value["gc"] = gc_json(report);
            }
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &value)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            if let Some(report) = &gc {
                print_gc(&args.cache, args.keep, report);
            }
        }
    }
    Ok(())
}

/// Pull into the cache and print the result (text now, JSON returned for the caller to print).
fn pull_one(args: &PullArgs, client: &Client, reference: &Reference) -> Result<serde_json::Value> {
    let mut bars = TransferBars::default();
    let pulled: Pulled = client
        .pull(reference, &args.cache, &mut |e| bars.event(e))
        .with_context(|| format!("pulling {reference} into {}", args.cache.display()))?;
    drop(bars);
    let bundle = Bundle::open(&pulled.layout_dir, Some(&pulled.tag)).with_context(|| {
        format!(
            "{reference} was pulled into {}, but it is not a slate installer bundle",
            pulled.layout_dir.display()
        )
    })?;
    let layout = std::path::absolute(&pulled.layout_dir).unwrap_or(pulled.layout_dir.clone());
    let manifest = bundle.manifest();
    let value = serde_json::json!({
        "layout": layout,
        "tag": pulled.tag,
        "digest": pulled.manifest_digest,
        "signature_tag": pulled.signature_tag,
        "name": manifest.name,
        "version": manifest.version,
        "fetched_bytes": pulled.fetched_bytes,
        "cached_bytes": pulled.cached_bytes,
        "reused_bytes": pulled.reused_bytes,
    });
    if args.output == OutputFormat::Text {
        println!("layout:    {}", layout.display());
        println!("tag:       {}", pulled.tag);
        println!("digest:    {}", pulled.manifest_digest);
        println!(
            "signature: {}",
            pulled.signature_tag.as_deref().unwrap_or("none")
        );
        println!("bundle:    {} {}", manifest.name, manifest.version);
        println!(
            "fetched:   {} bytes ({} bytes were cached, {} reused from chunks held here)",
            pulled.fetched_bytes, pulled.cached_bytes, pulled.reused_bytes
        );
    }
    if pulled.signature_tag.is_none() {
        eprintln!("note: {reference} has no signature ({reference} carries no sha256-….sig tag)");
    }
    Ok(value)
}

/// Print what a pull would do (text now, JSON returned).
fn print_resolved(
    args: &PullArgs,
    reference: &Reference,
    resolved: &Resolved,
) -> serde_json::Value {
    let cached = resolved.cached_bytes(&args.cache);
    let bundle = resolved
        .bundle
        .as_ref()
        .map(|b| format!("{} {}", b.name, b.version));
    let value = serde_json::json!({
        "dry_run": true,
        "image": reference.to_string(),
        "tag": resolved.tag,
        "digest": resolved.manifest_digest,
        "name": resolved.bundle.as_ref().map(|b| &b.name),
        "version": resolved.bundle.as_ref().map(|b| &b.version),
        "signature_tag": resolved.signature_tag,
        "blobs": resolved.blobs.iter().map(|b| serde_json::json!({"digest": b.digest, "size": b.size})).collect::<Vec<_>>(),
        "total_bytes": resolved.total_bytes,
        "cached_bytes": cached,
        "signature_bytes": resolved.signature_bytes,
    });
    if args.output == OutputFormat::Text {
        println!(
            "would pull {reference} into {} (dry run: nothing written)",
            args.cache.display()
        );
        println!("tag:       {}", resolved.tag);
        println!("digest:    {}", resolved.manifest_digest);
        println!(
            "signature: {}",
            resolved.signature_tag.as_deref().unwrap_or("none")
        );
        println!(
            "bundle:    {}",
            bundle.as_deref().unwrap_or("(not a slate bundle)")
        );
        println!(
            "blobs:     {}, {} bytes ({} bytes already cached, {} to fetch)",
            resolved.blobs.len(),
            resolved.total_bytes,
            cached,
            resolved.total_bytes.saturating_sub(cached)
        );
    }
    value
}

fn gc_json(report: &GcReport) -> serde_json::Value {
    serde_json::json!({
        "dry_run": report.dry_run,
        "kept": report.kept,
        "removed_images": report.removed_images,
        "removed_blobs": report.removed_blobs.iter().map(|b| serde_json::json!({"digest": b.digest, "size": b.size})).collect::<Vec<_>>(),
        "removed_partials": report.removed_partials.iter().map(|(name, size)| serde_json::json!({"name": name, "size": size})).collect::<Vec<_>>(),
        "freed_bytes": report.freed_bytes(),
    })
}

fn print_gc(cache: &Path, keep: usize, report: &GcReport) {
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for name in &report.removed_images {
        println!("{verb} image {name}");
    }
    for blob in &report.removed_blobs {
        println!("{verb} blob {} ({} bytes)", blob.digest, blob.size);
    }
    for (name, size) in &report.removed_partials {
        println!("{verb} unfinished transfer incoming/{name} ({size} bytes)");
    }
    println!(
        "gc of {}: kept {} (the last {keep} pulls and their signatures); {verb} {} images, {} \
         blobs, {} bytes",
        cache.display(),
        if report.kept.is_empty() {
            "nothing".to_owned()
        } else {
            report.kept.join(", ")
        },
        report.removed_images.len(),
        report.removed_blobs.len(),
        report.freed_bytes()
    );
}
