//! `slate release publish | promote | yank | list`: releases in a registry repository — the
//! release index under the tag `releases` (docs/formats.md §10, `slate_transport::releases`) and
//! the channel tags `alpha`, `beta`, `stable` that follow it.
//!
//! A bundle's image manifest is pushed as it is (its signature covers its digest); what a
//! release adds — version, created, channel, official, min_from, yanked — lives in the index.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand};
use slate_bundle::Bundle;
use slate_release::{Channel, Published, Release, ReleaseError, ReleaseIndex};
use slate_transport::releases::{move_channel_tags, plan_channel_tags, resolve_tag, TagMove};
use slate_transport::{fetch_release_index, update_release_index, Options, Reference};

use crate::args::{OutputFormat, RegistryArgs};
use crate::progress::TransferBars;

mod list;

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Push a signed bundle under its version, add it to the repository's release index in a
    /// channel, and move the channel tags (publishing a published version to a more
    /// conservative channel promotes it).
    Publish(PublishArgs),
    /// Move a published version to a more conservative channel (alpha → beta → stable; never
    /// back).
    Promote(PromoteArgs),
    /// Mark a version bad: nodes never install it, and channel tags that named it move back to
    /// the newest release that is not yanked.
    Yank(YankArgs),
    /// Each channel's versions in order, with digests, dates, barriers and yanks.
    List(ListArgs),
}

fn parse_channel(name: &str) -> Result<Channel, String> {
    Channel::parse(name).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The signed installer bundle (an OCI image layout holding one image).
    #[arg(long)]
    bundle: PathBuf,
    /// The repository: `host[:port]/repository` (a tag is ignored).
    #[arg(long)]
    image: String,
    /// alpha, beta or stable.
    #[arg(long, value_parser = parse_channel)]
    channel: Channel,
    /// The oldest version that may upgrade straight to this one (an upgrade barrier).
    #[arg(long, value_name = "VERSION")]
    min_from: Option<String>,
    /// Not built and signed by the release pipeline (a developer's build).
    #[arg(long)]
    unofficial: bool,
    /// Publish a bundle that carries no signature (only with --unofficial). The index does not
    /// vouch for a bundle: nodes check signatures against their own trusted keys regardless.
    #[arg(long)]
    allow_unsigned: bool,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Show the pushes, the index change and the tag moves; write nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// The published version.
    version: String,
    #[arg(long)]
    image: String,
    /// beta or stable (more conservative than the version's channel now).
    #[arg(long, value_parser = parse_channel)]
    channel: Channel,
    #[command(flatten)]
    registry: RegistryArgs,
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct YankArgs {
    /// The published version.
    version: String,
    #[arg(long)]
    image: String,
    /// Why (shown by `list` and kept in the index; a second yank keeps the first reason).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    registry: RegistryArgs,
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(long)]
    image: String,
    /// Only this channel (alpha, beta or stable).
    #[arg(long, value_parser = parse_channel)]
    channel: Option<Channel>,
    #[command(flatten)]
    registry: RegistryArgs,
    #[arg(long, value_enum, default_value_t)]
    output: OutputFormat,
}

pub fn run(cmd: ReleaseCommand) -> Result<()> {
    match cmd {
        ReleaseCommand::Publish(args) => publish(args),
        ReleaseCommand::Promote(args) => promote(args),
        ReleaseCommand::Yank(args) => yank(args),
        ReleaseCommand::List(args) => list::list(args),
    }
}

/// `created`: SOURCE_DATE_EPOCH when set (a reproducible pipeline), else now; RFC 3339, UTC.
fn created() -> Result<String> {
    let time = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => {
            let seconds: u64 = v
                .trim()
                .parse()
                .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"))?;
            UNIX_EPOCH + Duration::from_secs(seconds)
        }
        Err(_) => SystemTime::now(),
    };
    Ok(humantime::format_rfc3339_seconds(time).to_string())
}

