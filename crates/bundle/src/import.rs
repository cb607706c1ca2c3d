//! The upload tar ([`Bundle::export_tar`]'s stream of a one-image OCI layout) unpacked into a
//! staging directory and checked signature first (formats.md §7.4). The signature check itself
//! is the caller's ([`import_tar`]'s judge: machined verifies with `slate_trust` against the
//! node's trusted keys), so this crate stays below `slate-trust`.
//!
//! - Every entry must be a plain layout file (no links, devices, `..` or foreign names), named
//!   at most once.
//! - Every blob is hashed as it is written and must match its name (`blobs/sha256/<hex>`): the
//!   one pass over its bytes in this process. Its digest is recorded in the imported bundle's
//!   [`VerifiedBlobs`], so nothing later reads it again to check it.
//! - As soon as `index.json`, the image manifest, its config and the signature manifest with
//!   its payloads are in, the judge is asked. slate's exporter sends exactly those first, so an
//!   unsigned or untrusted bundle is refused before any of its large blobs is read. Between
//!   `index.json` and that verdict only documents (at most [`MAX_DOCUMENT_BYTES`]) are taken;
//!   after it, only blobs of the signed image, each of the size the signed manifest gives.
//! - An upload with `index.json` last (older clients) is still taken: its blobs are hashed as
//!   they arrive, and the judge is asked when the index arrives, before anything uses them.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use crate::{Bundle, BundleError, Digest, DigestWriter, VerifiedBlobs, MAX_DOCUMENT_BYTES};

/// Why an upload was not imported. The message of each variant is complete (its cause is part
/// of it, not a `source`). [`ImportError::Io`] is the staging directory failing; every other
/// variant is the upload's fault.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the upload is not a tar stream: {error}")]
    NotTar { error: io::Error },
    #[error("the upload broke: {error}")]
    Broke { error: io::Error },
    #[error("the upload broke in {name}: {error}")]
    BrokeIn { name: PathBuf, error: io::Error },
    #[error("a bad name in the upload: {error}")]
    BadName { error: io::Error },
    #[error("a bad size for {name}: {error}")]
    BadSize { name: PathBuf, error: io::Error },
    #[error("{name} is not a file of an OCI layout; refusing the upload")]
    NotLayout { name: PathBuf },
    /// `kind` is the tar entry type, as `Debug` shows it (`Symlink`, `Char`, …).
    #[error("{name} is a {kind} entry; a layout holds plain files only")]
    NotPlainFile { name: PathBuf, kind: String },
    #[error("{path} appears twice in the upload")]
    Twice { path: PathBuf },
    #[error("the bundle is refused: {0}")]
    Refused(Refusal),
    /// Writing into the staging directory failed.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: io::Error },
}

/// Why the content of an upload was refused (shown after "the bundle is refused: ").
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the blob {named} does not match its name (its bytes are {actual})")]
    BlobMismatch { named: Digest, actual: Digest },
    #[error("{path} is larger than {MAX_DOCUMENT_BYTES} bytes")]
    OversizeDocument { path: PathBuf },
    #[error(
        "a {size}-byte blob ({digest}) came before the signature could be checked; the \
         manifests, configs and signature come first"
    )]
    BlobBeforeSignature { digest: Digest, size: u64 },
    #[error("the blob {digest} is {size} bytes, the signed manifest says {expected}")]
    BlobSize {
        digest: Digest,
        size: u64,
        expected: u64,
    },
    #[error("the blob {digest} is not part of the signed image")]
    NotInImage { digest: Digest },
    #[error("the upload has no index.json")]
    NoIndex,
    #[error("its signature could not be checked")]
    Unchecked,
    #[error("the upload lacks the blob {digest}")]
    MissingBlob { digest: Digest },
    /// The layout received does not open as a bundle (shown with its causes).
    #[error("{}", chain(.0))]
    Bundle(BundleError),
    /// The judge refused the signature.
    #[error("{0}")]
    Signature(String),
}

/// Why the judge of [`import_tar`] did not accept the documents received so far.
#[derive(Debug)]
pub enum JudgeError {
    /// Reading the bundle failed. A file that has not arrived yet (`NotFound`) only postpones
    /// the judgement to the next entry; at the end of the upload, or for any other error, the
    /// upload is refused with it ([`Refusal::Bundle`]).
    Bundle(BundleError),
    /// The signature is refused, for this reason ([`Refusal::Signature`]).
    Refused(String),
}

impl From<BundleError> for JudgeError {
    fn from(error: BundleError) -> Self {
        JudgeError::Bundle(error)
    }
}

/// What an accepted upload left in its staging directory.
#[derive(Debug)]
pub struct Imported<T> {
    /// Opened with every blob verified as it arrived ([`Bundle::verified_blobs`]).
    pub bundle: Bundle,
    /// What the judge returned when it accepted the signature.
    pub signed: T,
}

/// `error` and its causes, outermost first, separated by `": "` (the text of
/// `slate_sequencer::error_chain`, which this crate does not depend on).
fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn refused(refusal: Refusal) -> ImportError {
    ImportError::Refused(refusal)
}

