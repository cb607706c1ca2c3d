//! Laying out a bundle: blobs under `blobs/sha256`, the bundle manifest as the config blob, one
//! OCI image manifest, and `index.json` tagging it with the version.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use oci_spec::image::{
    Descriptor, DescriptorBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType,
};
use serde::Serialize;
use slate_delta::KnownFrames;

use crate::blob::blob_path;
use crate::{
    BlobRef, BundleError, BundleManifest, ChunkDigests, Digest, ARTIFACT_TYPE, CHUNKED_MIN,
    CHUNK_SIZE, CONFIG_MEDIA_TYPE, REF_NAME_ANNOTATION,
};

/// What the bundle is.
#[derive(Debug, Clone, Copy)]
pub struct BundleSpec<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub arch: &'a str,
    pub variant: &'a str,
}

/// One blob to carry, under a role the installer looks up (`uki`, `installer`).
#[derive(Debug, Clone, Copy)]
pub struct BlobInput<'a> {
    pub role: &'a str,
    pub file_name: &'a str,
    pub media_type: &'a str,
    pub bytes: &'a [u8],
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |source| BundleError::Io {
        path: path.to_owned(),
        source,
    }
}

fn malformed(what: &str) -> impl FnOnce(oci_spec::OciSpecError) -> BundleError + '_ {
    move |err| BundleError::Malformed {
        what: what.to_owned(),
        reason: err.to_string(),
    }
}

/// Pretty JSON with sorted object keys (through `serde_json::Value`), so bundles reproduce.
pub(crate) fn canonical_json(value: &impl Serialize) -> Vec<u8> {
    let value = serde_json::to_value(value).expect("plain data serializes");
    serde_json::to_vec_pretty(&value).expect("a JSON value serializes")
}

/// Write `bytes` as the blob named by their digest.
pub(crate) fn put_blob(dir: &Path, bytes: &[u8]) -> Result<Digest, BundleError> {
    let digest = Digest::of(bytes);
    let path = blob_path(dir, &digest);
    fs::write(&path, bytes).map_err(io_err(&path))?;
    Ok(digest)
}

pub(crate) fn descriptor(
    media_type: &str,
    digest: &Digest,
    size: usize,
    annotations: &[(&str, &str)],
) -> Result<Descriptor, BundleError> {
    let mut builder = DescriptorBuilder::default()
        .media_type(MediaType::from(media_type))
        .digest(digest.to_oci())
        .size(size as u64);
    if !annotations.is_empty() {
        builder = builder.annotations(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        );
    }
    builder.build().map_err(malformed("a descriptor"))
}

