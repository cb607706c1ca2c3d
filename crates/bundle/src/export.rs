//! One image of a layout (and its cosign signature, if the layout has one) as a tar stream of a
//! minimal OCI layout: what the client uploads to a node, whatever else its cache holds.

use std::io::Write;

use oci_spec::image::{Descriptor, ImageIndex, ImageIndexBuilder, ImageManifest, MediaType};

use crate::read::{read_capped, tag_of};
use crate::{Bundle, BundleError, MAX_DOCUMENT_BYTES};

fn malformed(what: &str, reason: impl std::fmt::Display) -> BundleError {
    BundleError::Malformed {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

fn append(
    tar: &mut tar::Builder<&mut dyn Write>,
    name: &str,
    bytes: &[u8],
) -> Result<(), BundleError> {
    let mut header = tar::Header::new_ustar();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    tar.append_data(&mut header, name, bytes)
        .map_err(|source| BundleError::Io {
            path: name.into(),
            source,
        })
}

impl Bundle {
    /// Write this image (its manifest, config and layers), plus the signature manifests tagged
    /// `sha256-<hex>.sig` for it and their blobs, as a tar of a one-image layout. Every blob is
    /// checked against its digest as it is read.
    pub fn export_tar(&self, out: &mut dyn Write) -> Result<(), BundleError> {
        let dir = self.dir();
        let index_bytes = read_capped(&dir.join("index.json"), "index.json", MAX_DOCUMENT_BYTES)?;
        let index: ImageIndex =
            serde_json::from_slice(&index_bytes).map_err(|e| malformed("index.json", e))?;
        let signature_tag = format!(
            "{}.sig",
            self.manifest_digest().replacen("sha256:", "sha256-", 1)
        );
        let chosen: Vec<Descriptor> = index
            .manifests()
            .iter()
            .filter(|d| {
                d.digest().to_string() == self.manifest_digest()
                    || tag_of(d) == Some(signature_tag.as_str())
            })
            .cloned()
            .collect();
        let mut tar = tar::Builder::new(out);
        append(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let mut written = std::collections::BTreeSet::new();
        for descriptor in &chosen {
            let what = "an image manifest";
            let manifest_bytes = crate::read::read_descriptor(dir, what, descriptor)?;
            let manifest: ImageManifest =
                serde_json::from_slice(&manifest_bytes).map_err(|e| malformed(what, e))?;
            let mut blobs = vec![(descriptor.clone(), Some(manifest_bytes))];
            blobs.push((manifest.config().clone(), None));
            blobs.extend(manifest.layers().iter().cloned().map(|d| (d, None)));
            for (blob, bytes) in blobs {
                let digest = blob.digest().to_string();
                if !written.insert(digest.clone()) {
                    continue;
                }
                let bytes = match bytes {
                    Some(bytes) => bytes,
                    None => crate::read::read_blob(dir, "a blob", &digest, blob.size(), u64::MAX)?,
                };
                let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
                append(&mut tar, &name, &bytes)?;
            }
        }
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(chosen)
            .build()
            .map_err(|e| malformed("the exported index", e))?;
        let index = crate::write::canonical_json(&index);
        append(&mut tar, "index.json", &index)?;
        tar.into_inner()
            .and_then(|out| out.flush())
            .map_err(|source| BundleError::Io {
                path: "the tar stream".into(),
                source,
            })
    }
}
