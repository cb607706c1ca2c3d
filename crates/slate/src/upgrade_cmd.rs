//! `slate upgrade --image REF`: find the bundle (a local OCI layout, or one the node already
//! holds), check every digest here, stream it to the node, and ask the node to upgrade to it.
//! The node checks it again and runs the bundle's own installer.
//!
//! `--check`: the node's running version (`GET /v1/image`) diffed with the bundle, as
//! `slate bundle diff` diffs two bundles (docs/formats.md §7.5), and what a pull of it by the
//! node would download (issue 41: the chunks the node lacks); nothing is sent.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use slate_api::UpgradeRequest;
use slate_bundle::Bundle;

use slate_transport::Reference;

use crate::args::{NodeTarget, OutputFormat, RebootModeArg, RegistryArgs};
use crate::progress::pull_to_cache;
use crate::wait::{Progress, Reporter, WaitArgs};

#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The installer bundle: `host[:port]/repository:tag` or `…@sha256:…` (pulled here, then
    /// uploaded), `oci-layout:PATH[:TAG]`, a layout directory, or `bundle:sha256:…` for one the
    /// node already received.
    #[arg(long)]
    pub image: String,
    /// Where registry pulls are cached (blobs by digest; an interrupted pull resumes).
    #[arg(long, env = "SLATE_CACHE", default_value = ".slate-cache")]
    pub cache: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Apply it on the next boot, before the OS comes up.
    #[arg(long)]
    pub stage: bool,
    /// Boot-counting tries for the new version, 1 to 15 (the node's default, 3, when absent).
    #[arg(long, value_parser = crate::args::parse_tries)]
    pub tries: Option<u32>,
    /// Allow an older version (the node's version floor still applies).
    #[arg(long)]
    pub allow_downgrade: bool,
    #[arg(long, value_enum, default_value_t)]
    pub reboot_mode: RebootModeArg,
    /// Replace rather than upgrade in place: the new version's first boot formats STATE and
    /// EPHEMERAL (new node key and machine-id, /var empty) and restores the node's machine
    /// configuration. The old version, if the new one reverts, boots on those fresh
    /// partitions too.
    #[arg(long, conflicts_with = "stage")]
    pub replace: bool,
    /// Show what would be sent, send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Show what the upgrade would change, and do nothing else: the version the node runs
    /// against the bundle, as `slate bundle diff` shows two bundles (version, kernel, command
    /// line, modules, init, slate binary, and the root filesystem file by file). Nothing is
    /// uploaded and no upgrade is asked; the only thing written is a registry image pulled into
    /// --cache. Exits 0 whether or not they differ. Not for bundle:sha256:… (read here).
    #[arg(long, conflicts_with_all = ["wait", "stage", "dry_run"])]
    pub check: bool,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// `json` with --wait: one progress event per line; with --check: the diff as one JSON
    /// value.
    #[arg(long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// Where the bundle comes from.
enum Source {
    /// Already on the node.
    OnNode(String),
    /// A local OCI layout and the tag to take (`None`: its only image).
    Layout(PathBuf, Option<String>),
    /// The pull cache and the pulled tag: every blob was verified as it was written there.
    Pulled(PathBuf, String),
    /// A dry run's registry image: resolved (manifest and bundle manifest verified), nothing
    /// pulled.
    Resolved(Box<slate_transport::Resolved>),
}

fn parse_image(args: &UpgradeArgs) -> Result<Source> {
    let image = args.image.as_str();
    if image.starts_with("bundle:") {
        return Ok(Source::OnNode(image.to_owned()));
    }
    if !image.starts_with("oci-layout:") && Path::new(image).join("index.json").is_file() {
        return Ok(Source::Layout(image.into(), None));
    }
    let reference = Reference::parse(image).with_context(|| {
        format!(
            "{image:?} is not a bundle slate can read: give host[:port]/repository:tag, \
             oci-layout:PATH[:TAG], a layout directory, or bundle:sha256:… for a bundle the \
             node already holds"
        )
    })?;
    if let Some(path) = reference.layout_path() {
        return Ok(Source::Layout(
            path.to_owned(),
            reference.tag().map(str::to_owned),
        ));
    }
    if args.dry_run {
        let resolved = slate_transport::resolve_with(&reference, &args.registry.options()?)
            .with_context(|| format!("resolving {reference} (dry run: nothing is pulled)"))?;
        println!(
            "would pull {reference} ({}, {} bytes of blobs, {} already in {})",
            resolved.manifest_digest,
            resolved.total_bytes,
            resolved.cached_bytes(&args.cache),
            args.cache.display()
        );
        return Ok(Source::Resolved(Box::new(resolved)));
    }
    let pulled = pull_to_cache(&reference, &args.cache, &args.registry)?;
    Ok(Source::Pulled(pulled.layout_dir, pulled.tag))
}

