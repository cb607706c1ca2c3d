//! `slate upgrade --image REF`: find the bundle (a local OCI layout, or one the node already
//! holds), check every digest here, stream it to the node, and ask the node to upgrade to it.
//! The node checks it again and runs the bundle's own installer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use slate_api::UpgradeRequest;
use slate_bundle::Bundle;

use crate::node_cmd::{client, NodeTarget, RebootModeArg};

#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The installer bundle: `oci-layout:PATH[:TAG]`, a layout directory, or
    /// `bundle:sha256:…` for one the node already received.
    #[arg(long)]
    pub image: String,
    /// Apply it on the next boot, before the OS comes up.
    #[arg(long)]
    pub stage: bool,
    /// Boot-counting tries for the new version (the node's default, 3, when absent).
    #[arg(long)]
    pub tries: Option<u32>,
    /// Allow an older version (the node's version floor still applies).
    #[arg(long)]
    pub allow_downgrade: bool,
    #[arg(long, value_enum, default_value_t)]
    pub reboot_mode: RebootModeArg,
    /// Show what would be sent, send nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Where the bundle comes from.
enum Source {
    /// Already on the node.
    OnNode(String),
    /// A local OCI layout and the tag to take (`None`: its only image).
    Layout(PathBuf, Option<String>),
}

fn parse_image(image: &str) -> Result<Source> {
    if image.starts_with("bundle:") {
        return Ok(Source::OnNode(image.to_owned()));
    }
    if let Some(rest) = image.strip_prefix("oci-layout:") {
        // PATH[:TAG]: a tag never holds '/', so a ':' after the last '/' starts it.
        let slash = rest.rfind('/').map_or(0, |i| i + 1);
        return Ok(match rest[slash..].rfind(':') {
            Some(i) => Source::Layout(
                rest[..slash + i].into(),
                Some(rest[slash + i + 1..].to_owned()),
            ),
            None => Source::Layout(rest.into(), None),
        });
    }
    if Path::new(image).join("index.json").is_file() {
        return Ok(Source::Layout(image.into(), None));
    }
    bail!(
        "{image:?} is not a bundle slate can read: give oci-layout:PATH[:TAG], a layout \
         directory, or bundle:sha256:… for a bundle the node already holds"
    )
}

/// Open the layout and check every blob against its digest before a byte leaves this machine.
fn open_checked(dir: &Path, tag: Option<&str>) -> Result<Bundle> {
    let bundle = Bundle::open(dir, tag).with_context(|| format!("opening {}", dir.display()))?;
    for role in bundle.manifest().blobs.keys() {
        bundle
            .read_blob(role)
            .with_context(|| format!("checking {}", dir.display()))?;
    }
    Ok(bundle)
}

pub fn run(target: &NodeTarget, args: UpgradeArgs) -> Result<()> {
    let client = client(target)?;
    let mut request = UpgradeRequest {
        image: String::new(),
        stage: args.stage,
        reboot_mode: args.reboot_mode.into(),
        allow_downgrade: args.allow_downgrade,
        tries: args.tries,
    };
    let (dir, tag) = match parse_image(&args.image)? {
        Source::OnNode(id) => {
            request.image = id;
            return send(&client, &request, args.dry_run);
        }
        Source::Layout(dir, tag) => (dir, tag),
    };
    let bundle = Arc::new(open_checked(&dir, tag.as_deref())?);
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
    println!(
        "uploaded {} {} ({}, {} bytes)",
        uploaded.name, uploaded.version, uploaded.id, uploaded.size
    );
    request.image = format!("bundle:{}", uploaded.id);
    send(&client, &request, false)
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

    #[test]
    fn layout_references_split_path_and_tag() {
        let Source::Layout(dir, tag) = parse_image("oci-layout:/tmp/a:b/cache:2.0.0").unwrap()
        else {
            panic!()
        };
        assert_eq!(dir, Path::new("/tmp/a:b/cache"));
        assert_eq!(tag.as_deref(), Some("2.0.0"));
        let Source::Layout(dir, tag) = parse_image("oci-layout:./cache").unwrap() else {
            panic!()
        };
        assert_eq!(dir, Path::new("./cache"));
        assert_eq!(tag, None);
        assert!(matches!(
            parse_image("bundle:sha256:00").unwrap(),
            Source::OnNode(_)
        ));
        let err = parse_image("/nonexistent/bundle").err().unwrap();
        assert!(err.to_string().contains("not a bundle slate can read"));
    }
}