/// `--image`: a repository. A tag in it would be ignored and then shown beside the version's
/// (`REPO:releases:2.0.0`), so it is refused, naming what goes where.
fn repository(image: &str) -> Result<Reference> {
    let reference = Reference::parse(image)?;
    if let Some(tag) = reference.tag() {
        bail!(
            "--image {image}: name the repository only (HOST/REPOSITORY), without :{tag} — a \
             bundle is pushed under its version, the index under `releases`, and the channel \
             tags are slate's to move"
        );
    }
    Ok(reference)
}

/// The tag the bundle of `version` is pushed under.
fn version_tag(repository: &Reference, version: &str) -> Result<Reference> {
    slate_release::check_release_version(version)
        .context("the bundle is pushed under its version; choose another version")?;
    repository.with_tag(version).with_context(|| {
        format!("the bundle is pushed under its version, and {version:?} is not a registry tag")
    })
}

fn published_text(version: &str, outcome: &Published, channel: Channel) -> String {
    match outcome {
        Published::New => format!("{version}: new in {channel}"),
        Published::Promoted { from, to } => format!("{version}: promoted from {from} to {to}"),
        Published::Unchanged => format!("{version}: already in {channel} (or further)"),
    }
}

/// `1.0.0`, or the digest when the index has no release of that digest.
fn name_of<'a>(index: &'a ReleaseIndex, digest: &'a str) -> &'a str {
    index
        .releases
        .iter()
        .find(|r| r.digest == digest)
        .map_or(digest, |r| r.version.as_str())
}

/// Print where each channel tag goes, and move them unless this is a dry run.
fn sync_tags(
    repository: &Reference,
    index: &ReleaseIndex,
    options: &Options,
    dry_run: bool,
) -> Result<()> {
    let moves = plan_channel_tags(repository, index, options)
        .with_context(|| format!("reading the channel tags of {repository}"))?;
    // Moved before "moved" is said: a move that fails leaves no line claiming it happened.
    if !dry_run {
        move_channel_tags(repository, &moves, options)
            .with_context(|| format!("moving the channel tags of {repository}"))?;
    }
    for m in &moves {
        println!("{}", tag_line(index, m, dry_run));
    }
    Ok(())
}

fn tag_line(index: &ReleaseIndex, m: &TagMove, dry_run: bool) -> String {
    let channel = m.channel;
    let current = m.current.as_deref().map(|d| name_of(index, d));
    match (&m.target, current) {
        (Some(target), _) if m.is_needed() => format!(
            "{} tag {channel}: {} → {} ({})",
            if dry_run { "would move" } else { "moved" },
            current.unwrap_or("(none)"),
            target.version,
            target.digest
        ),
        (Some(target), _) => format!("tag {channel}: {} (unchanged)", target.version),
        (None, Some(current)) => format!(
            "tag {channel} left on {current}: channel {channel} offers no release that is not \
             yanked"
        ),
        (None, None) => format!("tag {channel}: none (channel {channel} offers no release)"),
    }
}

/// The versions among `releases` whose manifest `repository` does not hold (by digest).
fn missing_manifests(
    repository: &Reference,
    releases: &[Release],
    options: &Options,
) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for r in releases {
        let held = resolve_tag(repository, &r.digest, options).with_context(|| {
            format!("looking for the manifest of {} in {repository}", r.version)
        })?;
        if held.is_none() {
            missing.push(r.version.clone());
        }
    }
    Ok(missing)
}

