//! Pushing a layout: every tag, to a registry repository or into another layout.

use std::collections::BTreeSet;
use std::path::Path;

use oci_spec::image::ImageManifest;
use slate_bundle::is_attached_tag;

use crate::layout::{set_entry, tag_of, Layout};
use crate::pull::{copy_image, declared_bytes, Stats};
use crate::reference::Location;
use crate::registry::{Manifest, Registry, DEFAULT_CHUNK};
use crate::source::{parse_manifest, LayoutSource};
use crate::{Client, Event, Pushed, Reference, TransportError, MAX_FILE_BYTES};

/// One image of a push: which manifest, under which name at the destination.
#[derive(Debug, Clone)]
pub struct PlannedImage {
    /// Its tag in the source layout (`None`: listed untagged).
    pub source_tag: Option<String>,
    /// Its tag at the destination, or its digest when it is untagged (or its tag is not a valid
    /// registry tag).
    pub destination: String,
    pub manifest_digest: String,
    /// Whether `destination` is a tag (else it is the digest).
    pub tagged: bool,
    manifest: Manifest,
    /// Built by the push (a bundle's `.zchunks` manifest, formats.md §7.8), not listed in the
    /// source's `index.json`: its config and layer are copied as blobs.
    built: Option<ImageManifest>,
}

/// One blob a push may send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBlob {
    pub digest: String,
    pub size: u64,
}

/// What a push would do, read (and every manifest verified) from the layout alone.
#[derive(Debug, Clone)]
pub struct PushPlan {
    /// Images first, their signatures after them.
    pub images: Vec<PlannedImage>,
    /// Every config and layer, each once.
    pub blobs: Vec<PlannedBlob>,
}

impl PushPlan {
    /// Blob bytes a push sends when the destination has none of them (each blob is at most
    /// [`MAX_FILE_BYTES`], the sum saturates).
    pub fn total_bytes(&self) -> u64 {
        self.blobs
            .iter()
            .map(|b| b.size)
            .fold(0, u64::saturating_add)
    }
}

/// Plan pushing the layout at `layout_dir` to `reference`: every image under its own tag. A tag
/// in `reference` must be one of the layout's, or the new name of its only (non-signature)
/// image; a digest is refused (a push names things, it does not pin them).
pub fn plan_push(layout_dir: &Path, reference: &Reference) -> Result<PushPlan, TransportError> {
    if reference.digest().is_some() {
        return Err(TransportError::Usage(format!(
            "{reference}: push to a repository or repository:tag, not to a digest"
        )));
    }
    let source = LayoutSource::open(layout_dir)?;
    let entries = source.index.manifests();
    if entries.is_empty() {
        return Err(TransportError::Usage(format!(
            "{} holds no image",
            layout_dir.display()
        )));
    }
    // Signatures and compressed chunks go after the images they belong to.
    let is_signature = |d: &&oci_spec::image::Descriptor| tag_of(d).is_some_and(is_attached_tag);
    let rename = match reference.tag() {
        Some(tag) if !entries.iter().any(|d| tag_of(d) == Some(tag)) => {
            let images: Vec<_> = entries.iter().filter(|d| !is_signature(d)).collect();
            match images.as_slice() {
                [only] => Some((only.digest().to_string(), tag.to_owned())),
                _ => {
                    return Err(TransportError::NotFound {
                        what: format!("the tag {tag:?}"),
                        location: format!(
                            "{} has {}; push without a tag, or name one of them",
                            layout_dir.display(),
                            source.tags().join(", ")
                        ),
                    })
                }
            }
        }
        _ => None,
    };
    let registry = matches!(reference.location(), Location::Registry { .. });
    let ordered = entries
        .iter()
        .filter(|d| !is_signature(d))
        .chain(entries.iter().filter(is_signature));
    let mut images = Vec::new();
    let mut blobs = Vec::new();
    let mut seen = BTreeSet::new();
    for d in ordered {
        let manifest = source.manifest_of(d)?;
        let what = format!(
            "the manifest {} in {}",
            manifest.digest,
            layout_dir.display()
        );
        let parsed = parse_manifest(&what, &manifest)?;
        declared_bytes(&what, &parsed, MAX_FILE_BYTES)?;
        plan_blobs(&parsed, &mut seen, &mut blobs);
        let source_tag = tag_of(d).map(str::to_owned);
        let renamed = rename
            .as_ref()
            .filter(|(digest, _)| *digest == manifest.digest && !is_signature(&d))
            .map(|(_, tag)| tag.clone());
        let (destination, tagged) = match renamed.or_else(|| source_tag.clone()) {
            Some(tag) if !registry || crate::reference::check_tag(&tag).is_ok() => (tag, true),
            _ => (manifest.digest.clone(), false),
        };
        let zchunks = if is_signature(&d) {
            None
        } else {
            zchunks_image(&source, &parsed, &manifest.digest, entries)?
        };
        images.push(PlannedImage {
            source_tag,
            destination,
            manifest_digest: manifest.digest.clone(),
            tagged,
            manifest,
            built: None,
        });
        if let Some((image, parsed)) = zchunks {
            plan_blobs(&parsed, &mut seen, &mut blobs);
            images.push(image);
        }
    }
    Ok(PushPlan { images, blobs })
}

