//! `POST /v1/bundles`: an uploaded bundle, the tar stream of a one-image OCI layout, unpacked
//! into a staging directory and checked signature first (formats.md §7.4).
//!
//! - Every entry must be a plain layout file (no links, devices, `..` or foreign names), named
//!   at most once.
//! - Every blob is hashed as it is written and must match its name (`blobs/sha256/<hex>`): the
//!   one pass over its bytes in this process. Its digest is remembered ([`VerifiedBlobs`]), so
//!   nothing here or later (`plan`, the Upgrade sequence) reads it again to check it.
//! - As soon as `index.json`, the image manifest, its config and the signature manifest with
//!   its payloads are in, the signature is verified against the trusted keys. slate's exporter
//!   sends exactly those first, so an unsigned or untrusted bundle is refused before any of its
//!   large blobs is read. Between `index.json` and that verdict only documents (at most
//!   [`MAX_DOCUMENT_BYTES`]) are taken; after it, only blobs of the signed image, each of the
//!   size the signed manifest gives.
//! - An upload with `index.json` last (older clients) is still taken: its blobs are hashed as
//!   they arrive, and the signature is checked when the index arrives, before anything uses
//!   them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use slate_api::BackendError;
use slate_bundle::{
    Bundle, BundleError, Digest, DigestWriter, VerifiedBlobs, INSTALLER_ROLE, MAX_DOCUMENT_BYTES,
};
use slate_sequencer::error_chain as chain;
use slate_trust::{PublicKey, TrustError};

/// What an accepted upload left in its staging directory.
#[derive(Debug)]
pub(super) struct Received {
    /// Opened with every blob verified as it arrived.
    pub bundle: Bundle,
    /// The short id of the trusted key whose signature verified.
    pub signer: String,
}

pub(super) fn invalid(message: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidArgument(message.to_string())
}

fn refused(reason: impl std::fmt::Display) -> BackendError {
    invalid(format!("the bundle is refused: {reason}"))
}

fn failed(path: &Path, error: io::Error) -> BackendError {
    BackendError::Failed(format!("{}: {error}", path.display()))
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

/// What the signature check established.
#[derive(Debug)]
struct Signed {
    signer: String,
    /// The image's config and layers: all that may still arrive, each of this size.
    image_blobs: BTreeMap<Digest, u64>,
}

/// An upload being unpacked.
struct Receiver<'k> {
    dir: PathBuf,
    keys: &'k [PublicKey],
    seen: BTreeSet<PathBuf>,
    received: VerifiedBlobs,
    index_received: bool,
    signed: Option<Signed>,
}

/// Large enough that a 256 MiB blob is not a million small writes.
const COPY_BUFFER: usize = 256 * 1024;

impl<'k> Receiver<'k> {
    fn new(dir: &Path, keys: &'k [PublicKey]) -> Self {
        Receiver {
            dir: dir.to_owned(),
            keys,
            seen: BTreeSet::new(),
            received: VerifiedBlobs::new(),
            index_received: false,
            signed: None,
        }
    }

