//! `slate release publish | promote | yank | list`: releases in a registry repository — the
//! release index under the tag `releases` (docs/formats.md §10, `slate_transport::releases`) and
//! the channel tags `alpha`, `beta`, `stable` that follow it.
//!
//! A bundle's image manifest is pushed as it is (its signature covers its digest); what a
//! release adds — version, created, channel, official, min_from, yanked — lives in the index.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand};
use slate_bundle::{is_signature_tag, Bundle};
use slate_release::{Channel, Published, Release, ReleaseError, ReleaseIndex};
use slate_transport::releases::{
    fetch_stored_index, move_channel_tags, plan_channel_tags, resolve_tag, TagMove, RESERVED_TAGS,
};
use slate_transport::{fetch_release_index, update_release_index, Options, Reference};

use crate::args::{OutputFormat, RegistryArgs};
use crate::progress::TransferBars;

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
        ReleaseCommand::List(args) => list(args),
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

/// The tag the bundle of `version` is pushed under.
fn version_tag(repository: &Reference, version: &str) -> Result<Reference> {
    if RESERVED_TAGS.contains(&version) || is_signature_tag(version) {
        bail!(
            "version {version:?} is a tag slate uses itself ({}, sha256-….sig); choose another \
             version",
            RESERVED_TAGS.join(", ")
        );
    }
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
    for m in &moves {
        println!("{}", tag_line(index, m, dry_run));
    }
    if !dry_run {
        move_channel_tags(repository, &moves, options)
            .with_context(|| format!("moving the channel tags of {repository}"))?;
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

/// Make `change` on the repository's index (re-read and retried when another publisher got in
/// between) and move the channel tags after it; with `dry_run`, on a copy, writing nothing.
/// `say` words the outcome (`true`: as what would happen).
fn apply<T>(
    repository: &Reference,
    options: &Options,
    dry_run: bool,
    mut change: impl FnMut(&mut ReleaseIndex) -> Result<T, ReleaseError>,
    say: impl Fn(&T, bool) -> String,
) -> Result<()> {
    let index = if dry_run {
        let mut planned = fetch_release_index(repository, options)
            .with_context(|| format!("reading the release index of {repository}"))?
            .unwrap_or_default();
        let outcome = change(&mut planned)?;
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
    let repository = Reference::parse(&args.image)?;
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

    // Refusals (a demotion, a yanked version, another bundle under this version) before the
    // first byte is pushed.
    let mut current = fetch_release_index(&repository, &options)
        .with_context(|| format!("reading the release index of {repository}"))?
        .unwrap_or_default();
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
    current.publish(release.clone())?;
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
                "would push {} ({}) as {repository}:{}",
                image.source_tag.as_deref().unwrap_or("(untagged)"),
                image.manifest_digest,
                image.destination
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
        |index| index.publish(release.clone()),
        |outcome, dry| {
            let verb = if dry { "would publish" } else { "published" };
            format!("{verb} {}", published_text(&version, outcome, channel))
        },
    )
}

fn promote(args: PromoteArgs) -> Result<()> {
    let repository = Reference::parse(&args.image)?;
    let options = args.registry.options()?;
    let (version, channel) = (args.version.as_str(), args.channel);
    apply(
        &repository,
        &options,
        args.dry_run,
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
    let repository = Reference::parse(&args.image)?;
    let options = args.registry.options()?;
    let (version, reason) = (args.version.as_str(), args.reason.as_str());
    apply(
        &repository,
        &options,
        args.dry_run,
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

fn list(args: ListArgs) -> Result<()> {
    let repository = Reference::parse(&args.image)?;
    let options = args.registry.options()?;
    let stored = fetch_stored_index(&repository, &options)
        .with_context(|| format!("reading the release index of {repository}"))?;
    let (index, index_digest) = match stored {
        Some(s) => (s.index, Some(s.digest)),
        None => (ReleaseIndex::default(), None),
    };
    let moves = plan_channel_tags(&repository, &index, &options)
        .with_context(|| format!("reading the channel tags of {repository}"))?;
    let channels: Vec<Channel> = match args.channel {
        Some(channel) => vec![channel],
        None => vec![Channel::Stable, Channel::Beta, Channel::Alpha], // most conservative first
    };
    // A channel's tag as it is, and the release it should name (the newest not yanked).
    let tag_of = |c: Channel| moves.iter().find(|m| m.channel == c);
    let current = |c: Channel| tag_of(c).and_then(|m| m.current.clone());
    let head_of = |c: Channel| tag_of(c).and_then(|m| m.target.as_ref());
    let place = repository
        .registry()
        .zip(repository.repository())
        .map(|(h, r)| format!("{h}/{r}"))
        .unwrap_or_else(|| repository.to_string());
    match args.output {
        OutputFormat::Json => {
            let views: serde_json::Map<String, serde_json::Value> = channels
                .iter()
                .map(|&c| {
                    let view = serde_json::json!({
                        "versions": index.visible(c).map(|r| r.version.as_str()).collect::<Vec<_>>(),
                        "newest": head_of(c).map(|r| r.version.as_str()),
                        "tag": current(c),
                    });
                    (c.as_str().to_owned(), view)
                })
                .collect();
            let value = serde_json::json!({
                "repository": place,
                "index_digest": index_digest,
                "index": index,
                "channels": views,
            });
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &value)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            match &index_digest {
                Some(digest) => println!(
                    "{place}: {} releases (index {digest})",
                    index.releases.len()
                ),
                None => println!("{place}: no release index (nothing published yet)"),
            }
            for channel in channels {
                let tag = match (current(channel), head_of(channel)) {
                    (None, _) => format!("tag {channel}: none"),
                    (Some(d), Some(head)) if d != head.digest => {
                        // Where the tag stands against the index's head for the channel: a
                        // tag moved by a promote that failed after it is ahead, not behind.
                        let tagged = index.releases.iter().find(|r| r.digest == d);
                        let place = match tagged {
                            None => "not in the index; the index's newest is",
                            Some(r)
                                if slate_release::compare(&r.version, &head.version)
                                    == std::cmp::Ordering::Greater =>
                            {
                                "ahead of the index's"
                            }
                            Some(_) => "behind the index's",
                        };
                        format!(
                            "tag {channel} → {}, {place} {}",
                            name_of(&index, &d),
                            head.version
                        )
                    }
                    (Some(d), _) => format!("tag {channel} → {}", name_of(&index, &d)),
                };
                println!("\n{channel} ({tag})");
                let shown: Vec<&Release> = index.visible(channel).collect();
                if shown.is_empty() {
                    println!("  (no releases)");
                }
                for line in graph(&shown, channel) {
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

/// The upgrade graph of one channel, oldest first: each release that is not yanked reached from
/// the one before it, its barrier explained; yanked ones marked; details indented below.
fn graph(releases: &[&Release], channel: Channel) -> Vec<String> {
    let mut lines = Vec::new();
    let mut previous: Option<&str> = None;
    for (i, r) in releases.iter().enumerate() {
        let head = if let Some(reason) = &r.yanked {
            format!("  {} YANKED: {reason}", r.version)
        } else {
            let mut line = match previous {
                Some(p) => format!("  {p} → {}", r.version),
                None => format!("  {}", r.version),
            };
            if let Some(note) = barrier(&releases[..i], r, channel) {
                line.push_str(&format!(" ({note})"));
            }
            previous = Some(&r.version);
            line
        };
        lines.push(head);
        lines.push(format!(
            "      {}  created {}  {}",
            r.digest,
            r.created,
            if r.official { "official" } else { "unofficial" }
        ));
    }
    lines
}

/// What `r`'s `min_from` means for nodes on older versions of this channel.
fn barrier(older: &[&Release], r: &Release, channel: Channel) -> Option<String> {
    let min = r.min_from.as_deref()?;
    let stops: Vec<&str> = older
        .iter()
        .filter(|v| !v.is_yanked() && slate_release::compare(&v.version, min).is_ge())
        .map(|v| v.version.as_str())
        .collect();
    Some(if stops.first() == Some(&min) {
        format!("min-from {min}: older versions must stop at {min} first")
    } else if let Some(first) = stops.first() {
        format!("min-from {min}: older versions must stop at {first} (≥ {min}) first")
    } else {
        format!(
            "min-from {min}: channel {channel} offers nothing from {min} up to it, so older \
             versions hold"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(version: &str, min_from: Option<&str>, yanked: Option<&str>) -> Release {
        Release {
            version: version.into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            created: "2026-12-01T00:00:00Z".into(),
            channel: Channel::Stable,
            official: true,
            min_from: min_from.map(str::to_owned),
            yanked: yanked.map(str::to_owned),
        }
    }

    #[test]
    fn the_graph_shows_edges_barriers_and_yanks() {
        let rs = [
            release("1.0.0", None, None),
            release("1.5.0", None, None),
            release("2.0.0", Some("1.5.0"), None),
            release("2.0.1", None, Some("eats disks")),
            release("3.0.0", Some("2.0.1"), None),
        ];
        let refs: Vec<&Release> = rs.iter().collect();
        let lines = graph(&refs, Channel::Stable);
        let heads: Vec<&str> = lines.iter().step_by(2).map(String::as_str).collect();
        assert_eq!(
            heads,
            [
                "  1.0.0",
                "  1.0.0 → 1.5.0",
                "  1.5.0 → 2.0.0 (min-from 1.5.0: older versions must stop at 1.5.0 first)",
                "  2.0.1 YANKED: eats disks",
                "  2.0.0 → 3.0.0 (min-from 2.0.1: channel stable offers nothing from 2.0.1 up \
                 to it, so older versions hold)",
            ]
        );
        assert!(lines[1].contains("created 2026-12-01T00:00:00Z  official"));
        let skip = [
            release("1.0.0", None, None),
            release("2.0.0", Some("0.9"), None),
        ];
        let refs: Vec<&Release> = skip.iter().collect();
        assert_eq!(
            graph(&refs, Channel::Beta)[2],
            "  1.0.0 → 2.0.0 (min-from 0.9: older versions must stop at 1.0.0 (≥ 0.9) first)"
        );
    }

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
