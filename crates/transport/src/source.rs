//! Where a pull reads from: a registry repository or a local layout, behind one small trait.

use std::io::Read;
use std::path::Path;

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};

use crate::layout::{parse_digest, tag_of, Layout};
use crate::registry::{Manifest, Registry, OCI_INDEX, OCI_MANIFEST};
use crate::TransportError;

pub(crate) trait Source {
    fn describe(&self) -> String;
    /// The manifest named `reference` (a tag or `sha256:<hex>`), verified, or `None` when the
    /// source has nothing by that name.
    fn manifest(&self, reference: &str) -> Result<Option<Manifest>, TransportError>;
    /// The blob's bytes from `offset`; the returned offset is where the stream really starts (0
    /// when the source cannot skip).
    fn blob(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        offset: u64,
    ) -> Result<(u64, Box<dyn Read + '_>), TransportError>;
}

impl Source for Registry {
    fn describe(&self) -> String {
        Registry::describe(self)
    }

    fn manifest(&self, reference: &str) -> Result<Option<Manifest>, TransportError> {
        self.get_manifest(reference)
    }

    fn blob(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        offset: u64,
    ) -> Result<(u64, Box<dyn Read + '_>), TransportError> {
        self.get_blob(what, digest, size, offset)
    }
}

/// A local OCI image layout read as a source.
#[derive(Debug)]
pub(crate) struct LayoutSource {
    pub layout: Layout,
    pub index: ImageIndex,
}

impl LayoutSource {
    pub fn open(dir: &Path) -> Result<Self, TransportError> {
        let layout = Layout::open(dir)?;
        let index = layout.read_index()?;
        Ok(LayoutSource { layout, index })
    }

    /// The tag of the only image that is not a signature.
    pub fn default_tag(&self) -> Result<String, TransportError> {
        let images: Vec<&Descriptor> = self
            .index
            .manifests()
            .iter()
            .filter(|d| !tag_of(d).is_some_and(slate_bundle::is_attached_tag))
            .collect();
        match images.as_slice() {
            [only] => tag_of(only).map(str::to_owned).ok_or_else(|| {
                TransportError::Usage(format!(
                    "the only image of {} has no tag: name its digest",
                    self.layout.dir().display()
                ))
            }),
            [] => Err(TransportError::Usage(format!(
                "{} holds no image",
                self.layout.dir().display()
            ))),
            _ => Err(TransportError::Usage(format!(
                "{} holds several images; name one of the tags {}",
                self.layout.dir().display(),
                self.tags().join(", ")
            ))),
        }
    }

    pub fn tags(&self) -> Vec<String> {
        self.index
            .manifests()
            .iter()
            .filter_map(|d| tag_of(d).map(str::to_owned))
            .collect()
    }

    /// The manifest an index entry names, verified.
    pub fn manifest_of(&self, d: &Descriptor) -> Result<Manifest, TransportError> {
        let digest = d.digest().to_string();
        let what = format!("the manifest {digest} in {}", self.layout.dir().display());
        let bytes = self.layout.read_document(&what, &digest, Some(d.size()))?;
        Ok(Manifest {
            bytes,
            digest,
            media_type: d.media_type().to_string(),
        })
    }
}

impl Source for LayoutSource {
    fn describe(&self) -> String {
        self.layout.dir().display().to_string()
    }

    fn manifest(&self, reference: &str) -> Result<Option<Manifest>, TransportError> {
        let by_digest = reference.starts_with("sha256:");
        let entry = self.index.manifests().iter().find(|d| {
            if by_digest {
                d.digest().to_string() == reference
            } else {
                tag_of(d) == Some(reference)
            }
        });
        entry.map(|d| self.manifest_of(d)).transpose()
    }

    fn blob(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        offset: u64,
    ) -> Result<(u64, Box<dyn Read + '_>), TransportError> {
        let file = self.layout.open_blob(what, digest, size, offset)?;
        Ok((offset, Box::new(file.take(size - offset))))
    }
}

/// The OCI image manifest in `manifest`: its media type, JSON, and descriptors checked.
pub(crate) fn parse_manifest(
    what: &str,
    manifest: &Manifest,
) -> Result<ImageManifest, TransportError> {
    if manifest.media_type != OCI_MANIFEST {
        let kind = if manifest.media_type == OCI_INDEX {
            " (an image index: slate bundles are single images)"
        } else {
            ""
        };
        return Err(TransportError::MediaType {
            what: format!("{what}{kind}"),
            actual: manifest.media_type.clone(),
            expected: OCI_MANIFEST.into(),
        });
    }
    let value: serde_json::Value = serde_json::from_slice(&manifest.bytes)
        .map_err(|e| TransportError::malformed(what, format!("it is not JSON: {e}")))?;
    if let Some(declared) = value.get("mediaType") {
        if declared.as_str() != Some(OCI_MANIFEST) {
            return Err(TransportError::MediaType {
                what: format!("{what} (its mediaType field)"),
                actual: declared.to_string(),
                expected: OCI_MANIFEST.into(),
            });
        }
    }
    let parsed: ImageManifest = serde_json::from_value(value).map_err(|e| {
        TransportError::malformed(what, format!("it is not an OCI image manifest: {e}"))
    })?;
    for d in std::iter::once(parsed.config()).chain(parsed.layers()) {
        parse_digest(d.digest().as_ref()).map_err(|_| {
            TransportError::malformed(
                what,
                format!(
                    "it names the blob {:?} (sha256 digests only)",
                    d.digest().to_string()
                ),
            )
        })?;
    }
    Ok(parsed)
}