    fn entry(&mut self, mut entry: tar::Entry<'_, impl Read>) -> Result<(), BackendError> {
        let name = entry
            .path()
            .map_err(|e| invalid(format!("a bad name in the upload: {e}")))?
            .into_owned();
        let not_layout = || {
            invalid(format!(
                "{} is not a file of an OCI layout; refusing the upload",
                name.display()
            ))
        };
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
                return Err(invalid(format!(
                    "{} is a {other:?} entry; a layout holds plain files only",
                    name.display()
                )))
            }
        };
        let relative = file.relative();
        if !self.seen.insert(relative.clone()) {
            return Err(invalid(format!(
                "{} appears twice in the upload",
                relative.display()
            )));
        }
        let size = entry
            .header()
            .size()
            .map_err(|e| invalid(format!("a bad size for {}: {e}", name.display())))?;
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
                let (_, digest) = writer.finish();
                if digest != named {
                    return Err(refused(format!(
                        "the blob {named} does not match its name (its bytes are {digest})"
                    )));
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
    fn admit(&self, file: &LayoutFile, size: u64) -> Result<(), BackendError> {
        let LayoutFile::Blob(digest) = file else {
            if size > MAX_DOCUMENT_BYTES {
                return Err(refused(format!(
                    "{} is larger than {MAX_DOCUMENT_BYTES} bytes",
                    file.relative().display()
                )));
            }
            return Ok(());
        };
        match &self.signed {
            Some(signed) => match signed.image_blobs.get(digest) {
                Some(&expected) if expected == size => Ok(()),
                Some(&expected) => Err(refused(format!(
                    "the blob {digest} is {size} bytes, the signed manifest says {expected}"
                ))),
                None => Err(refused(format!(
                    "the blob {digest} is not part of the signed image"
                ))),
            },
            // The index is in, the signature not yet: only its documents may come first.
            None if self.index_received && size > MAX_DOCUMENT_BYTES => Err(refused(format!(
                "a {size}-byte blob ({digest}) came before the signature could be checked; \
                 the manifests, configs and signature come first"
            ))),
            None => Ok(()),
        }
    }

    /// Open the documents received so far and verify the signature. Until `last`, a document
    /// that has not arrived yet only postpones the check.
    fn check_signature(&mut self, last: bool) -> Result<(), BackendError> {
        let pending = |error: &BundleError| !last && not_here_yet(error);
        let bundle = match Bundle::open_with(&self.dir, None, self.received.clone()) {
            Ok(bundle) => bundle,
            Err(e) if pending(&e) => return Ok(()),
            Err(e) => return Err(refused(chain(&e))),
        };
        let verified = match slate_trust::verify(&bundle, self.keys) {
            Ok(verified) => verified,
            Err(TrustError::Bundle(e)) if pending(&e) => return Ok(()),
            Err(e) => return Err(refused(chain(&e))),
        };
        bundle
            .blob_ref(INSTALLER_ROLE)
            .map_err(|e| refused(chain(&e)))?;
        self.signed = Some(Signed {
            signer: verified.key_id.short(),
            image_blobs: bundle.image_blobs().iter().cloned().collect(),
        });
        Ok(())
    }

    fn finish(mut self) -> Result<Received, BackendError> {
        if self.signed.is_none() {
            if !self.index_received {
                return Err(refused("the upload has no index.json"));
            }
            self.check_signature(true)?;
        }
        let Some(signed) = self.signed else {
            return Err(refused("its signature could not be checked"));
        };
        if let Some((digest, _)) = signed
            .image_blobs
            .iter()
            .find(|(digest, size)| !self.received.contains(digest, **size))
        {
            return Err(refused(format!("the upload lacks the blob {digest}")));
        }
        let bundle =
            Bundle::open_with(&self.dir, None, self.received).map_err(|e| refused(chain(&e)))?;
        Ok(Received {
            bundle,
            signer: signed.signer,
        })
    }
}

/// Copy one entry's bytes to `out` (a file under `target`).
fn copy(
    entry: &mut impl Read,
    out: &mut impl Write,
    name: &Path,
    target: &Path,
) -> Result<(), BackendError> {
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = match entry.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(invalid(format!(
                    "the upload broke in {}: {e}",
                    name.display()
                )))
            }
        };
        out.write_all(&buf[..n]).map_err(|e| failed(target, e))?;
    }
}

/// Unpack and check the upload `body` into the empty directory `dir`, against `keys`.
pub(super) fn receive_into(
    dir: &Path,
    keys: &[PublicKey],
    body: &mut dyn Read,
) -> Result<Received, BackendError> {
    let mut archive = tar::Archive::new(body);
    let entries = archive
        .entries()
        .map_err(|e| invalid(format!("the upload is not a tar stream: {e}")))?;
    let mut receiver = Receiver::new(dir, keys);
    for entry in entries {
        let entry = entry.map_err(|e| invalid(format!("the upload broke: {e}")))?;
        receiver.entry(entry)?;
    }
    receiver.finish()
}

/// The blobs a received bundle's upload verified, kept for `plan` and the Upgrade sequence of
/// this boot. One bundle at a time, like the bundle directory.
static RECEIVED: Mutex<Option<(Digest, VerifiedBlobs)>> = Mutex::new(None);

pub(super) fn remember(id: &Digest, verified: VerifiedBlobs) {
    *RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((id.clone(), verified));
}

/// What the upload of bundle `id` verified in this process, if it was received since the boot.
pub(super) fn remembered(id: &Digest) -> VerifiedBlobs {
    RECEIVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .filter(|(received, _)| received == id)
        .map(|(_, verified)| verified.clone())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "receive_tests.rs"]
mod tests;
