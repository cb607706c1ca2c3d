//! Upgrades from a registry: the update agent's downloads, and `POST /v1/upgrade` with a
//! registry reference (what the rollout operator sends). The reference must pin the bundle:
//! `REGISTRY/REPO:VERSION@sha256:<hex>`, the tag naming the version the bundle must carry and
//! the digest what is pulled, so a moved tag can never change what is installed. The bundle is
//! pulled into its directory (resuming an interrupted pull), then checked as an upload is: the
//! signature against the image's keys, the update policy.

use slate_bundle::Digest;
use slate_transport::{Options, Reference};

use crate::base::node::{Node, UpgradePlan};

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

/// Pull `pinned` and check it; the plan to hand to the Upgrade sequence, and how many bytes
/// were fetched and found cached.
pub fn pull(
    node: &Node,
    pinned: &Pinned,
    options: &Options,
) -> Result<(UpgradePlan, u64, u64), String> {
    let dir = super::bundle_dir(&pinned.digest);
    super::keep_only(&dir);
    let pulled = slate_transport::pull_with(&pinned.reference, &dir, options, &mut |_| {})
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
    node.journal
        .counters
        .pulled(pulled.fetched_bytes, pulled.cached_bytes);
    Ok((plan, pulled.fetched_bytes, pulled.cached_bytes))
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
