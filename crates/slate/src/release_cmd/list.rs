//! `slate release list`: each channel's upgrade graph, where its tag stands against the index,
//! and which releases the registry no longer holds the manifest of.

use std::io::Write as _;

use anyhow::{Context as _, Result};
use slate_release::{Channel, Release, ReleaseIndex};
use slate_transport::releases::{fetch_stored_index, plan_channel_tags};

use super::{name_of, ListArgs};
use crate::args::OutputFormat;

pub(super) fn list(args: ListArgs) -> Result<()> {
    let repository = super::repository(&args.image)?;
    let options = args.registry.options()?;
    let stored = fetch_stored_index(&repository, &options)
        .with_context(|| format!("reading the release index of {repository}"))?;
    let (index, index_digest) = match stored {
        Some(s) => (s.index, Some(s.digest)),
        None => (ReleaseIndex::default(), None),
    };
    let moves = plan_channel_tags(&repository, &index, &options)
        .with_context(|| format!("reading the channel tags of {repository}"))?;
    let missing = super::missing_manifests(&repository, &index.releases, &options)?;
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
                "missing_manifests": missing,
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
            if !missing.is_empty() {
                println!(
                    "MISSING: the registry holds no manifest for {} (nodes cannot pull it; push \
                     the bundle again or yank the version)",
                    missing.join(", ")
                );
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
                for line in graph(&shown, channel, &missing) {
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

/// The upgrade graph of one channel, oldest first: each release that is not yanked reached from
/// the one before it, its barrier explained; yanked ones marked; details indented below.
/// A release in `missing` (by version) is flagged: the registry lacks its manifest.
fn graph(releases: &[&Release], channel: Channel, missing: &[String]) -> Vec<String> {
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
            "      {}  created {}  {}{}",
            r.digest,
            r.created,
            if r.official { "official" } else { "unofficial" },
            if missing.contains(&r.version) {
                "  MANIFEST MISSING from the registry"
            } else {
                ""
            }
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
        let lines = graph(&refs, Channel::Stable, &[]);
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
            graph(&refs, Channel::Beta, &[])[2],
            "  1.0.0 → 2.0.0 (min-from 0.9: older versions must stop at 1.0.0 (≥ 0.9) first)"
        );
    }
}