/// The `.zchunks` manifest of the image `parsed` (formats.md §7.8) when its signed table names
/// a compressed blob the source holds and the source does not tag one already (a layout that
/// was pushed into lists it as an image of its own). Rebuilt from the table: the imager's
/// directory has the manifest as a file but no entry for it.
fn zchunks_image(
    source: &LayoutSource,
    parsed: &ImageManifest,
    manifest_digest: &str,
    entries: &[oci_spec::image::Descriptor],
) -> Result<Option<(PlannedImage, ImageManifest)>, TransportError> {
    let Some(table) =
        crate::delta::table_layer(parsed).and_then(|l| crate::delta::read_table(&source.layout, l))
    else {
        return Ok(None);
    };
    let tag = slate_bundle::zchunks_tag_of(&crate::layout::parse_digest(manifest_digest)?);
    let blob = slate_bundle::Digest::from_raw(table.blob);
    if entries.iter().any(|d| tag_of(d) == Some(tag.as_str()))
        || !source.layout.has_blob(blob.as_str(), table.blob_size)?
    {
        return Ok(None);
    }
    let bytes = slate_bundle::zchunks_manifest(&table)
        .map_err(|e| TransportError::malformed("the compressed chunks' manifest", e))?;
    let manifest = Manifest {
        digest: slate_bundle::Digest::of(&bytes).to_string(),
        bytes,
        media_type: crate::registry::OCI_MANIFEST.to_owned(),
    };
    let parsed = parse_manifest(&format!("the manifest {tag}"), &manifest)?;
    Ok(Some((
        PlannedImage {
            source_tag: None,
            destination: tag,
            manifest_digest: manifest.digest.clone(),
            tagged: true,
            manifest,
            built: Some(parsed.clone()),
        },
        parsed,
    )))
}