/// Open the layout and check every blob against its digest before a byte leaves this machine.
fn open_checked(dir: &Path, tag: Option<&str>) -> Result<Bundle> {
    let bundle = Bundle::open(dir, tag).with_context(|| format!("opening {}", dir.display()))?;
    slate_trust::verify_blobs(&bundle).with_context(|| format!("checking {}", dir.display()))?;
    Ok(bundle)
}

/// How long the node may take to read and hash its running image.
const CHECK_TIMEOUT: Duration = Duration::from_secs(600);

/// `--check`: the node's running version first (a node that cannot answer costs no pull), then
/// the bundle, read here with the readers `slate bundle diff` uses; the same diff and output.
fn check(target: &NodeTarget, args: &UpgradeArgs) -> Result<()> {
    if args.image.starts_with("bundle:") {
        anyhow::bail!(
            "--check reads the bundle here, and {} is only on the node: give its layout or \
             registry reference",
            args.image
        );
    }
    let client = target.client()?.with_timeout(CHECK_TIMEOUT);
    let route = slate_api::route_of(slate_api::Endpoint::ImageSummary);
    let mut running: serde_json::Value = client
        .call(route.method, route.path, None::<&()>)
        .map_err(|e| match e {
            slate_api::ClientError::NotFound(_) => anyhow::anyhow!(
                "{} does not serve {} {}: it runs a slate older than `upgrade --check`; compare \
                 bundles offline with `slate bundle diff OLD NEW`",
                client.addr(),
                route.method,
                route.path
            ),
            other => anyhow::Error::new(other),
        })
        .with_context(|| format!("reading the running image of {}", client.addr()))?;
    let held = running
        .as_object_mut()
        .and_then(|o| o.remove(HELD_CHUNKS))
        .and_then(|v| v.as_str().map(str::to_owned));
    let running: slate_bundle_diff::Summary = serde_json::from_value(running)
        .with_context(|| format!("reading the running image of {}", client.addr()))?;
    let bundle = match parse_image(args)? {
        Source::Layout(dir, tag) => open_checked(&dir, tag.as_deref())?,
        Source::Pulled(dir, tag) => slate_transport::open_cached(&dir, &tag)
            .with_context(|| format!("opening {}", dir.display()))?,
        // bundle:… is refused above; a registry image is only resolved on a --dry-run.
        Source::OnNode(_) | Source::Resolved(_) => {
            anyhow::bail!("--check reads the bundle here: give its layout or registry reference")
        }
    };
    let target_summary = slate_bundle_diff::inspect(slate_bundle_diff::Side::B, &bundle)?;
    let diff = slate_bundle_diff::diff(&running, &target_summary);
    let held = match held.as_deref() {
        None => Err(
            "the node does not list the chunks it holds: a slate older than delta \
                     updates"
                .to_owned(),
        ),
        Some(text) => hex::decode(text)
            .ok()
            .and_then(|bytes| slate_delta::ChunkIndex::parse(&bytes).ok())
            .ok_or_else(|| "the node's list of the chunks it holds is unreadable".to_owned()),
    };
    let download = bundle
        .download(held.as_ref().map_err(String::as_str))
        .context("reading the bundle's chunk index")?;
    match args.output {
        OutputFormat::Text => {
            crate::args::print_diff(&diff, args.output)?;
            println!("{}", download.text());
            Ok(())
        }
        OutputFormat::Json => {
            let mut value = serde_json::to_value(&diff)?;
            if let Some(object) = value.as_object_mut() {
                object.insert("download".into(), serde_json::to_value(&download)?);
            }
            crate::args::print_json(&value)
        }
    }
}

/// `GET /v1/image`'s list of the chunks the node holds (machined's `HELD_CHUNKS`).
const HELD_CHUNKS: &str = "held_chunks";

