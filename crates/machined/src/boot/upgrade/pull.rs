//! Upgrades from a registry: the update agent's downloads, and `POST /v1/upgrade` with a
//! registry reference (what the rollout operator sends). The reference must pin the bundle:
//! `REGISTRY/REPO:VERSION@sha256:<hex>`, the tag naming the version the bundle must carry and
//! the digest what is pulled, so a moved tag can never change what is installed. The bundle is
//! pulled into its directory (resuming an interrupted pull), then checked as an upload is: the
//! signature against the image's keys, the update policy.
//!
//! By delta (issue 41): the blobs the target's chunk index lists are assembled from the chunks
//! of the running UKI (read from the ESP) and of the running installer (this binary), each
//! listed by the running version's signed index kept on STATE (`kept_index`), plus the chunks
//! fetched by range; what each blob costs is logged before anything is fetched. Without a kept
//! index, or when a delta would not be smaller, a blob is downloaded whole.

pub mod derived;

use slate_bundle::Digest;
use slate_transport::{Event, Options, Reference, SeedBlob};

use crate::base::node::{Node, UpgradePlan};

/// What a pull moved: bytes fetched over the network, found in the bundle's directory (an
/// interrupted pull), and assembled from chunks the node held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub fetched: u64,
    pub cached: u64,
    pub reused: u64,
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes fetched, {} cached, {} reused from chunks this node holds",
            self.fetched, self.cached, self.reused
        )
    }
}

/// A pinned registry reference, taken apart.
#[derive(Debug, Clone)]
pub struct Pinned {
    pub reference: Reference,
    pub digest: Digest,
    pub version: String,
}

/// `REGISTRY/REPO:VERSION@sha256:<hex>`, or why not.
pub fn pinned(image: &str) -> Result<Pinned, String> {
    let reference = Reference::parse(image).map_err(|e| e.to_string())?;
    if reference.registry().is_none() {
        return Err(format!("{image:?} is not on a registry"));
    }
    let version = reference
        .tag()
        .ok_or_else(|| format!("{image:?} names no version (REGISTRY/REPO:VERSION@sha256:…)"))?
        .to_owned();
    let digest = reference
        .digest()
        .ok_or_else(|| {
            format!("{image:?} is not pinned by digest (REGISTRY/REPO:VERSION@sha256:…)")
        })
        .and_then(|d| Digest::parse(d).map_err(|e| e.to_string()))?;
    Ok(Pinned {
        reference,
        digest,
        version,
    })
}

/// Pull `pinned` and check it; the plan to hand to the Upgrade sequence, and what was moved.
pub fn pull(
    node: &Node,
    pinned: &Pinned,
    options: &Options,
) -> Result<(UpgradePlan, Moved), String> {
    let dir = super::bundle_dir(&pinned.digest);
    super::keep_only(&dir);
    let uki = running_uki(node);
    let storage = root_storage(node, uki.as_deref());
    let seeds = seeds_of(node, uki);
    let version = &pinned.version;
    let mut log = |event: Event<'_>| match event {
        Event::DeltaStart {
            digest,
            size,
            fetch_bytes,
            compressed,
            fetch_chunks,
            reuse_bytes,
            reuse_chunks,
        } => node.journal.info(format_args!(
            "pull {version}: blob {digest} ({size} bytes) by delta: {fetch_bytes} bytes in \
             {fetch_chunks} chunks to fetch{}, {reuse_bytes} bytes in {reuse_chunks} chunks \
             reused",
            if compressed { " (compressed)" } else { "" }
        )),
        Event::DeltaFallback { digest, reason } => node.journal.info(format_args!(
            "pull {version}: blob {digest} is downloaded whole: {reason}"
        )),
        // The running UKI or installer no longer holds what its signed index says: rot or
        // tampering on the ESP or STATE, which the owner should hear of even though the pull
        // goes on without those bytes.
        Event::SeedChunkRefused {
            digest,
            seed,
            offset,
            end,
        } => node.journal.info(format_args!(
            "pull {version}: blob {digest}: bytes {offset}..{end} of the held blob {seed} do \
             not match their signed digest: not reused, fetched or taken from another copy"
        )),
        _ => {}
    };
    let client = slate_transport::Client::new(options.clone());
    let pulled = match storage {
        Some(storage) => {
            let derive = derived::RootCopy {
                storage,
                journal: &node.journal,
                version,
            };
            client.pull_with_derived_seeds(&pinned.reference, &dir, seeds, &derive, &mut log)
        }
        None => client.pull_with_seeds(&pinned.reference, &dir, seeds, &mut log),
    }
    .map_err(|e| slate_sequencer::error_chain(&e))?;
    let bundle = pulled
        .open()
        .map_err(|e| slate_sequencer::error_chain(&e))?;
    let plan = super::plan_pulled(
        node,
        &dir,
        &pinned.digest,
        bundle.verified_blobs(),
        &pinned.version,
    )?;
    // Reused bytes count with the cached ones: not downloaded.
    node.journal.counters.pulled(
        pulled.fetched_bytes,
        pulled.cached_bytes.saturating_add(pulled.reused_bytes),
    );
    Ok((
        plan,
        Moved {
            fetched: pulled.fetched_bytes,
            cached: pulled.cached_bytes,
            reused: pulled.reused_bytes,
        },
    ))
}