/// Lay out the bundle in `dir` (created if missing; expected empty), tagged with the version.
pub fn write_bundle(
    dir: &Path,
    spec: BundleSpec<'_>,
    blobs: &[BlobInput<'_>],
) -> Result<BundleManifest, BundleError> {
    write_layout(dir, spec, None, blobs, None, &KnownFrames::new())
}

/// [`write_bundle`] for a bundle that can also be installed onto a blank disk: it carries the
/// profile's disk settings (and should carry a `systemd-boot` blob).
pub fn write_installable_bundle(
    dir: &Path,
    spec: BundleSpec<'_>,
    install: crate::InstallDefaults,
    blobs: &[BlobInput<'_>],
) -> Result<BundleManifest, BundleError> {
    write_layout(dir, spec, Some(install), blobs, None, &KnownFrames::new())
}

/// [`write_installable_bundle`] with a chunk index layer (`crate::chunk_index`) listing the
/// blobs of at least [`crate::INDEXED_MIN`] bytes, cut with `chunking`: what the imager writes.
pub fn write_installable_bundle_with(
    dir: &Path,
    spec: BundleSpec<'_>,
    install: crate::InstallDefaults,
    blobs: &[BlobInput<'_>],
    chunking: slate_delta::ChunkParams,
) -> Result<BundleManifest, BundleError> {
    write_installable_bundle_reusing(dir, spec, install, blobs, chunking, &KnownFrames::new())
}

/// [`write_installable_bundle_with`], taking each chunk's compressed frame from `known` where
/// it is there (`slate_delta::zchunks::compress_reusing`): the same bytes, sooner, when the
/// imager's build cache kept the frames of an earlier build.
pub fn write_installable_bundle_reusing(
    dir: &Path,
    spec: BundleSpec<'_>,
    install: crate::InstallDefaults,
    blobs: &[BlobInput<'_>],
    chunking: slate_delta::ChunkParams,
    known: &KnownFrames,
) -> Result<BundleManifest, BundleError> {
    write_layout(dir, spec, Some(install), blobs, Some(chunking), known)
}

/// The manifest whose one layer is the compressed blob `table` names (pretty JSON, keys
/// sorted: the same table always gives the same bytes).
pub fn zchunks_manifest(table: &slate_delta::ZTable) -> Result<Vec<u8>, BundleError> {
    let blob = Digest::from_raw(table.blob);
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .artifact_type(MediaType::from(slate_delta::zchunks::ZBLOB_MEDIA_TYPE))
        .config(descriptor(
            crate::EMPTY_CONFIG_MEDIA_TYPE,
            &Digest::of(crate::EMPTY_CONFIG),
            crate::EMPTY_CONFIG.len(),
            &[],
        )?)
        .layers(vec![descriptor(
            slate_delta::zchunks::ZBLOB_MEDIA_TYPE,
            &blob,
            table.blob_size as usize,
            &[],
        )?])
        .build()
        .map_err(malformed("the compressed chunks' manifest"))?;
    Ok(canonical_json(&manifest))
}

/// The compressed chunks of `index` (formats.md §7.8): the compressed blob, its manifest and
/// that manifest's empty config under `blobs/sha256` (no `index.json` entry: see
/// `crate::zchunks`), and the table's bytes for the image manifest. `None` when no chunk
/// compresses (nothing to gain, no table).
fn put_zchunks(
    dir: &Path,
    index: &slate_delta::ChunkIndex,
    blobs: &[(Digest, &[u8])],
    known: &KnownFrames,
) -> Result<Option<Vec<u8>>, BundleError> {
    let listed: Vec<&[u8]> = index
        .blobs
        .iter()
        .map(|listed| {
            blobs
                .iter()
                .find(|(digest, _)| digest.as_str() == listed.oci_digest())
                .map(|(_, bytes)| *bytes)
                .expect("the index lists the blobs it was cut from")
        })
        .collect();
    let level = slate_delta::zchunks::LEVEL;
    let (table, compressed) = slate_delta::zchunks::compress_reusing(index, &listed, level, known)
        .map_err(io_err(dir))?;
    if compressed.is_empty() {
        return Ok(None);
    }
    put_blob(dir, &compressed)?;
    put_blob(dir, crate::EMPTY_CONFIG)?;
    put_blob(dir, &zchunks_manifest(&table)?)?;
    Ok(Some(table.to_bytes()))
}

fn write_layout(
    dir: &Path,
    spec: BundleSpec<'_>,
    install: Option<crate::InstallDefaults>,
    blobs: &[BlobInput<'_>],
    chunking: Option<slate_delta::ChunkParams>,
    known: &KnownFrames,
) -> Result<BundleManifest, BundleError> {
    let blobs_dir = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs_dir).map_err(io_err(&blobs_dir))?;
    let mut layers = Vec::new();
    let mut refs = BTreeMap::new();
    let mut hashed = Vec::with_capacity(blobs.len());
    for blob in blobs {
        let digest = put_blob(dir, blob.bytes)?;
        hashed.push((digest.clone(), blob.bytes));
        refs.insert(
            blob.role.to_string(),
            BlobRef {
                file_name: blob.file_name.to_string(),
                digest: digest.to_string(),
                size: blob.bytes.len() as u64,
            },
        );
        let chunks = (blob.bytes.len() as u64 >= CHUNKED_MIN)
            .then(|| ChunkDigests::of(blob.bytes, CHUNK_SIZE).annotations());
        let mut annotations = vec![("org.opencontainers.image.title", blob.file_name)];
        for (key, value) in chunks.iter().flatten() {
            annotations.push((key, value));
        }
        layers.push(descriptor(
            blob.media_type,
            &digest,
            blob.bytes.len(),
            &annotations,
        )?);
    }
    // Last, after every blob: a reader that knows no chunk index skips a layer no role names.
    let index = chunking.and_then(|params| {
        let bytes: Vec<&[u8]> = blobs.iter().map(|b| b.bytes).collect();
        crate::index_of(&bytes, params)
    });
    if let Some(index) = index {
        let bytes = index.to_bytes();
        layers.push(descriptor(
            crate::CHUNK_INDEX_MEDIA_TYPE,
            &put_blob(dir, &bytes)?,
            bytes.len(),
            &[],
        )?);
        if let Some(table) = put_zchunks(dir, &index, &hashed, known)? {
            layers.push(descriptor(
                slate_delta::zchunks::ZTABLE_MEDIA_TYPE,
                &put_blob(dir, &table)?,
                table.len(),
                &[],
            )?);
        }
    }
    let manifest = BundleManifest {
        name: spec.name.into(),
        version: spec.version.into(),
        arch: spec.arch.into(),
        variant: spec.variant.into(),
        blobs: refs,
        install,
    };
    let config = canonical_json(&manifest);
    let oci_manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .artifact_type(MediaType::from(ARTIFACT_TYPE))
        .config(descriptor(
            CONFIG_MEDIA_TYPE,
            &put_blob(dir, &config)?,
            config.len(),
            &[],
        )?)
        .layers(layers)
        .annotations(HashMap::from([
            (
                "org.opencontainers.image.version".to_string(),
                spec.version.to_string(),
            ),
            ("dev.slate.arch".to_string(), spec.arch.to_string()),
            ("dev.slate.variant".to_string(), spec.variant.to_string()),
        ]))
        .build()
        .map_err(malformed("the image manifest"))?;
    let oci_manifest = canonical_json(&oci_manifest);
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![descriptor(
            crate::MANIFEST_MEDIA_TYPE,
            &put_blob(dir, &oci_manifest)?,
            oci_manifest.len(),
            &[(REF_NAME_ANNOTATION, spec.version)],
        )?])
        .build()
        .map_err(malformed("the image index"))?;
    for (file, bytes) in [
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ("index.json", canonical_json(&index)),
    ] {
        let path = dir.join(file);
        fs::write(&path, bytes).map_err(io_err(&path))?;
    }
    Ok(manifest)
}
