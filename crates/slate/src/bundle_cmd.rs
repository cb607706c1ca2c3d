//! `slate bundle diff A B`: what changed between two installer bundles, read offline
//! (`slate_bundle_diff`). Parses, calls, prints; exits 0 whether or not the bundles differ.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use slate_bundle::Bundle;
use slate_bundle_diff::Side;

use crate::args::{print_diff, OutputFormat};

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// What changed from bundle A to bundle B: version, kernel release and image, command line,
    /// the initramfs' modules and init, the slate binary, and the root filesystem file by file
    /// (added, removed, changed). Reads only; exits 0 whether or not they differ.
    Diff(DiffArgs),
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Bundle A, the old side (an OCI image layout directory).
    #[arg(value_name = "A")]
    a: PathBuf,
    /// Bundle B, the new side.
    #[arg(value_name = "B")]
    b: PathBuf,
    /// The image's tag in A, when its layout holds several.
    #[arg(long)]
    tag_a: Option<String>,
    /// The image's tag in B, when its layout holds several.
    #[arg(long)]
    tag_b: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    output: OutputFormat,
}

pub fn run(cmd: BundleCommand) -> Result<()> {
    let BundleCommand::Diff(args) = cmd;
    // Both layouts open before either is read: a wrong path fails at once.
    let a = slate_bundle_diff::open(Side::A, &args.a, args.tag_a.as_deref())?;
    let b = slate_bundle_diff::open(Side::B, &args.b, args.tag_b.as_deref())?;
    let diff = slate_bundle_diff::diff_bundles(&a, &b)?;
    print_diff(&diff, args.output)?;
    if matches!(args.output, OutputFormat::Text) {
        print!("{}", download_text(&a, &b)?);
    }
    Ok(())
}

/// What a node running A would download to get B, from the two chunk indexes (issue 41): the
/// size up front. Text only: the JSON is the diff's, which the node's API carries too.
fn download_text(a: &Bundle, b: &Bundle) -> Result<String> {
    let (Some(held), Some(target)) = (
        a.chunk_index().context("bundle A's chunk index")?,
        b.chunk_index().context("bundle B's chunk index")?,
    ) else {
        // A whole download, as before issue 41: the output stays what it was.
        return Ok(String::new());
    };
    // A node running A derives B's root copy of a new slate binary once it has the binary
    // (formats.md §7.7, "Derived seeds"); here both bundles are at hand, so it is counted.
    let derived = derived_seed(a, b, &held);
    let without = slate_delta::estimate(&target, &[&held]);
    let e = match &derived {
        Some(seed) => slate_delta::estimate(&target, &[&held, seed]),
        None => without.clone(),
    };
    let percent = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
    let mut text = format!(
        "download: {} of {} bytes ({:.2} %): {} chunks and the {}-byte chunk index; {} bytes \
         reused\n",
        e.fetch_bytes(),
        e.full_bytes(),
        percent(e.fetch_bytes(), e.full_bytes()),
        e.fetch_chunks(),
        e.index_bytes,
        e.reuse_bytes(),
    );
    if let Some(seed) = &derived {
        text += &format!(
            "  derived on the node: B's root copy of its new slate binary ({} bytes), which \
             saves fetching {} bytes\n",
            seed.blobs[0].size,
            without.fetch_bytes().saturating_sub(e.fetch_bytes())
        );
    }
    for blob in &e.blobs {
        let role = b
            .manifest()
            .blobs
            .iter()
            .find(|(_, r)| r.digest == blob.blob)
            .map_or("?", |(role, _)| role.as_str());
        text += &format!(
            "  {role}: fetch {} of {} bytes ({:.2} %) in {} chunks, reuse {} chunks\n",
            blob.fetch_bytes,
            blob.size,
            percent(blob.fetch_bytes, blob.size),
            blob.fetch_chunks,
            blob.reuse_chunks,
        );
    }
    Ok(text)
}

/// What a node running `a` derives once it has `b`'s slate binary, as one chunk index; `None`
/// when `a`'s index holds that binary already, or when either side cannot be read as the node
/// would (then the figure counts the copy as fetched, as `slate upgrade --check` does).
fn derived_seed(
    a: &Bundle,
    b: &Bundle,
    held: &slate_delta::ChunkIndex,
) -> Option<slate_delta::ChunkIndex> {
    let binary = b.manifest().blobs.get(slate_bundle::INSTALLER_ROLE)?;
    if held.blob(&binary.digest).is_some() {
        return None;
    }
    let uki = a.read_blob(slate_bundle::UKI_ROLE).ok()?;
    let storage = slate_bundle_diff::root_storage(&uki).ok()?;
    let binary = b.read_blob(slate_bundle::INSTALLER_ROLE).ok()?;
    let seed = slate_machined::root_copy(&binary, storage).ok()??;
    Some(slate_delta::ChunkIndex {
        params: slate_delta::DEFAULT_PARAMS,
        blobs: vec![seed.chunks],
    })
}
