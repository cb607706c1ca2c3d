//! The META partition: two Talos ADV copies, then unused space, then the legacy syslinux ADV.

use slate_disk::{Disk, DiskError};

use crate::adv::{Adv, AdvError, ADV_LEN};
use crate::legacy::{LegacyAdv, LEGACY_LEN};

/// The size Talos requires of a META partition.
pub const META_LEN: u64 = 1024 * 1024;
const COPY2_AT: u64 = ADV_LEN as u64;
const MIN_LEN: u64 = 2 * ADV_LEN as u64 + LEGACY_LEN as u64;

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("the META area is {0} bytes; it must hold two ADV copies and the legacy area ({MIN_LEN} bytes)")]
    TooSmall(u64),
    #[error("reading META")]
    Read(#[source] DiskError),
    #[error("writing META")]
    Write(#[source] DiskError),
    #[error(transparent)]
    Value(#[from] AdvError),
    /// Neither copy holds an ADV and the area is not blank: it may be another filesystem or a
    /// partition table, so nothing is written over it unless the caller says so.
    #[error(
        "this is not a META area: neither copy holds an ADV and it is not blank \
         (copy 1: {copy1}; copy 2: {copy2}); refusing to write over it \
         (`slate meta format` lays down an empty META deliberately, `--force` writes anyway)"
    )]
    Unrecognized { copy1: String, copy2: String },
}

/// Which copy the values were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Copy1,
    Copy2,
    /// Both copies are all zero (a partition that was never written): the store starts empty.
    Blank,
    /// Neither copy is valid and the area is not blank: read as empty, but not written unless
    /// [`MetaStore::overwrite_unrecognized`] says so.
    Unrecognized,
}

/// A tag as seen by a reader: Talos ADV tags shadow legacy ones of the same number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub tag: u8,
    pub value: &'a [u8],
    pub legacy: bool,
}

/// The META store over a disk holding exactly the META area (a partition view, or a raw file).
///
/// Changes are made in memory by [`set`](Self::set) and [`delete`](Self::delete) and reach the
/// disk only through [`flush`](Self::flush), so a refused change writes nothing.
#[derive(Debug)]
pub struct MetaStore<D> {
    disk: D,
    adv: Adv,
    legacy: Option<LegacyAdv>,
    source: Source,
    /// What each copy held when neither was valid (for [`MetaError::Unrecognized`]).
    unrecognized: Option<(String, String)>,
    overwrite: bool,
    warnings: Vec<String>,
}

impl<D: Disk> MetaStore<D> {
    /// Read META: copy 1 if valid, else copy 2, else empty with a warning. A store whose
    /// copies are neither valid nor blank reads as empty but refuses to [`flush`](Self::flush).
    pub fn open(disk: D) -> Result<Self, MetaError> {
        let len = check_len(&disk)?;
        let mut warnings = Vec::new();
        let mut unrecognized = None;
        let copy1 = disk.read_vec(0, ADV_LEN).map_err(MetaError::Read)?;
        let (adv, source) = match Adv::parse(&copy1) {
            Ok(adv) => (adv, Source::Copy1),
            Err(err1) => {
                let copy2 = disk.read_vec(COPY2_AT, ADV_LEN).map_err(MetaError::Read)?;
                match Adv::parse(&copy2) {
                    Ok(adv) => {
                        warnings.push(format!("META copy 1 is invalid ({err1}); using copy 2"));
                        (adv, Source::Copy2)
                    }
                    Err(_) if is_blank(&copy1) && is_blank(&copy2) => {
                        (Adv::default(), Source::Blank)
                    }
                    Err(err2) => {
                        let (held1, held2) =
                            (describe_copy(&copy1, &err1), describe_copy(&copy2, &err2));
                        warnings.push(format!(
                            "both META copies are invalid (copy 1: {held1}; copy 2: {held2}); \
                             reading as empty"
                        ));
                        unrecognized = Some((held1, held2));
                        (Adv::default(), Source::Unrecognized)
                    }
                }
            }
        };
        let tail = disk
            .read_vec(len - LEGACY_LEN as u64, LEGACY_LEN)
            .map_err(MetaError::Read)?;
        Ok(Self {
            legacy: LegacyAdv::parse(&tail),
            disk,
            adv,
            source,
            unrecognized,
            overwrite: false,
            warnings,
        })
    }

    /// [`open`](Self::open) for a change: refused at once, before the caller writes anything
    /// anywhere, when the area is not META ([`MetaError::Unrecognized`]).
    pub fn open_for_update(disk: D) -> Result<Self, MetaError> {
        let store = Self::open(disk)?;
        store.check_writable()?;
        Ok(store)
    }

