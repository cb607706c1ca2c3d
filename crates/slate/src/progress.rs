//! Progress bars for registry transfers, shared by `slate push|pull` and `slate upgrade`.

use std::path::Path;

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressStyle};
use slate_transport::{Event, Pulled, Reference};

use crate::args::RegistryArgs;

/// One bar per blob on stderr (hidden when stderr is not a terminal).
#[derive(Debug, Default)]
pub struct TransferBars {
    bar: Option<ProgressBar>,
}

impl TransferBars {
    pub fn event(&mut self, event: Event<'_>) {
        match event {
            Event::BlobStart { digest, size, from } => {
                let bar = ProgressBar::new(size);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.set_message(short(digest));
                bar.set_position(from);
                self.bar = Some(bar);
            }
            Event::Bytes(n) => {
                if let Some(bar) = &self.bar {
                    bar.inc(n);
                }
            }
            Event::BlobDone { .. } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
            }
            // A blob assembled from chunks: the bar counts the bytes fetched, the message the
            // bytes reused from what this machine holds.
            Event::DeltaStart {
                digest,
                size,
                fetch_bytes,
                fetch_chunks,
                reuse_bytes,
                compressed,
                ..
            } => {
                let bar = ProgressBar::new(fetch_bytes);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} fetched {bytes_per_sec} {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.set_message(format!(
                    "{} delta: {fetch_chunks} chunks to fetch{}, {} of {} reused",
                    short(digest),
                    if compressed { " compressed" } else { "" },
                    indicatif::HumanBytes(reuse_bytes),
                    indicatif::HumanBytes(size)
                ));
                self.bar = Some(bar);
            }
            Event::DeltaFallback { digest, reason } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                    eprintln!("{}: downloading it whole ({reason})", short(digest));
                }
            }
            // Rot in a blob this machine holds is news whether or not a terminal watches.
            Event::SeedChunkRefused {
                seed, offset, end, ..
            } => eprintln!(
                "{}: bytes {offset}..{end} do not match their signed digest: not reused",
                short(seed)
            ),
            Event::BlobPresent { .. } | Event::Manifest { .. } => {}
        }
    }
}

/// A bar left by a failed transfer stays on screen where it stopped.
impl Drop for TransferBars {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}

/// `sha256:0123456789ab`.
fn short(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

/// Pull `reference` into the layout cache `cache` with progress bars.
pub fn pull_to_cache(
    reference: &Reference,
    cache: &Path,
    registry: &RegistryArgs,
) -> Result<Pulled> {
    let options = registry.options()?;
    let mut bars = TransferBars::default();
    let pulled = slate_transport::pull_with(reference, cache, &options, &mut |e| bars.event(e))
        .with_context(|| format!("pulling {reference} into {}", cache.display()))?;
    drop(bars);
    Ok(pulled)
}
