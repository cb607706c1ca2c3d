//! The pull cache as a whole: the lock every writer of a layout holds, and garbage collection.
//!
//! - **The lock** is an exclusive `flock` on `<cache>/.lock`, held by a pull (and a push into a
//!   layout) from before the layout is created until its index is written, so two pulls into
//!   one cache — threads or processes — take turns: never two writers of one partial, never a
//!   lost tag. Reading (`open_cached`, `Bundle::open`) takes no lock: every file is replaced by
//!   rename, so a reader sees the old or the new version.
//! - **Garbage collection** ([`gc`]) keeps the images of the last `keep` pulls — the index lists
//!   them in pull order, a name pulled again moving to the end — with their signatures, and
//!   removes every other index entry, every blob none of the kept manifests names, and what is
//!   left in `incoming/` (an interrupted pull starts over). The index is rewritten first, so a
//!   crash halfway leaves unnamed blobs, never a name without its blobs.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use slate_bundle::{signature_tag_of, Digest};

use crate::layout::{check_writable, parse_digest, tag_of, INCOMING, LOCK_FILE};
use crate::source::LayoutSource;
use crate::{PlannedBlob, TransportError};

/// How many pulled images [`gc`] keeps unless told otherwise.
pub const DEFAULT_KEEP: usize = 3;

/// An exclusive lock on a layout, released when dropped.
#[derive(Debug)]
pub(crate) struct CacheLock {
    _lock: Flock<File>,
}

/// Wait for the exclusive lock on the layout at `dir`, creating the directory (a directory that
/// is neither a layout nor empty is refused first, so a mistyped path gets no lock file).
pub(crate) fn lock(dir: &Path) -> Result<CacheLock, TransportError> {
    check_writable(dir)?;
    fs::create_dir_all(dir).map_err(TransportError::io(dir))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(&path)
        .map_err(TransportError::io(&path))?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(lock) => return Ok(CacheLock { _lock: lock }),
            // A signal interrupted the wait: wait again.
            Err((f, Errno::EINTR)) => file = f,
            Err((_, errno)) => return Err(TransportError::io(&path)(errno.into())),
        }
    }
}

/// What [`gc`] removed, or would remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The names (tags, or digests of untagged entries) kept, oldest first.
    pub kept: Vec<String>,
    /// The names removed from the index.
    pub removed_images: Vec<String>,
    /// The blobs removed: manifests, configs, layers.
    pub removed_blobs: Vec<PlannedBlob>,
    /// Partial transfers and temporaries removed from `incoming/`: name and size.
    pub removed_partials: Vec<(String, u64)>,
    /// Nothing was removed: this is what a collection would do.
    pub dry_run: bool,
}

impl GcReport {
    /// Bytes freed (or that would be).
    pub fn freed_bytes(&self) -> u64 {
        self.removed_blobs
            .iter()
            .map(|b| b.size)
            .chain(self.removed_partials.iter().map(|(_, size)| *size))
            .fold(0, u64::saturating_add)
    }
}

fn name_of(d: &oci_spec::image::Descriptor) -> String {
    tag_of(d).map_or_else(|| d.digest().to_string(), str::to_owned)
}

/// Files directly in `dir` with their sizes (links and other non-files too: they are not
/// blobs); an absent directory has none.
fn files_in(dir: &Path) -> Result<Vec<(String, u64)>, TransportError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TransportError::io(dir)(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(TransportError::io(dir))?;
        let meta = entry.metadata().map_err(TransportError::io(entry.path()))?;
        if meta.is_dir() {
            continue;
        }
        if let Some(name) = entry.file_name().to_str() {
            files.push((name.to_owned(), meta.len()));
        }
    }
    files.sort();
    Ok(files)
}