/// The running UKI, systemd-boot and installer as seeds of a delta: listed by the running version's signed
/// index kept on STATE when there is one (a chunk whose bytes no longer match it is not used);
/// otherwise chunked here, and then a chunk is used only where the target's signed index lists
/// its digest — which is every chunk's last check anyway (`slate_delta::plan`).
pub fn delta_seeds(node: &Node) -> Vec<SeedBlob> {
    seeds_of(node, running_uki(node))
}

/// The booted UKI's bytes, from the ESP; `None` (journaled) when they cannot be read.
fn running_uki(node: &Node) -> Option<Vec<u8>> {
    let uki = crate::settle::transaction::booted_entry(node)
        .ok_or_else(|| "the booted entry is not known".to_owned())
        .and_then(|booted| {
            let loader = crate::settle::transaction::read_only_loader()?;
            loader
                .read_uki(&booted, slate_bundle_diff::MAX_UKI_BYTES)
                .map_err(|e| slate_sequencer::error_chain(&e))
        });
    match uki {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            node.journal
                .info(format_args!("the running UKI is no delta seed: {e}"));
            None
        }
    }
}

/// How the running UKI's root image stores its files' data, to derive the new root's copy of
/// the slate binary (`derived.rs`); `None` (journaled) when it cannot be read.
fn root_storage(node: &Node, uki: Option<&[u8]>) -> Option<slate_rootfs::Storage> {
    match slate_bundle_diff::root_storage(uki?) {
        Ok(storage) => Some(storage),
        Err(e) => {
            node.journal.info(format_args!(
                "no seed will be derived from a new slate binary: the running root image: {}",
                slate_sequencer::error_chain(&e)
            ));
            None
        }
    }
}

/// [`delta_seeds`] from the running UKI's bytes `uki`.
fn seeds_of(node: &Node, uki: Option<Vec<u8>>) -> Vec<SeedBlob> {
    // The running installer is this binary: the imager puts the same slate binary in the
    // root and in the bundle. If it is not, its chunks just do not match.
    let held = super::kept_index::Running {
        uki,
        loader: running_loader(),
        installer: std::fs::File::open("/proc/self/exe").ok(),
    };
    let found = super::trusted_keys().and_then(|keys| {
        super::kept_index::running_index(&crate::base::paths::state_dir(), &node.version, &keys)
    });
    let why = match found {
        Ok(Some((running, index))) => return super::kept_index::seeds(&running, &index, held),
        Ok(None) => format!("no chunk index is kept for the running {}", node.version),
        Err(e) => e,
    };
    node.journal.info(format_args!(
        "{why}: the running UKI and installer are chunked here, and a chunk of theirs is used \
         only where the target's signed index lists its digest"
    ));
    super::kept_index::unlisted_seeds(held)
}

/// systemd-boot as the ESP holds it (none on a GRUB disk): a seed, so an unchanged loader costs
/// no download. Only a hint: its chunks are checked like any seed's.
fn running_loader() -> Option<Vec<u8>> {
    let meta = crate::base::system_disk::meta_partition().ok()?;
    let disk = slate_disk::FileDisk::open_read_only(&meta.disk).ok()?;
    slate_esp::session::read_file(&disk, slate_esp::SYSTEMD_BOOT_PATH)
        .ok()
        .flatten()
}

/// What the node holds to reuse, as one chunk index (`GET /v1/image`'s `held_chunks`, for
/// `slate upgrade --check` to say what an upgrade would fetch): the chunks of [`delta_seeds`].
/// Digests only: the estimate it makes is checked by nothing and trusted for nothing.
pub fn held_index(node: &Node) -> Option<slate_delta::ChunkIndex> {
    let blobs: Vec<_> = delta_seeds(node).into_iter().map(|s| s.chunks).collect();
    (!blobs.is_empty()).then_some(slate_delta::ChunkIndex {
        params: slate_delta::DEFAULT_PARAMS,
        blobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_registry_reference_pinned_by_version_and_digest_is_taken() {
        let hex = "ab".repeat(32);
        let ok = pinned(&format!("10.0.2.2:5000/slate/os:2.0.0@sha256:{hex}")).unwrap();
        assert_eq!(ok.version, "2.0.0");
        assert_eq!(ok.digest.to_string(), format!("sha256:{hex}"));
        for bad in [
            format!("10.0.2.2:5000/slate/os@sha256:{hex}"),
            "10.0.2.2:5000/slate/os:2.0.0".to_owned(),
            format!("oci-layout:/tmp/x:2.0.0@sha256:{hex}"),
            "not a reference".to_owned(),
        ] {
            assert!(pinned(&bad).is_err(), "{bad}");
        }
    }
}
