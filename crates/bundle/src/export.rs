//! One image of a layout (and its cosign signature, if the layout has one) as a tar stream of a
//! minimal OCI layout: what the client uploads to a node, whatever else its cache holds.
//!
//! The order is part of the format (formats.md §7.4): `oci-layout`, `index.json`, the documents
//! (each manifest, its config, a signature's payloads), and the image's layers last. A receiver
//! thus holds everything the signature check needs before the first large blob arrives, and
//! refuses an unsigned or untrusted bundle without reading its blobs.

use std::collections::BTreeSet;
use std::io::Write;

use oci_spec::image::{Descriptor, ImageIndex, ImageIndexBuilder, ImageManifest, MediaType};

use crate::blob::{blob_path, from_io, parse_digest};
use crate::read::{read_capped, read_descriptor, tag_of};
use crate::{signature_tag_of, Bundle, BundleError, Digest, MAX_DOCUMENT_BYTES};

const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

fn malformed(what: &str, reason: impl std::fmt::Display) -> BundleError {
    BundleError::Malformed {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

fn header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    header
}

fn append(
    tar: &mut tar::Builder<&mut dyn Write>,
    name: &str,
    bytes: &[u8],
) -> Result<(), BundleError> {
    tar.append_data(&mut header(bytes.len() as u64), name, bytes)
        .map_err(|source| BundleError::Io {
            path: name.into(),
            source,
        })
}

fn entry_name(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

/// What an exported tar holds, before a byte of it is written.
struct Contents {
    /// The exported `index.json`: the image's entries and its signature's.
    index: Vec<u8>,
    /// Manifests, configs and signature payloads, read and verified, in upload order.
    documents: Vec<(Digest, Vec<u8>)>,
    /// The image's layers, streamed last.
    layers: Vec<(Digest, u64)>,
}

impl Bundle {
    /// Write this image (its manifest, config and layers), plus the signature manifests tagged
    /// `sha256-<hex>.sig` for it and their blobs, as a tar of a one-image layout. Every blob is
    /// checked against its digest as it is read, unless this bundle verified it already (then it
    /// is streamed with a size check: it was hashed once in this process, and the receiver
    /// hashes it again on its side). A layer that turns out not to match fails the export
    /// after its bytes were written, which breaks the stream for the receiver.
    pub fn export_tar(&self, out: &mut dyn Write) -> Result<(), BundleError> {
        let contents = self.export_contents()?;
        let mut tar = tar::Builder::new(out);
        append(&mut tar, "oci-layout", OCI_LAYOUT)?;
        append(&mut tar, "index.json", &contents.index)?;
        for (digest, bytes) in &contents.documents {
            append(&mut tar, &entry_name(digest), bytes)?;
        }
        for (digest, size) in &contents.layers {
            let mut reader = self.blob_reader(&format!("the blob {digest}"), digest, *size)?;
            tar.append_data(&mut header(*size), entry_name(digest), &mut reader)
                .map_err(|e| from_io(&blob_path(self.dir(), digest), e))?;
        }
        tar.into_inner()
            .and_then(|out| out.flush())
            .map_err(|source| BundleError::Io {
                path: "the tar stream".into(),
                source,
            })
    }

    fn export_contents(&self) -> Result<Contents, BundleError> {
        let dir = self.dir();
        let index_bytes = read_capped(&dir.join("index.json"), "index.json", MAX_DOCUMENT_BYTES)?;
        let index: ImageIndex =
            serde_json::from_slice(&index_bytes).map_err(|e| malformed("index.json", e))?;
        let signature_tag = signature_tag_of(self.digest());
        let is_signature = |d: &Descriptor| tag_of(d) == Some(signature_tag.as_str());
        // The image's entries first, then its signature's, whatever the index order.
        let chosen: Vec<Descriptor> = index
            .manifests()
            .iter()
            .filter(|d| d.digest().as_ref() == self.manifest_digest() && !is_signature(d))
            .chain(index.manifests().iter().filter(|d| is_signature(d)))
            .cloned()
            .collect();
        let mut seen = BTreeSet::new();
        let mut documents = Vec::new();
        let mut layers = Vec::new();
        for descriptor in &chosen {
            let what = "an image manifest";
            let digest = parse_digest(descriptor.digest().as_ref())?;
            let manifest_bytes = if digest == *self.digest() {
                self.manifest_bytes().to_vec()
            } else {
                read_descriptor(dir, what, descriptor, self.verified_set())?
            };
            let manifest: ImageManifest =
                serde_json::from_slice(&manifest_bytes).map_err(|e| malformed(what, e))?;
            if seen.insert(digest.clone()) {
                documents.push((digest, manifest_bytes));
            }
            let config = manifest.config();
            let config_digest = parse_digest(config.digest().as_ref())?;
            if seen.insert(config_digest.clone()) {
                let bytes = read_descriptor(dir, "a config", config, self.verified_set())?;
                documents.push((config_digest, bytes));
            }
            for layer in manifest.layers() {
                let layer_digest = parse_digest(layer.digest().as_ref())?;
                if !seen.insert(layer_digest.clone()) {
                    continue;
                }
                if is_signature(descriptor) {
                    let bytes =
                        read_descriptor(dir, "a signature payload", layer, self.verified_set())?;
                    documents.push((layer_digest, bytes));
                } else {
                    layers.push((layer_digest, layer.size()));
                }
            }
        }
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(chosen)
            .build()
            .map_err(|e| malformed("the exported index", e))?;
        Ok(Contents {
            index: crate::write::canonical_json(&index),
            documents,
            layers,
        })
    }
}
