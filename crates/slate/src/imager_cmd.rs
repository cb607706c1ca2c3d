//! `slate imager build`: a profile in, an artifact out, with a progress display;
//! `slate imager extension`: a tree in, a signed system extension out.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use slate_imager::{Inputs, OutputKind, Progress};

#[derive(Debug, Subcommand)]
pub enum ImagerCommand {
    /// Build one artifact from a profile.
    Build(BuildArgs),
    /// Make a system extension: a squashfs image of a tree and its manifest (name, version,
    /// size, SHA-256), signed with a slate key (docs/formats.md §7.6). A profile names the
    /// manifest in `rootfs.extensions`.
    Extension(ExtensionArgs),
}

#[derive(Debug, Args)]
pub struct ExtensionArgs {
    /// The extension's name: unique within an image (a-z 0-9 _ -).
    #[arg(long)]
    name: String,
    /// The extension's own version (A-Z a-z 0-9 . ~ ^ _ + -).
    #[arg(long)]
    version: String,
    /// The directory whose content is layered over the root.
    #[arg(long)]
    tree: PathBuf,
    /// The private key that signs the manifest (PEM, as `slate keygen` writes).
    #[arg(long)]
    key: PathBuf,
    /// The directory that receives `<name>-<version>.sqsh` and `<name>-<version>.ext`.
    #[arg(long)]
    output: PathBuf,
    /// The squashfs image's zstd level.
    #[arg(long, default_value_t = 15)]
    zstd_level: u32,
    /// Check the inputs and print the plan without writing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The image profile (TOML).
    #[arg(long)]
    profile: PathBuf,
    /// What to build.
    #[arg(long = "output", value_name = "KIND",
          value_parser = clap::builder::PossibleValuesParser::new(OutputKind::ALL.map(OutputKind::name)))]
    kind: String,
    /// Where to write it (a file; a directory for `installer`).
    #[arg(long)]
    out: PathBuf,
    /// Build this version instead of the profile's.
    #[arg(long)]
    version: Option<String>,
    /// Append a kernel argument to the profile's (repeatable).
    #[arg(long = "kernel-arg", value_name = "ARG")]
    kernel_args: Vec<String>,
    /// Keep the outputs of costly stages (the root's compressed blocks, the compressed
    /// initramfs) in this directory and take them from it when their inputs recur: a rebuild
    /// after a small change is faster and writes the same bytes as a build without it.
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// Check the inputs and print the plan without building.
    #[arg(long)]
    dry_run: bool,
}

/// Timestamps of every artifact: SOURCE_DATE_EPOCH, or 0 so that builds are reproducible by
/// default.
fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")),
        Err(_) => Ok(0),
    }
}

pub fn run(cmd: ImagerCommand) -> Result<()> {
    match cmd {
        ImagerCommand::Build(args) => build(args),
        ImagerCommand::Extension(args) => extension(args),
    }
}

fn extension(args: ExtensionArgs) -> Result<()> {
    let req = slate_imager::ExtensionRequest {
        name: &args.name,
        version: &args.version,
        tree: &args.tree,
        key: &args.key,
        output: &args.output,
        source_date_epoch: source_date_epoch()?,
        zstd_level: args.zstd_level,
    };
    if args.dry_run {
        println!("would make the extension {} {}:", args.name, args.version);
        for step in slate_imager::plan_extension(&req)? {
            println!("  - {step}");
        }
        return Ok(());
    }
    let out = slate_imager::make_extension(&req)
        .with_context(|| format!("making the extension {} {}", args.name, args.version))?;
    println!(
        "made the extension {} {}: {} ({} bytes, {}), manifest {}",
        out.manifest.name,
        out.manifest.version,
        out.image_path.display(),
        out.manifest.size,
        out.manifest.digest,
        out.manifest_path.display()
    );
    Ok(())
}

/// The bytes of `path`: a file's length, or for a directory (an installer bundle, a layout)
/// the sum of the regular files in it — not the directory entry's own 4096.
fn bytes_in(path: &std::path::Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0; // a link is not followed: its target is counted where it lies, if inside
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| bytes_in(&entry.path()))
        .sum()
}

fn build(args: BuildArgs) -> Result<()> {
    let kind = OutputKind::parse(&args.kind)?;
    let mut inputs = Inputs::resolve(
        &args.profile,
        args.version.as_deref(),
        &args.kernel_args,
        kind,
        source_date_epoch()?,
    )
    .with_context(|| format!("checking the inputs of {}", args.profile.display()))?;
    if args.dry_run {
        println!(
            "would build {} {} {} into {}:",
            inputs.profile.name,
            inputs.profile.version,
            kind.name(),
            args.out.display()
        );
        for step in slate_imager::plan(&inputs) {
            println!("  - {step}");
        }
        if let Some(dir) = &args.cache {
            println!("  - stage cache in {}", dir.display());
        }
        return Ok(());
    }
    if let Some(dir) = &args.cache {
        let cache = slate_imager::StageCache::open(dir)
            .with_context(|| format!("opening the build cache {}", dir.display()))?;
        inputs.cache = Some(cache);
    }
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {pos}/{len}").expect("valid template"),
    );
    let out = slate_imager::build(&inputs, &args.out, &mut |event| match event {
        Progress::Step(step) => {
            bar.set_position(0);
            bar.set_length(0);
            bar.set_message(step);
        }
        Progress::Files { done, total } => {
            bar.set_length(total);
            bar.set_position(done);
        }
    })
    .with_context(|| format!("building {} into {}", kind.name(), args.out.display()))?;
    bar.finish_and_clear();
    let size = bytes_in(&out);
    println!(
        "built {} {} {}: {} ({size} bytes)",
        inputs.profile.name,
        inputs.profile.version,
        kind.name(),
        out.display()
    );
    if let Some(cache) = &inputs.cache {
        let s = cache.stats();
        println!(
            "build cache: {} reused, {} stored, {} damaged entries rebuilt{}",
            s.hits,
            s.stored,
            s.corrupt,
            match s.write_errors {
                0 => String::new(),
                n => format!(", {n} could not be written"),
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bytes_in;

    #[test]
    fn a_directory_counts_the_files_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(bundle.join("blobs/sha256")).unwrap();
        std::fs::write(bundle.join("index.json"), [0u8; 100]).unwrap();
        std::fs::write(bundle.join("blobs/sha256/a"), vec![0u8; 70_000]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", bundle.join("link")).unwrap();
        assert_eq!(bytes_in(&bundle), 70_100);
        assert_eq!(bytes_in(&bundle.join("index.json")), 100);
    }
}
