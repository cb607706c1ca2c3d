//! The local file store (`docs/formats.md §8`): one record per group, `<dir>/<group>.json`
//! (`slate_fleetlock::record`), and `<dir>/.lock`, the file whose exclusive `flock` every
//! compare-and-swap holds. Several servers and `slate fleetlock release` on one machine may
//! share a directory.
//!
//! Write order of a swap, under the lock: read the record and compare its version; write the
//! new record to `.<group>.json.tmp`, fsync it, rename it over `<group>.json`, fsync the
//! directory. A reader (which takes no lock) sees the old record or the new one, whole; a
//! crash leaves the old or the new one, and at worst a stray temporary file that the next swap
//! overwrites. A swap that loses answers the record it read ([`Swap::LostTo`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use slate_fleetlock::record::MAX_RECORD_LEN;
use slate_fleetlock::store::Swap;
use slate_fleetlock::{
    encode_record, parse_record, GroupName, Semaphore, SemaphoreStore, StoreError, Version,
};

/// The lock file's name: a leading dot and no `.json`, so it is never taken for a group.
pub const LOCK_FILE: &str = ".lock";
const RECORD_SUFFIX: &str = ".json";

/// Semaphores in a directory.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    /// Directories named like a record (`<group>.json`), found when the store was opened.
    strays: Vec<PathBuf>,
}

