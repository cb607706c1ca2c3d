//! `slate bundle diff A B`: what changed between two installer bundles, read offline
//! (`slate_bundle_diff`). Parses, calls, prints; exits 0 whether or not the bundles differ.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
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
    print_diff(&diff, args.output)
}