/// Everything that can be checked before the first write: `change` made on the index as it is
/// now (a refusal ends here), and the manifest of every release the change would point at —
/// `subject` (the version published or promoted) and each release a channel tag would move
/// to — held by the registry, except `pushing`, the bundle this command pushes itself before
/// the index. A promote of a version whose bundle is gone would otherwise rewrite the index
/// and then fail moving its tag. Returns the planned index and the change's outcome.
fn preflight<T>(
    repository: &Reference,
    options: &Options,
    change: &mut impl FnMut(&mut ReleaseIndex) -> Result<T, ReleaseError>,
    subject: Option<&str>,
    pushing: Option<&str>,
) -> Result<(ReleaseIndex, T)> {
    let mut planned = fetch_release_index(repository, options)
        .with_context(|| format!("reading the release index of {repository}"))?
        .unwrap_or_default();
    let outcome = change(&mut planned)?;
    let moves = plan_channel_tags(repository, &planned, options)
        .with_context(|| format!("reading the channel tags of {repository}"))?;
    let mut needed: Vec<Release> = subject
        .and_then(|v| planned.get(v))
        .into_iter()
        .chain(
            moves
                .iter()
                .filter(|m| m.is_needed())
                .filter_map(|m| m.target.as_ref()),
        )
        .filter(|r| Some(r.digest.as_str()) != pushing)
        .cloned()
        .collect();
    needed.dedup_by(|a, b| a.digest == b.digest);
    let missing = missing_manifests(repository, &needed, options)?;
    if let Some(version) = missing.first() {
        let digest = &needed
            .iter()
            .find(|r| &r.version == version)
            .expect("listed")
            .digest;
        bail!(
            "{repository} holds no manifest {digest} for release {version}: the index would \
             name a bundle nodes cannot pull (push the bundle of {version} again, or yank it); \
             nothing was written"
        );
    }
    Ok((planned, outcome))
}

/// Make `change` on the repository's index (re-read and retried when another publisher got in
/// between) and move the channel tags after it; with `dry_run`, on a copy, writing nothing.
/// Either way [`preflight`] first. `say` words the outcome (`true`: as what would happen).
fn apply<T>(
    repository: &Reference,
    options: &Options,
    dry_run: bool,
    (subject, pushing): (Option<&str>, Option<&str>),
    mut change: impl FnMut(&mut ReleaseIndex) -> Result<T, ReleaseError>,
    say: impl Fn(&T, bool) -> String,
) -> Result<()> {
    let (planned, outcome) = preflight(repository, options, &mut change, subject, pushing)?;
    let index = if dry_run {
        println!("{}", say(&outcome, true));
        planned
    } else {
        let update = update_release_index(repository, options, change)
            .with_context(|| format!("updating the release index of {repository}"))?;
        match (&update.digest, update.written, update.attempts) {
            (Some(digest), true, 1) => println!("release index: {digest}"),
            (Some(digest), true, n) => println!(
                "release index: {digest} (made {n} times: another publisher wrote in between)"
            ),
            _ => println!("release index: unchanged"),
        }
        println!("{}", say(&update.outcome, false));
        update.index
    };
    sync_tags(repository, &index, options, dry_run)?;
    if dry_run {
        println!("dry run: nothing was written");
    }
    Ok(())
}