impl FileStore {
    /// The store in `dir`, created (with its parents) if missing: what a server does.
    pub fn create(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| io_error(format!("creating {}", dir.display()), e))?;
        Self::open(dir)
    }

    /// An existing store: what the admin commands do, so that a mistyped path is an error
    /// rather than an empty store.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        slate_files::check_dir(dir, "the store")
            .map_err(|e| io_error("opening the store".into(), e))?;
        let mut store = FileStore {
            dir: dir.to_path_buf(),
            strays: Vec::new(),
        };
        store.strays = store.check_records()?;
        Ok(store)
    }

    /// Every group's record must be a regular file: one that is a FIFO would block its first
    /// read (a server then never listened, and said nothing), a device would be read without
    /// end. Refused by name when the store is opened, before any record is read (issue 44).
    /// A directory named like a record cannot block or grow a read: it is passed over (not a
    /// group) and returned, so that the caller can say so, rather than making `status` of every
    /// other group fail.
    fn check_records(&self) -> Result<Vec<PathBuf>, StoreError> {
        let strays = std::cell::RefCell::new(Vec::new());
        slate_files::files_in(&self.dir, "the group record", |path| {
            let record = is_record_name(path);
            if record && path.is_dir() {
                strays.borrow_mut().push(path.to_owned());
                return false;
            }
            record
        })
        .map_err(|e| io_error(format!("opening the store {}", self.dir.display()), e))?;
        let mut strays = strays.into_inner();
        strays.sort();
        Ok(strays)
    }

    /// Directories in the store named like a group's record, passed over (see
    /// [`FileStore::open`]): the caller warns about each.
    pub fn strays(&self) -> &[PathBuf] {
        &self.strays
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/<group>.json`. Group names match `^[a-zA-Z0-9.-]+$`: never a path separator.
    pub fn record_path(&self, group: &GroupName) -> PathBuf {
        self.dir.join(format!("{group}{RECORD_SUFFIX}"))
    }

    fn temp_path(&self, group: &GroupName) -> PathBuf {
        self.dir.join(format!(".{group}{RECORD_SUFFIX}.tmp"))
    }

    fn lock(&self) -> Result<Flock<File>, StoreError> {
        let path = self.dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusive) {
                Ok(guard) => return Ok(guard),
                // A signal interrupted the wait: wait again.
                Err((f, Errno::EINTR)) => file = f,
                Err((_, errno)) => {
                    return Err(io_error(
                        format!("locking {}", path.display()),
                        io::Error::from(errno),
                    ))
                }
            }
        }
    }

    fn write_record(&self, group: &GroupName, bytes: &[u8]) -> Result<(), StoreError> {
        let temp = self.temp_path(group);
        let target = self.record_path(group);
        let mut file =
            File::create(&temp).map_err(|e| io_error(format!("creating {}", temp.display()), e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error(format!("writing {}", temp.display()), e))?;
        drop(file);
        std::fs::rename(&temp, &target).map_err(|e| {
            io_error(
                format!("renaming {} to {}", temp.display(), target.display()),
                e,
            )
        })?;
        // The rename is durable only once the directory is.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error(format!("syncing {}", self.dir.display()), e))
    }
}

/// `<valid group>.json`.
fn is_record_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(RECORD_SUFFIX))
        .is_some_and(|g| GroupName::new(g).is_ok())
}

fn io_error(
    what: String,
    e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> StoreError {
    StoreError::backend(what, e)
}

impl SemaphoreStore for FileStore {
    fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
        let what = || format!("listing {}", self.dir.display());
        let mut groups = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| io_error(what(), e))? {
            let entry = entry.map_err(|e| io_error(what(), e))?;
            let name = entry.file_name();
            // Anything that is not `<valid group>.json` (the lock, temporaries, strays) is
            // not a group, and neither is a directory of such a name.
            if entry.path().is_dir() {
                continue;
            }
            let group = name
                .to_str()
                .and_then(|n| n.strip_suffix(RECORD_SUFFIX))
                .and_then(|g| GroupName::new(g).ok());
            if let Some(group) = group {
                groups.push(group);
            }
        }
        groups.sort();
        Ok(groups)
    }

    fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
        let path = self.record_path(group);
        // A regular file of at most the record's cap (a record changed into a FIFO since the
        // store was opened is refused, not waited on).
        let bytes = match slate_files::read_file_bounded(
            &path,
            MAX_RECORD_LEN as u64,
            "the group record",
        ) {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e @ slate_files::FileError::TooLarge { .. }) => {
                return Err(StoreError::Corrupt {
                    group: group.to_string(),
                    reason: e.to_string(),
                })
            }
            Err(e) => return Err(io_error(format!("loading group {group}"), e)),
        };
        let record = parse_record(&bytes).map_err(|e| StoreError::Corrupt {
            group: group.to_string(),
            reason: format!("{}: {e}", path.display()),
        })?;
        Ok(Some(record))
    }

    fn compare_and_swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<bool, StoreError> {
        Ok(matches!(self.swap(group, expected, new)?, Swap::Swapped(_)))
    }

    /// A lost swap answers the record it compared against: read under the lock, so nothing
    /// changed it in between, and the caller's retry needs no read of its own.
    fn swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<Swap, StoreError> {
        let guard = self.lock()?;
        let current = self.load(group)?;
        let version = current.as_ref().map(|(v, _)| *v);
        let swap = if version == expected {
            let next = match version {
                None => Version(1),
                Some(Version(v)) => Version(v.checked_add(1).ok_or_else(|| {
                    io_error(
                        format!("{}", self.record_path(group).display()),
                        io::Error::other("version counter exhausted"),
                    )
                })?),
            };
            self.write_record(group, &encode_record(next, new))?;
            Swap::Swapped(Some(next))
        } else {
            Swap::LostTo(current)
        };
        guard.unlock().map_err(|(_, errno)| {
            io_error(
                format!("unlocking {}", self.dir.join(LOCK_FILE).display()),
                io::Error::from(errno),
            )
        })?;
        Ok(swap)
    }
}

#[cfg(test)]
mod tests {
    use slate_fleetlock::{ClientId, Transition};

    use super::*;

    fn locked(s: &Semaphore, id: &str) -> Semaphore {
        match s.lock(&ClientId::new(id).unwrap(), 2).unwrap() {
            Transition::Changed(s) => s,
            Transition::Unchanged => panic!("unchanged"),
        }
    }

    #[test]
    fn swaps_compare_versions_and_persist() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::create(&dir.path().join("a/b")).unwrap();
        let g = GroupName::new("workers").unwrap();
        assert_eq!(store.load(&g).unwrap(), None);
        let one = locked(&Semaphore::new(2), "n1");
        assert!(!store.compare_and_swap(&g, Some(Version(1)), &one).unwrap());
        assert!(store.compare_and_swap(&g, None, &one).unwrap());
        assert!(
            !store.compare_and_swap(&g, None, &one).unwrap(),
            "no longer absent"
        );
        let two = locked(&one, "n2");
        assert!(store.compare_and_swap(&g, Some(Version(1)), &two).unwrap());
        assert!(
            !store.compare_and_swap(&g, Some(Version(1)), &one).unwrap(),
            "stale"
        );
        let again = FileStore::open(store.dir()).unwrap();
        assert_eq!(again.load(&g).unwrap(), Some((Version(2), two)));
        assert_eq!(
            std::fs::read_to_string(store.record_path(&g)).unwrap(),
            "{\"version\":2,\"semaphore\":{\"total_slots\":2,\"holders\":[\"n1\",\"n2\"]}}\n"
        );
        assert_eq!(again.groups().unwrap(), [g]);
    }

    #[test]
    fn strays_are_not_groups_and_corruption_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::create(dir.path()).unwrap();
        for name in [".lock", ".x.json.tmp", "a b.json", "notes.txt"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        std::fs::write(dir.path().join("bad.json"), "{\"version\":1}").unwrap();
        let bad = GroupName::new("bad").unwrap();
        assert_eq!(store.groups().unwrap(), std::slice::from_ref(&bad));
        let err = store.load(&bad).unwrap_err().to_string();
        assert!(err.contains("group bad is corrupt"), "{err}");
        // A swap never writes over a record it cannot read.
        assert!(store
            .compare_and_swap(&bad, Some(Version(1)), &Semaphore::new(1))
            .is_err());
        assert!(FileStore::open(&dir.path().join("missing")).is_err());
        assert!(FileStore::open(&dir.path().join("notes.txt")).is_err());
    }

    /// A lost swap answers the record it compared against (read under the lock), so the retry
    /// of a lock or unlock reads nothing; a swap that is made answers the version it wrote.
    #[test]
    fn a_lost_swap_answers_what_won() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::create(dir.path()).unwrap();
        let g = GroupName::new("workers").unwrap();
        assert_eq!(
            store
                .swap(&g, Some(Version(3)), &Semaphore::new(2))
                .unwrap(),
            Swap::LostTo(None),
            "absent"
        );
        let one = locked(&Semaphore::new(2), "n1");
        assert_eq!(
            store.swap(&g, None, &one).unwrap(),
            Swap::Swapped(Some(Version(1)))
        );
        let two = locked(&one, "n2");
        assert_eq!(
            store.swap(&g, Some(Version(1)), &two).unwrap(),
            Swap::Swapped(Some(Version(2)))
        );
        assert_eq!(
            store.swap(&g, Some(Version(1)), &one).unwrap(),
            Swap::LostTo(Some((Version(2), two.clone())))
        );
        assert_eq!(
            store.swap(&g, None, &one).unwrap(),
            Swap::LostTo(Some((Version(2), two)))
        );
    }
}