/// Copy a manifest the push built (not in the source's index) into the layout `dest`: its
/// config and layers as blobs, then the manifest. Its descriptor.
fn copy_built(
    source: &LayoutSource,
    dest: &Layout,
    image: &PlannedImage,
    parsed: &ImageManifest,
    stats: &mut Stats,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<oci_spec::image::Descriptor, TransportError> {
    for blob in std::iter::once(parsed.config()).chain(parsed.layers()) {
        let digest = blob.digest().to_string();
        crate::pull::fetch_blob(source, dest, &digest, blob.size(), stats, progress)?;
    }
    dest.put_document(&image.manifest_digest, &image.manifest.bytes)?;
    progress(Event::Manifest {
        name: &image.destination,
        digest: &image.manifest_digest,
    });
    oci_spec::image::DescriptorBuilder::default()
        .media_type(oci_spec::image::MediaType::ImageManifest)
        .digest(
            image
                .manifest_digest
                .parse::<oci_spec::image::Digest>()
                .map_err(|e| TransportError::malformed(&image.destination, e))?,
        )
        .size(image.manifest.bytes.len() as u64)
        .build()
        .map_err(|e| TransportError::malformed(&image.destination, e))
}

pub(crate) fn push(
    client: &Client,
    layout_dir: &Path,
    reference: &Reference,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Pushed, TransportError> {
    let plan = plan_push(layout_dir, reference)?;
    match reference.location() {
        Location::Registry { host, repository } => {
            let registry = Registry::new(host, repository, client, true)?;
            let source = Layout::open(layout_dir)?;
            let chunk = client.options.chunk_size.unwrap_or(DEFAULT_CHUNK);
            let (mut uploaded, mut skipped) = (0, 0);
            for PlannedBlob { digest, size } in &plan.blobs {
                let what = format!("blob {digest}");
                if registry.has_blob(&what, digest, *size)? {
                    progress(Event::BlobPresent {
                        digest,
                        size: *size,
                    });
                    skipped = u64::saturating_add(skipped, *size);
                    continue;
                }
                progress(Event::BlobStart {
                    digest,
                    size: *size,
                    from: 0,
                });
                let mut file = source.open_blob(&what, digest, *size, 0)?;
                registry.upload_blob(&what, digest, *size, &mut file, chunk, progress)?;
                progress(Event::BlobDone { digest });
                uploaded = u64::saturating_add(uploaded, *size);
            }
            let mut references = Vec::new();
            for image in &plan.images {
                registry.put_manifest(&image.destination, &image.manifest)?;
                progress(Event::Manifest {
                    name: &image.destination,
                    digest: &image.manifest_digest,
                });
                let separator = if image.tagged { ':' } else { '@' };
                references.push(format!(
                    "{host}/{repository}{separator}{}",
                    image.destination
                ));
            }
            Ok(Pushed {
                references,
                uploaded_bytes: uploaded,
                skipped_bytes: skipped,
            })
        }
        Location::Layout { path } => {
            let source = LayoutSource::open(layout_dir)?;
            let _lock = crate::cache::lock(path)?;
            let dest = Layout::create(path)?;
            let mut stats = Stats::default();
            let mut index = dest.read_index()?;
            let mut references = Vec::new();
            for image in &plan.images {
                if let Some(parsed) = &image.built {
                    let descriptor =
                        copy_built(&source, &dest, image, parsed, &mut stats, progress)?;
                    set_entry(&mut index, &descriptor, Some(&image.destination));
                    references.push(format!(
                        "{}{}:{}",
                        crate::LAYOUT_PREFIX,
                        path.display(),
                        image.destination
                    ));
                    continue;
                }
                let descriptor = copy_image(
                    &source,
                    &dest,
                    &image.manifest_digest,
                    &image.destination,
                    MAX_FILE_BYTES,
                    None,
                    &mut stats,
                    progress,
                )?
                .ok_or_else(|| TransportError::NotFound {
                    what: format!("the manifest {}", image.manifest_digest),
                    location: layout_dir.display().to_string(),
                })?;
                let tag = image.tagged.then_some(image.destination.as_str());
                set_entry(&mut index, &descriptor, tag);
                references.push(match tag {
                    Some(tag) => format!("{}{}:{tag}", crate::LAYOUT_PREFIX, path.display()),
                    None => format!(
                        "{}{}@{}",
                        crate::LAYOUT_PREFIX,
                        path.display(),
                        image.manifest_digest
                    ),
                });
            }
            dest.write_index(&index)?;
            Ok(Pushed {
                references,
                uploaded_bytes: stats.fetched,
                skipped_bytes: stats.cached,
            })
        }
    }
}

/// `manifest`'s config and layers not yet in `seen`, added to `blobs` (a blob two images share
/// is uploaded once).
fn plan_blobs(manifest: &ImageManifest, seen: &mut BTreeSet<String>, blobs: &mut Vec<PlannedBlob>) {
    for blob in std::iter::once(manifest.config()).chain(manifest.layers()) {
        let digest = blob.digest().to_string();
        if seen.insert(digest.clone()) {
            blobs.push(PlannedBlob {
                digest,
                size: blob.size(),
            });
        }
    }
}
