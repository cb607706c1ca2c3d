//! The update transport: installer bundles (OCI image layouts, `slate-bundle`) pulled from and
//! pushed to OCI registries and local layouts.
//!
//! - [`Reference::parse`]: `host[:port]/repo/path:tag`, `host/repo@sha256:<hex>`,
//!   `oci-layout:PATH[:TAG]`.
//! - [`pull`]: a reference into a local layout cache. Blobs are shared across pulls by digest and
//!   never fetched twice; every byte is hashed on its way to `incoming/<hex>.partial` and renamed
//!   into `blobs/sha256/` only when the digest matches; an interrupted pull resumes with an HTTP
//!   `Range` request. The cosign signature tag of the image (`sha256-<hex>.sig`) comes along when
//!   the source has one. The result opens with `slate_bundle::Bundle::open(dir, Some(tag))`, or
//!   with [`open_cached`] ([`Pulled::open`]) without hashing the blobs a second time.
//!   Pulls into one cache take turns (an exclusive `flock` on `<cache>/.lock`); a manifest
//!   declaring more than [`Client::max_image_bytes`] is refused before any blob is fetched.
//! - [`Client::resolve`] ([`resolve_with`]): the dry run of a pull — the manifest digest and the
//!   declared sizes, nothing written.
//! - [`gc`]: keep the last pulls of a cache, remove the rest.
//! - [`push`]: every tag of a layout to a registry (blobs the registry has are skipped) or into
//!   another layout.
//! - [`releases`]: a repository's release index (tag `releases`), read, written and changed
//!   with a re-read check in place of the compare-and-swap registries lack; channel tags moved
//!   by copying a manifest's exact bytes.
//!
//! The reference parser alone (for fuzzing) builds without the `client` feature, which brings
//! the HTTP stack.
//!
//! Blocking, on `ureq` (rustls with ring, webpki roots, and [`Client::ca`] for a private CA);
//! plain HTTP for loopback registries or with [`Options::insecure`]. Credentials go only to
//! their registry's host (and hosts named in [`Client::credential_hosts`]), never in clear to
//! another machine. Layouts are read through regular files only (no FIFO, device or link).
//! ARCHITECTURE.md says why this is not `oci-client`.

#[cfg(feature = "client")]
mod cache;
pub mod challenge;
#[cfg(feature = "client")]
pub mod chunks;
#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod delta;
mod error;
#[cfg(feature = "client")]
mod files;
#[cfg(feature = "client")]
mod layout;
#[cfg(feature = "client")]
mod pull;
#[cfg(feature = "client")]
mod push;
mod reference;
#[cfg(feature = "client")]
mod registry;
#[cfg(feature = "client")]
pub mod releases;
#[cfg(feature = "client")]
mod source;
#[cfg(feature = "client")]
mod tls;

use std::path::{Path, PathBuf};

#[cfg(feature = "client")]
pub use cache::{gc, GcReport, DEFAULT_KEEP};
#[cfg(feature = "client")]
pub use client::{Client, Resolved, DEFAULT_MAX_IMAGE_BYTES};
#[cfg(feature = "client")]
pub use delta::{cache_seeds, DeriveSeeds, MemSeed, SeedBlob};
pub use error::TransportError;
#[cfg(feature = "client")]
pub use pull::signature_tag;
#[cfg(feature = "client")]
pub use push::{plan_push, PlannedBlob, PlannedImage, PushPlan};
pub use reference::{Location, Reference, ReferenceError, LAYOUT_PREFIX};
#[cfg(feature = "client")]
pub use releases::{
    fetch_release_index, store_release_index, tag_manifest, update_release_index, RELEASE_INDEX_TAG,
};
#[cfg(feature = "client")]
pub use tls::CaCertificates;

/// No file is larger (`off_t` is signed): a descriptor declaring more names no blob, and is
/// refused before anything is fetched or summed.
pub const MAX_FILE_BYTES: u64 = i64::MAX as u64;

/// What a transfer is doing, for progress displays. Events come in order: for each blob
/// `BlobPresent`, or `BlobStart`, `Bytes`…, `BlobDone` (a resumed blob that fails its digest
/// starts once more from 0); `Manifest` once a manifest is known (pull) or stored (push).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A manifest was read (pull) or stored (push) under `name`.
    Manifest { name: &'a str, digest: &'a str },
    /// A blob transfer starts: `size` bytes, the first `from` of them already here (a resumed
    /// pull).
    BlobStart {
        digest: &'a str,
        size: u64,
        from: u64,
    },
    /// `n` more bytes of the current blob went over the wire.
    Bytes(u64),
    /// The current blob is in place and verified.
    BlobDone { digest: &'a str },
    /// The blob was already there (in the cache, or on the registry) and was not transferred.
    BlobPresent { digest: &'a str, size: u64 },
    /// A blob the target's chunk index lists will be assembled from chunks (issue 41): what it
    /// costs, before anything is fetched. If the delta is worth it, `Bytes` of the fetched
    /// chunks and `BlobDone` follow; else `DeltaFallback` and a whole download.
    DeltaStart {
        digest: &'a str,
        size: u64,
        /// On the wire: compressed frames where they are smaller (`compressed`), else raw.
        fetch_bytes: u64,
        /// The chunks travel as the bundle's compressed chunk table says (formats.md §7.8).
        compressed: bool,
        fetch_chunks: usize,
        reuse_bytes: u64,
        reuse_chunks: usize,
    },
    /// The blob is downloaded whole after all, and why (the delta would not be smaller, or it
    /// failed: a chunk refused by its digest, a registry that does not answer ranges).
    DeltaFallback { digest: &'a str, reason: &'a str },
    /// While planning the blob `digest`: the bytes `offset..end` of the held blob `seed` (the
    /// running UKI on the ESP, say) do not hash to the digest its own signed index lists for
    /// them, so they are not used (another seed's copy, or a fetch, stands in). Comes before
    /// the blob's `DeltaStart`, whose counts already leave them out.
    SeedChunkRefused {
        digest: &'a str,
        seed: &'a str,
        offset: u64,
        end: u64,
    },
}

/// Registry credentials (basic, or exchanged for a bearer token). `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"…")
            .finish()
    }
}