/// Keep the images of the last `keep` pulls into the cache at `cache_dir` (and their
/// signatures); remove the other index entries, the blobs only they named, and `incoming/`.
/// With `dry_run` nothing is changed (and no lock is taken): the report says what would go.
/// A kept manifest that cannot be read stops the collection before anything is removed.
pub fn gc(cache_dir: &Path, keep: usize, dry_run: bool) -> Result<GcReport, TransportError> {
    let mut report = GcReport {
        dry_run,
        ..GcReport::default()
    };
    if !cache_dir.exists() {
        return Ok(report);
    }
    let _lock = if dry_run {
        None
    } else {
        Some(lock(cache_dir)?)
    };
    let source = LayoutSource::open(cache_dir)?;
    let entries = source.index.manifests();

    // The images, newest last; keep the last `keep` distinct manifests.
    let mut kept_images: Vec<String> = Vec::new();
    for d in entries.iter().rev() {
        let digest = d.digest().to_string();
        if kept_images.len() < keep
            && !tag_of(d).is_some_and(slate_bundle::is_attached_tag)
            && !kept_images.contains(&digest)
        {
            kept_images.push(digest);
        }
    }
    let mut signatures: BTreeSet<String> = BTreeSet::new();
    for digest in &kept_images {
        let digest = parse_digest(digest)?;
        signatures.insert(signature_tag_of(&digest));
        signatures.insert(slate_bundle::zchunks_tag_of(&digest));
    }
    let is_kept = |d: &oci_spec::image::Descriptor| match tag_of(d) {
        Some(tag) if slate_bundle::is_attached_tag(tag) => signatures.contains(tag),
        _ => kept_images.contains(&d.digest().to_string()),
    };

    // Every blob a kept manifest names, the manifests themselves included.
    let mut referenced: BTreeSet<Digest> = BTreeSet::new();
    let mut kept_entries = Vec::new();
    for d in entries {
        if !is_kept(d) {
            report.removed_images.push(name_of(d));
            continue;
        }
        let manifest = source.manifest_of(d)?;
        let what = format!("the kept manifest {} ({})", name_of(d), manifest.digest);
        let parsed = crate::source::parse_manifest(&what, &manifest)?;
        referenced.insert(parse_digest(&manifest.digest)?);
        for blob in std::iter::once(parsed.config()).chain(parsed.layers()) {
            referenced.insert(parse_digest(blob.digest().as_ref())?);
        }
        report.kept.push(name_of(d));
        kept_entries.push(d.clone());
    }

    let blobs_dir = cache_dir.join("blobs/sha256");
    for (name, size) in files_in(&blobs_dir)? {
        let Ok(digest) = Digest::parse(&format!("sha256:{name}")) else {
            continue; // not a blob slate wrote: not slate's to remove
        };
        if !referenced.contains(&digest) {
            report.removed_blobs.push(PlannedBlob {
                digest: digest.to_string(),
                size,
            });
        }
    }
    let incoming = cache_dir.join(INCOMING);
    report.removed_partials = files_in(&incoming)?;
    if dry_run {
        return Ok(report);
    }

    if !report.removed_images.is_empty() {
        let mut index = source.index.clone();
        index.set_manifests(kept_entries);
        source.layout.write_index(&index)?;
    }
    for blob in &report.removed_blobs {
        let path = source.layout.blob_path(&blob.digest)?;
        remove(&path)?;
    }
    for (name, _) in &report.removed_partials {
        remove(&incoming.join(name))?;
    }
    // An interrupted delta's chunks (issue 41) go with the partials.
    let chunks = incoming.join(crate::layout::CHUNKS_DIR);
    if chunks.is_dir() {
        fs::remove_dir_all(&chunks).map_err(TransportError::io(&chunks))?;
    }
    if !report.removed_blobs.is_empty() {
        File::open(&blobs_dir)
            .and_then(|d| d.sync_all())
            .map_err(TransportError::io(&blobs_dir))?;
    }
    Ok(report)
}

fn remove(path: &Path) -> Result<(), TransportError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TransportError::io(path)(e)),
    }
}