fn publish(args: PublishArgs) -> Result<()> {
    let repository = repository(&args.image)?;
    let bundle = Bundle::open(&args.bundle, None)
        .with_context(|| format!("reading the bundle {}", args.bundle.display()))?;
    let version = bundle.manifest().version.clone();
    let digest = bundle.manifest_digest().to_owned();
    let tagged = version_tag(&repository, &version)?;
    if args.allow_unsigned {
        if !args.unofficial {
            bail!("an unsigned bundle is not an official release: add --unofficial");
        }
    } else {
        slate_trust::check_signature_present(&bundle).with_context(|| {
            format!(
                "{}: sign it with `slate sign`, or publish it with --allow-unsigned --unofficial",
                bundle.dir().display()
            )
        })?;
    }
    let release = Release {
        version: version.clone(),
        digest: digest.clone(),
        created: created()?,
        channel: args.channel,
        official: !args.unofficial,
        min_from: args.min_from.clone(),
        yanked: None,
    };
    let options = args.registry.options()?;

    // Refusals (a demotion, a yanked version, another bundle under this version, a channel tag
    // that would name a bundle the registry lacks) before the first byte is pushed.
    let (current, _) = preflight(
        &repository,
        &options,
        &mut |index: &mut ReleaseIndex| index.publish(release.clone()),
        Some(&version),
        Some(&digest),
    )?;
    if let Some(existing) = current.get(&version) {
        if (&existing.min_from, existing.official) != (&release.min_from, release.official) {
            eprintln!(
                "note: {version} keeps the min_from ({}) and official ({}) it was first \
                 published with",
                existing.min_from.as_deref().unwrap_or("none"),
                existing.official
            );
        }
    }
    let version_digest = resolve_tag(&repository, &version, &options)
        .with_context(|| format!("reading {tagged}"))?;
    if let Some(other) = version_digest.filter(|d| *d != digest) {
        bail!(
            "{tagged} already names {other}, not this bundle ({digest}): a version's bundle never \
             changes (publish a new version)"
        );
    }

    if args.dry_run {
        let plan = slate_transport::plan_push(&args.bundle, &tagged)
            .with_context(|| format!("reading {}", args.bundle.display()))?;
        for image in &plan.images {
            println!(
                "would push {} ({}) as {}",
                image.source_tag.as_deref().unwrap_or("(untagged)"),
                image.manifest_digest,
                repository.with_tag(&image.destination)?
            );
        }
    } else {
        let mut bars = TransferBars::default();
        let pushed =
            slate_transport::push_with(&args.bundle, &tagged, &options, &mut |e| bars.event(e))
                .with_context(|| format!("pushing {} to {tagged}", args.bundle.display()))?;
        drop(bars);
        for reference in &pushed.references {
            println!("pushed {reference}");
        }
    }
    let channel = args.channel;
    apply(
        &repository,
        &options,
        args.dry_run,
        (Some(&version), Some(&digest)),
        |index| index.publish(release.clone()),
        |outcome, dry| {
            let verb = if dry { "would publish" } else { "published" };
            format!("{verb} {}", published_text(&version, outcome, channel))
        },
    )
}

fn promote(args: PromoteArgs) -> Result<()> {
    let repository = repository(&args.image)?;
    let options = args.registry.options()?;
    let (version, channel) = (args.version.as_str(), args.channel);
    apply(
        &repository,
        &options,
        args.dry_run,
        (Some(version), None),
        |index| {
            let existing = index
                .get(version)
                .cloned()
                .ok_or_else(|| ReleaseError::NotFound(version.to_owned()))?;
            index.publish(Release {
                channel,
                ..existing
            })
        },
        |outcome, dry| {
            let verb = if dry { "would promote " } else { "" };
            format!("{verb}{}", published_text(version, outcome, channel))
        },
    )
}

fn yank(args: YankArgs) -> Result<()> {
    let repository = repository(&args.image)?;
    let options = args.registry.options()?;
    let (version, reason) = (args.version.as_str(), args.reason.as_str());
    apply(
        &repository,
        &options,
        args.dry_run,
        (None, None),
        // The reason the index keeps: the first one, when it was yanked before.
        |index| {
            index
                .yank(version, reason)
                .map(|r| r.yanked.clone().unwrap_or_default())
        },
        |kept: &String, dry| {
            let verb = if dry { "would mark " } else { "" };
            if kept == reason {
                format!("{verb}{version} YANKED: {kept}")
            } else {
                format!("{verb}{version} was already yanked: {kept}")
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_that_are_slates_own_tags_are_refused() {
        let repo = Reference::parse("localhost:5000/os").unwrap();
        for bad in ["stable", "releases", "alpha", "sha256-ab.sig", "1.0+git"] {
            assert!(version_tag(&repo, bad).is_err(), "{bad}");
        }
        assert_eq!(
            version_tag(&repo, "1.0.0").unwrap().to_string(),
            "localhost:5000/os:1.0.0"
        );
    }
}