/// How to talk to registries.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Plain HTTP to any registry (loopback registries get plain HTTP anyway).
    pub insecure: bool,
    pub credentials: Option<Credentials>,
    /// Push: blobs larger than this go up in PATCH chunks of this size (default 32 MiB).
    pub chunk_size: Option<u64>,
}

/// What a pull left in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The cache: an OCI image layout; `Bundle::open(&layout_dir, Some(&tag))` opens the image.
    pub layout_dir: PathBuf,
    /// The image's tag in the layout: the reference's tag, or its digest when it had no tag.
    pub tag: String,
    /// `sha256:<hex>` of the image manifest.
    pub manifest_digest: String,
    /// The cosign signature tag (`sha256-<hex>.sig`), when the source had one; it is in the
    /// layout too.
    pub signature_tag: Option<String>,
    /// Blob bytes (configs and layers, image and signature) transferred by this pull.
    pub fetched_bytes: u64,
    /// Blob bytes that were already in the cache, including a resumed transfer's prefix.
    pub cached_bytes: u64,
    /// Bytes of blobs assembled from chunks this machine held (seeds, an interrupted
    /// assembly's chunks) rather than fetched (issue 41).
    pub reused_bytes: u64,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The references written, one per image (`host/repo:tag`, or `@digest` when untagged).
    pub references: Vec<String>,
    /// Blob bytes sent.
    pub uploaded_bytes: u64,
    /// Blob bytes the destination already had.
    pub skipped_bytes: u64,
}

impl Pulled {
    /// Open the pulled image; see [`open_cached`].
    pub fn open(&self) -> Result<slate_bundle::Bundle, slate_bundle::BundleError> {
        open_cached(&self.layout_dir, &self.tag)
    }
}

/// Open the image tagged `tag` in the pull cache at `cache_dir` without hashing anything again.
/// A blob (manifests included) enters the cache only by being hashed as it is written and
/// renamed into `blobs/sha256` once its digest matched, so every file there is a verified blob
/// and reading it to check would be a second pass over the same bytes. The files are still
/// checked for size when read, and the documents parsed and cross-checked as usual.
pub fn open_cached(
    cache_dir: &Path,
    tag: &str,
) -> Result<slate_bundle::Bundle, slate_bundle::BundleError> {
    let blobs = cache_dir.join("blobs/sha256");
    let io = |source| slate_bundle::BundleError::Io {
        path: blobs.clone(),
        source,
    };
    let mut verified = slate_bundle::VerifiedBlobs::new();
    // `DirEntry::metadata` does not follow links: only regular files count as verified.
    for entry in std::fs::read_dir(&blobs).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(digest) = name
            .to_str()
            .and_then(|hex| slate_bundle::Digest::parse(&format!("sha256:{hex}")).ok())
        else {
            continue;
        };
        let meta = entry.metadata().map_err(io)?;
        if meta.is_file() {
            verified.insert(digest, meta.len());
        }
    }
    slate_bundle::Bundle::open_with(cache_dir, Some(tag), verified)
}

#[cfg(feature = "client")]
/// Pull `reference` into the layout cache at `cache_dir` (created when missing) with default
/// [`Options`].
pub fn pull(
    reference: &Reference,
    cache_dir: &Path,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pulled, TransportError> {
    Client::default().pull(reference, cache_dir, progress)
}

#[cfg(feature = "client")]
/// [`pull`] with explicit [`Options`] (and the defaults of the rest of a [`Client`]).
pub fn pull_with(
    reference: &Reference,
    cache_dir: &Path,
    options: &Options,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pulled, TransportError> {
    Client::new(options.clone()).pull(reference, cache_dir, progress)
}

#[cfg(feature = "client")]
/// The dry run of [`pull_with`]: what `reference` resolves to, nothing written
/// ([`Client::resolve`]).
pub fn resolve_with(reference: &Reference, options: &Options) -> Result<Resolved, TransportError> {
    Client::new(options.clone()).resolve(reference)
}

#[cfg(feature = "client")]
/// Push every tag of the layout at `layout_dir` to `reference` (a repository, or a layout) with
/// default [`Options`]. A tag in the reference must be one of the layout's, or renames the
/// layout's only image; see [`plan_push`].
pub fn push(
    layout_dir: &Path,
    reference: &Reference,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pushed, TransportError> {
    Client::default().push(layout_dir, reference, progress)
}

#[cfg(feature = "client")]
/// [`push`] with explicit [`Options`].
pub fn push_with(
    layout_dir: &Path,
    reference: &Reference,
    options: &Options,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pushed, TransportError> {
    Client::new(options.clone()).push(layout_dir, reference, progress)
}