pub fn run(target: &NodeTarget, args: UpgradeArgs) -> Result<()> {
    if args.check {
        return check(target, &args);
    }
    let client = target.client()?;
    let mut request = UpgradeRequest {
        image: String::new(),
        stage: args.stage,
        reboot_mode: args.reboot_mode.into(),
        allow_downgrade: args.allow_downgrade,
        tries: args.tries,
        replace: args.replace,
    };
    let wait = args.wait.wait && !args.dry_run;
    let before = if wait {
        Some(crate::wait::status_before(target)?)
    } else {
        None
    };
    let bundle = match parse_image(&args)? {
        Source::OnNode(_) if wait => anyhow::bail!(
            "--wait needs the bundle's version to know what must be committed: give its layout \
             or registry reference rather than bundle:sha256:…"
        ),
        Source::OnNode(id) => {
            request.image = id;
            return send(&client, &request, args.dry_run);
        }
        Source::Layout(dir, tag) => open_checked(&dir, tag.as_deref())?,
        // Not read again to check: the pull hashed each blob on its way into the cache.
        Source::Pulled(dir, tag) => slate_transport::open_cached(&dir, &tag)
            .with_context(|| format!("opening {}", dir.display()))?,
        Source::Resolved(resolved) => {
            let (what, payload) = resolved.bundle.as_ref().map_or_else(
                || ("(not a slate bundle)".to_owned(), 0),
                |b| {
                    let payload: u64 = b.blobs.values().map(|x| x.size).sum();
                    (format!("{} {}", b.name, b.version), payload)
                },
            );
            println!(
                "would upload {what} ({}, {payload} bytes of blobs) to {} and upgrade it: \
                 {request:?}",
                resolved.manifest_digest,
                client.addr()
            );
            return Ok(());
        }
    };
    let bundle = Arc::new(bundle);
    let manifest = bundle.manifest();
    let payload: u64 = manifest.blobs.values().map(|b| b.size).sum();
    if args.dry_run {
        println!(
            "would upload {} {} ({}, {payload} bytes of blobs) to {} and upgrade it: {request:?}",
            manifest.name,
            manifest.version,
            bundle.manifest_digest(),
            client.addr()
        );
        return Ok(());
    }
    let bar = ProgressBar::new(payload);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("uploading {} {}", manifest.name, manifest.version));
    let (exporting, progress) = (bundle.clone(), bar.clone());
    let uploaded = client
        .upload_bundle(
            move |out| exporting.export_tar(out).map_err(std::io::Error::other),
            move |sent| progress.set_position(sent),
        )
        .with_context(|| format!("uploading the bundle to {}", client.addr()))?;
    bar.finish_and_clear();
    request.image = format!("bundle:{}", uploaded.id);
    let Some(before) = before else {
        println!(
            "uploaded {} {} ({}, {} bytes)",
            uploaded.name, uploaded.version, uploaded.id, uploaded.size
        );
        return send(&client, &request, false);
    };
    let reporter = Reporter::new(args.output);
    reporter.report(&Progress::Uploaded {
        version: uploaded.version.clone(),
        bytes: uploaded.size,
    });
    reporter.report(&Progress::Verified {
        version: uploaded.version.clone(),
        id: uploaded.id.clone(),
    });
    client.upgrade(&request).context("upgrading the node")?;
    reporter.report(&Progress::Accepted {
        operation: if request.stage {
            "staged upgrade".into()
        } else {
            "upgrade".into()
        },
    });
    crate::wait::follow(
        target,
        &before,
        Some(uploaded.version),
        &args.wait,
        &reporter,
    )
}

fn send(client: &slate_api::Client, request: &UpgradeRequest, dry_run: bool) -> Result<()> {
    if dry_run {
        println!("would ask {} to upgrade: {request:?}", client.addr());
        return Ok(());
    }
    client.upgrade(request).context("upgrading the node")?;
    println!(
        "upgrade to {} accepted by {}; the node reboots once its installer is done",
        request.image,
        client.addr()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(image: &str) -> UpgradeArgs {
        UpgradeArgs {
            image: image.into(),
            cache: PathBuf::from("/nonexistent-cache"),
            registry: RegistryArgs {
                insecure: false,
                username: None,
            },
            stage: false,
            tries: None,
            allow_downgrade: false,
            reboot_mode: RebootModeArg::Default,
            replace: false,
            dry_run: true,
            check: false,
            wait: WaitArgs {
                wait: false,
                timeout: 1200,
            },
            output: OutputFormat::Text,
        }
    }

    /// issue 18: `--tries` reaches the node's installer as a boot counter; out of range it is
    /// refused while the arguments are parsed, before anything is pulled or sent.
    #[test]
    fn tries_are_refused_out_of_range_while_parsing() {
        use clap::Parser as _;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            upgrade: UpgradeArgs,
        }
        let parse = |tries: &str| {
            let tries = format!("--tries={tries}");
            Cli::try_parse_from(["slate", "--image", "bundle:sha256:00", &tries])
                .map(|cli| cli.upgrade.tries)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse("15").unwrap(), Some(15));
        for bad in ["0", "16", "3000000000", "99999999999", "-1"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("--tries"), "{bad}: {err}");
        }
        let err = parse("3000000000").unwrap_err();
        assert!(
            err.contains("3000000000 boot-counting tries is not 1 to 15"),
            "{err}"
        );
    }

    #[test]
    fn images_name_layouts_node_bundles_or_registries() {
        let Source::Layout(dir, tag) = parse_image(&args("oci-layout:/tmp/cache:2.0.0")).unwrap()
        else {
            panic!()
        };
        assert_eq!(dir, Path::new("/tmp/cache"));
        assert_eq!(tag.as_deref(), Some("2.0.0"));
        assert!(matches!(
            parse_image(&args("bundle:sha256:00")).unwrap(),
            Source::OnNode(_)
        ));
        let err = parse_image(&args("no such thing")).err().unwrap();
        assert!(
            format!("{err:#}").contains("not a bundle slate can read"),
            "{err:#}"
        );
    }
}