    /// Allow [`flush`](Self::flush) over an area whose copies were neither valid nor blank
    /// (what each held is lost): `--force`, or a node rewriting the META partition it found
    /// by its own label and type.
    pub fn overwrite_unrecognized(&mut self) {
        self.overwrite = true;
    }

    /// `Err(Unrecognized)` when a flush would write over something that is not META.
    pub fn check_writable(&self) -> Result<(), MetaError> {
        match &self.unrecognized {
            Some((copy1, copy2)) if !self.overwrite => Err(MetaError::Unrecognized {
                copy1: copy1.clone(),
                copy2: copy2.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Lay down an empty META over the whole area (both copies, zeroed middle, empty legacy ADV)
    /// and flush. Used by install and image building on a partition that holds nothing yet.
    pub fn format(mut disk: D) -> Result<Self, MetaError> {
        let len = check_len(&disk)?;
        let empty = Adv::default().serialize();
        disk.write_at(0, &empty).map_err(MetaError::Write)?;
        disk.write_at(COPY2_AT, &empty).map_err(MetaError::Write)?;
        let zeros = vec![0u8; ADV_LEN];
        let mut at = 2 * ADV_LEN as u64;
        let tail_at = len - LEGACY_LEN as u64;
        while at < tail_at {
            let n = (tail_at - at).min(zeros.len() as u64) as usize;
            disk.write_at(at, &zeros[..n]).map_err(MetaError::Write)?;
            at += n as u64;
        }
        disk.write_at(tail_at, &LegacyAdv::empty_area())
            .map_err(MetaError::Write)?;
        disk.flush().map_err(MetaError::Write)?;
        Self::open(disk)
    }

    pub fn source(&self) -> Source {
        self.source
    }

    /// Problems met while reading (an invalid copy), for the caller to report.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The value of `tag`: the Talos ADV first, then the legacy ADV.
    pub fn get(&self, tag: u8) -> Option<&[u8]> {
        self.adv
            .get(tag)
            .or_else(|| self.legacy.as_ref().and_then(|l| l.get(tag)))
    }

    /// Every readable tag in ascending order.
    pub fn entries(&self) -> Vec<Entry<'_>> {
        let mut entries: Vec<Entry<'_>> = self
            .adv
            .tags()
            .map(|(tag, value)| Entry {
                tag,
                value,
                legacy: false,
            })
            .collect();
        if let Some(legacy) = &self.legacy {
            for (tag, value) in legacy.tags() {
                if self.adv.get(tag).is_none() {
                    entries.push(Entry {
                        tag,
                        value,
                        legacy: true,
                    });
                }
            }
        }
        entries.sort_by_key(|e| e.tag);
        entries
    }

    /// The Talos ADV as it will be written.
    pub fn adv(&self) -> &Adv {
        &self.adv
    }

    /// Set a value in memory; refused (nothing changes) when it does not fit.
    pub fn set(&mut self, tag: u8, value: impl Into<Vec<u8>>) -> Result<(), MetaError> {
        Ok(self.adv.set(tag, value.into())?)
    }

    /// Remove a value in memory; returns whether it was present. Legacy tags are read-only.
    pub fn delete(&mut self, tag: u8) -> bool {
        self.adv.delete(tag)
    }

    /// Write the values to disk: copy 1, flush, copy 2, flush. Each copy is complete and durable
    /// before the other is touched, so at every instant at least one copy is valid and holds
    /// either the old or the new tag set, whatever the device does with unflushed writes.
    pub fn flush(&mut self) -> Result<(), MetaError> {
        self.check_writable()?;
        let block = self.adv.serialize();
        for at in [0, COPY2_AT] {
            self.disk.write_at(at, &block).map_err(MetaError::Write)?;
            self.disk.flush().map_err(MetaError::Write)?;
        }
        self.source = Source::Copy1;
        self.unrecognized = None;
        Ok(())
    }

    pub fn into_disk(self) -> D {
        self.disk
    }
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// What an invalid, non-blank copy held: the parse error and its first bytes, which tell a
/// filesystem or partition table from a damaged ADV.
fn describe_copy(bytes: &[u8], err: &AdvError) -> String {
    if is_blank(bytes) {
        return "blank".into();
    }
    let head: String = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let nonzero = bytes.iter().filter(|&&b| b != 0).count();
    format!("{err}; {nonzero} non-zero bytes, starting {head}")
}

fn check_len(disk: &impl Disk) -> Result<u64, MetaError> {
    let len = disk.len();
    if len < MIN_LEN {
        return Err(MetaError::TooSmall(len));
    }
    Ok(len)
}