fn failed(path: &Path, error: io::Error) -> ImportError {
    ImportError::Io {
        path: path.to_owned(),
        error,
    }
}

/// The files of an OCI layout an upload may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LayoutFile {
    OciLayout,
    Index,
    Blob(Digest),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LayoutEntry {
    /// `blobs` or `blobs/sha256`.
    Directory(&'static str),
    File(LayoutFile),
}

impl LayoutFile {
    fn relative(&self) -> PathBuf {
        match self {
            LayoutFile::OciLayout => "oci-layout".into(),
            LayoutFile::Index => "index.json".into(),
            LayoutFile::Blob(digest) => Path::new("blobs/sha256").join(digest.hex()),
        }
    }
}

/// Only the files of an OCI layout, as plain relative names: no links, devices, `..` or
/// absolute names can come out of an upload, and a blob's name must be a canonical digest.
fn layout_entry(path: &Path) -> Option<LayoutEntry> {
    let parts: Vec<&str> = path
        .components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some(match parts.as_slice() {
        ["oci-layout"] => LayoutEntry::File(LayoutFile::OciLayout),
        ["index.json"] => LayoutEntry::File(LayoutFile::Index),
        ["blobs"] => LayoutEntry::Directory("blobs"),
        ["blobs", "sha256"] => LayoutEntry::Directory("blobs/sha256"),
        ["blobs", "sha256", hex] => LayoutEntry::File(LayoutFile::Blob(
            Digest::parse(&format!("sha256:{hex}")).ok()?,
        )),
        _ => return None,
    })
}

/// Whether `error` only says that a file of the layout has not arrived yet.
fn not_here_yet(error: &BundleError) -> bool {
    matches!(error, BundleError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

/// What the judge accepted.
#[derive(Debug)]
struct Signed<T> {
    signed: T,
    /// The image's config and layers: all that may still arrive, each of this size.
    image_blobs: BTreeMap<Digest, u64>,
}

/// An upload being unpacked.
struct Importer<'j, T> {
    dir: PathBuf,
    judge: &'j mut dyn FnMut(&Bundle) -> Result<T, JudgeError>,
    seen: BTreeSet<PathBuf>,
    received: VerifiedBlobs,
    index_received: bool,
    signed: Option<Signed<T>>,
}

/// Large enough that a 256 MiB blob is not a million small writes.
const COPY_BUFFER: usize = 256 * 1024;

impl<T> Importer<'_, T> {
    fn entry(&mut self, mut entry: tar::Entry<'_, impl Read>) -> Result<(), ImportError> {
        let name = entry
            .path()
            .map_err(|error| ImportError::BadName { error })?
            .into_owned();
        let not_layout = || ImportError::NotLayout { name: name.clone() };
        let layout = layout_entry(&name).ok_or_else(not_layout)?;
        let kind = entry.header().entry_type();
        let file = match (layout, kind) {
            (LayoutEntry::Directory(dir), tar::EntryType::Directory) => {
                let target = self.dir.join(dir);
                return fs::create_dir_all(&target).map_err(|e| failed(&target, e));
            }
            (LayoutEntry::File(file), tar::EntryType::Regular) => file,
            (_, tar::EntryType::Regular | tar::EntryType::Directory) => return Err(not_layout()),
            (_, other) => {
                return Err(ImportError::NotPlainFile {
                    name,
                    kind: format!("{other:?}"),
                })
            }
        };
        let relative = file.relative();
        if !self.seen.insert(relative.clone()) {
            return Err(ImportError::Twice { path: relative });
        }
        let size = entry
            .header()
            .size()
            .map_err(|error| ImportError::BadSize {
                name: name.clone(),
                error,
            })?;
        self.admit(&file, size)?;
        let target = self.dir.join(&relative);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| failed(parent, e))?;
        }
        let mut out = File::create(&target).map_err(|e| failed(&target, e))?;
        match file {
            LayoutFile::Blob(named) => {
                let mut writer = DigestWriter::new(out);
                copy(&mut entry, &mut writer, &name, &target)?;
                let written = writer.bytes();
                let (_, actual) = writer.finish();
                if actual != named {
                    return Err(refused(Refusal::BlobMismatch { named, actual }));
                }
                self.received.insert(named, written);
            }
            LayoutFile::Index => {
                copy(&mut entry, &mut out, &name, &target)?;
                self.index_received = true;
            }
            LayoutFile::OciLayout => copy(&mut entry, &mut out, &name, &target)?,
        }
        if self.signed.is_none() && self.index_received {
            self.check_signature(false)?;
        }
        Ok(())
    }

    /// Whether a file of `size` bytes may come now (before its bytes are read).
    fn admit(&self, file: &LayoutFile, size: u64) -> Result<(), ImportError> {
        let LayoutFile::Blob(digest) = file else {
            if size > MAX_DOCUMENT_BYTES {
                return Err(refused(Refusal::OversizeDocument {
                    path: file.relative(),
                }));
            }
            return Ok(());
        };
        let digest = digest.clone();
        match &self.signed {
            Some(signed) => match signed.image_blobs.get(&digest) {
                Some(&expected) if expected == size => Ok(()),
                Some(&expected) => Err(refused(Refusal::BlobSize {
                    digest,
                    size,
                    expected,
                })),
                None => Err(refused(Refusal::NotInImage { digest })),
            },
            // The index is in, the signature not yet: only its documents may come first.
            None if self.index_received && size > MAX_DOCUMENT_BYTES => {
                Err(refused(Refusal::BlobBeforeSignature { digest, size }))
            }
            None => Ok(()),
        }
    }

    /// Open the documents received so far and ask the judge. Until `last`, a document that has
    /// not arrived yet only postpones the check.
    fn check_signature(&mut self, last: bool) -> Result<(), ImportError> {
        let pending = |error: &BundleError| !last && not_here_yet(error);
        let bundle = match Bundle::open_with(&self.dir, None, self.received.clone()) {
            Ok(bundle) => bundle,
            Err(e) if pending(&e) => return Ok(()),
            Err(e) => return Err(refused(Refusal::Bundle(e))),
        };
        let signed = match (self.judge)(&bundle) {
            Ok(signed) => signed,
            Err(JudgeError::Bundle(e)) if pending(&e) => return Ok(()),
            Err(JudgeError::Bundle(e)) => return Err(refused(Refusal::Bundle(e))),
            Err(JudgeError::Refused(reason)) => return Err(refused(Refusal::Signature(reason))),
        };
        self.signed = Some(Signed {
            signed,
            image_blobs: bundle.image_blobs().iter().cloned().collect(),
        });
        Ok(())
    }

    fn finish(mut self) -> Result<Imported<T>, ImportError> {
        if self.signed.is_none() {
            if !self.index_received {
                return Err(refused(Refusal::NoIndex));
            }
            self.check_signature(true)?;
        }
        let Some(signed) = self.signed else {
            return Err(refused(Refusal::Unchecked));
        };
        if let Some((digest, _)) = signed
            .image_blobs
            .iter()
            .find(|(digest, size)| !self.received.contains(digest, **size))
        {
            return Err(refused(Refusal::MissingBlob {
                digest: digest.clone(),
            }));
        }
        let bundle = Bundle::open_with(&self.dir, None, self.received)
            .map_err(|e| refused(Refusal::Bundle(e)))?;
        Ok(Imported {
            bundle,
            signed: signed.signed,
        })
    }
}

/// Copy one entry's bytes to `out` (a file under `target`).
fn copy(
    entry: &mut impl Read,
    out: &mut impl Write,
    name: &Path,
    target: &Path,
) -> Result<(), ImportError> {
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = match entry.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                return Err(ImportError::BrokeIn {
                    name: name.to_owned(),
                    error,
                })
            }
        };
        out.write_all(&buf[..n]).map_err(|e| failed(target, e))?;
    }
}

/// Unpack the upload `body` (formats.md §7.4) into the empty directory `dir`, asking `judge`
/// about the signature as soon as the documents it reads are in: before any large blob is read
/// when the upload is in slate's order, when `index.json` arrives otherwise. The judge returns
/// what it accepted (e.g. the signer), or why not; it may be asked more than once until it
/// answers, never again after. Every blob is hashed once, as it is written.
///
/// On an error the staging directory holds whatever arrived until then; the caller removes it.
pub fn import_tar<T>(
    body: impl Read,
    dir: &Path,
    judge: &mut dyn FnMut(&Bundle) -> Result<T, JudgeError>,
) -> Result<Imported<T>, ImportError> {
    let mut archive = tar::Archive::new(body);
    let entries = archive
        .entries()
        .map_err(|error| ImportError::NotTar { error })?;
    let mut importer = Importer {
        dir: dir.to_owned(),
        judge,
        seen: BTreeSet::new(),
        received: VerifiedBlobs::new(),
        index_received: false,
        signed: None,
    };
    for entry in entries {
        let entry = entry.map_err(|error| ImportError::Broke { error })?;
        importer.entry(entry)?;
    }
    importer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_layout_files_come_out_of_an_upload() {
        let hex = "ab".repeat(32);
        for ok in [
            "oci-layout".to_string(),
            "./index.json".into(),
            "blobs/sha256".into(),
            format!("blobs/sha256/{hex}"),
        ] {
            assert!(layout_entry(Path::new(&ok)).is_some(), "{ok}");
        }
        for bad in [
            "../etc/passwd".to_string(),
            "/etc/passwd".into(),
            "blobs/sha256/../../x".into(),
            "blobs/sha256/short".into(),
            format!("blobs/sha256/{}", hex.to_uppercase()),
            format!("blobs/sha512/{hex}"),
            "installer".into(),
        ] {
            assert!(layout_entry(Path::new(&bad)).is_none(), "{bad}");
        }
    }
}
