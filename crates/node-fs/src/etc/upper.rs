//! The overlay's upper layer on STATE: made to belong to the booted version — created on the
//! first boot, left alone while the version stays, reset when it changes — in an order that a
//! power cut at any point cannot turn into a half upper recorded as current.

use std::fs::{self, File};
use std::io::{self, Read as _};
use std::os::unix::fs::{lchown, symlink, DirBuilderExt as _, MetadataExt as _, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::etc::hooks_due;

use super::{
    io_error, read_record, rename, replace_file, sync_dir, write_file, write_record, EtcError, ETC,
    HOOKS_RECORD, MACHINE_ID, UPPER, UPPER_NEXT, UPPER_OLD, VERSION_RECORD, WORK,
};

/// What became of the upper at this boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcChange {
    /// No version record: a fresh upper (the first boot on this STATE).
    FirstBoot,
    /// The upper belongs to the booted version: left as it is.
    Unchanged,
    /// The upper belonged to `from` (an upgrade, or a revert): replaced by a fresh one.
    Reset { from: String },
    /// The upper belongs to the booted version but its setup hooks never all succeeded on it
    /// (a hook failed, timed out, or the boot stopped during the run): replaced by a fresh one,
    /// so the hooks run again on the image's /etc and nothing a half run wrote stays.
    Unfinished,
}

/// What [`prepare_upper`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcPrepared {
    pub version: String,
    pub change: EtcChange,
    /// The node's machine ID (32 lower-case hex digits, without the newline).
    pub machine_id: String,
    /// It was generated at this boot (none, or none valid, was there).
    pub machine_id_generated: bool,
    /// Listed files carried into the fresh upper.
    pub kept: Vec<PathBuf>,
    /// Listed files the old upper did not hold (or held as something that is not a file,
    /// directory or symlink, such as a deletion's whiteout).
    pub missing: Vec<PathBuf>,
    /// Leftovers of an interrupted reset that were cleaned up first.
    pub recovered: Vec<String>,
    /// The setup hooks have not yet succeeded for this version on this upper.
    pub hooks_due: bool,
}

impl EtcPrepared {
    /// The console line for it: `/etc first boot at 1.0.0: machine-id … generated`,
    /// `/etc unchanged at 1.0.0`, `/etc reset from 1.0.0 to 2.0.0: kept machine-id, hostname`
    /// (then `; not in the old upper: …` for listed files it lacked).
    pub fn summary(&self) -> String {
        let head = match &self.change {
            EtcChange::FirstBoot => format!("/etc first boot at {}", self.version),
            EtcChange::Unchanged => format!("/etc unchanged at {}", self.version),
            EtcChange::Reset { from } => format!("/etc reset from {from} to {}", self.version),
            EtcChange::Unfinished => format!(
                "/etc reset again at {} (its setup hooks did not all succeed)",
                self.version
            ),
        };
        let list = |paths: &[PathBuf]| -> Vec<String> {
            paths.iter().map(|p| p.display().to_string()).collect()
        };
        let mut parts = Vec::new();
        let mut kept = list(&self.kept);
        if self.machine_id_generated {
            parts.push(format!("machine-id {} generated", self.machine_id));
        } else if self.change != EtcChange::Unchanged {
            kept.insert(0, MACHINE_ID.to_owned());
        }
        if !kept.is_empty() {
            parts.push(format!("kept {}", kept.join(", ")));
        }
        if !self.missing.is_empty() {
            parts.push(format!(
                "not in the old upper: {}",
                list(&self.missing).join(", ")
            ));
        }
        if parts.is_empty() {
            head
        } else {
            format!("{head}: {}", parts.join("; "))
        }
    }
}

/// Make `state_etc_dir`'s upper belong to `booted_version`: on the first boot a fresh upper with
/// a new machine ID; on a version change a fresh upper holding only the machine ID and the
/// `keep` files (relative to `/etc`) of the old one. Interrupted at any point, it leaves either
/// the old upper recorded (and the next call resets again) or the new one.
pub fn prepare_upper(
    state_etc_dir: &Path,
    booted_version: &str,
    keep: &[PathBuf],
) -> Result<EtcPrepared, EtcError> {
    prepare_upper_steps(state_etc_dir, booted_version, keep, &mut |_| false)
}

/// [`prepare_upper`], asking `stop` before each step of a reset whether to stop there (the
/// tests' simulated power cut; always `false` otherwise).
pub(super) fn prepare_upper_steps(
    dir: &Path,
    version: &str,
    keep: &[PathBuf],
    stop: &mut dyn FnMut(&'static str) -> bool,
) -> Result<EtcPrepared, EtcError> {
    if version.is_empty() || version.chars().any(char::is_control) {
        return Err(EtcError::InvalidVersion(version.to_owned()));
    }
    let keep = keep_list(keep)?;
    create_dir_all(dir)?;
    let recovered = recover(dir)?;
    let recorded = read_record(&dir.join(VERSION_RECORD))?;
    let upper = dir.join(UPPER);
    let current = recorded.as_deref() == Some(version) && upper.is_dir() && dir.join(WORK).is_dir();
    if current && !hooks_due(dir, version)? {
        let (machine_id, generated) = match read_machine_id(&upper)? {
            Some(id) => (id, false),
            // Deleted at run time: a node keeps having one.
            None => {
                let id = generate_machine_id()?;
                replace_file(&upper, MACHINE_ID, machine_id_text(&id).as_bytes(), 0o444)?;
                (id, true)
            }
        };
        return Ok(EtcPrepared {
            version: version.to_owned(),
            change: EtcChange::Unchanged,
            machine_id,
            machine_id_generated: generated,
            kept: Vec::new(),
            missing: Vec::new(),
            recovered,
            hooks_due: false,
        });
    }
    let change = match recorded {
        _ if current => EtcChange::Unfinished,
        None => EtcChange::FirstBoot,
        Some(from) => EtcChange::Reset { from },
    };
    let mut prepared = reset(dir, version, &keep, stop)?;
    prepared.change = change;
    prepared.recovered = recovered;
    Ok(prepared)
}

/// Undo what an interrupted reset left: an upper moved aside but not replaced is put back, and
/// the half-built or superseded uppers are removed.
fn recover(dir: &Path) -> Result<Vec<String>, EtcError> {
    let mut notes = Vec::new();
    let (upper, old, next) = (dir.join(UPPER), dir.join(UPPER_OLD), dir.join(UPPER_NEXT));
    if !exists(&upper)? && exists(&old)? {
        rename(&old, &upper)?;
        sync_dir(dir)?;
        notes.push(format!("{UPPER_OLD} put back as {UPPER}"));
    }
    for leftover in [old, next] {
        if exists(&leftover)? {
            remove_all(&leftover)?;
            notes.push(format!("{} removed", file_name(&leftover)));
        }
    }
    Ok(notes)
}

/// Replace the upper by a fresh one for `version`. The order makes every interruption safe:
/// 1. the hooks record goes (this upper's hooks must run again);
/// 2. `upper.next` is built and synced: the machine ID and the kept files of the old upper;
/// 3. the work directory is emptied (a new upper needs a clean one);
/// 4. `upper` → `upper.old`, `upper.next` → `upper`, directory synced ([`recover`] puts
///    `upper.old` back when interrupted between the two);
/// 5. the version record is replaced (temporary file, sync, rename, sync): only now is the new
///    upper current; before, the next boot resets again, from the new upper or the old one,
///    which hold the same machine ID and kept files;
/// 6. `upper.old` is removed.
fn reset(
    dir: &Path,
    version: &str,
    keep: &[PathBuf],
    stop: &mut dyn FnMut(&'static str) -> bool,
) -> Result<EtcPrepared, EtcError> {
    let mut step = |name: &'static str| match stop(name) {
        true => Err(EtcError::Interrupted(name)),
        false => Ok(()),
    };
    let (upper, next, work) = (dir.join(UPPER), dir.join(UPPER_NEXT), dir.join(WORK));

    step("removing the hooks record")?;
    remove_file_if_exists(&dir.join(HOOKS_RECORD))?;
    sync_dir(dir)?;

    step("building the new upper")?;
    make_dir(&next, 0o755)?;
    let (machine_id, generated) = match read_machine_id(&upper)? {
        Some(id) => (id, false),
        None => (generate_machine_id()?, true),
    };
    write_file(
        &next.join(MACHINE_ID),
        machine_id_text(&machine_id).as_bytes(),
        0o444,
    )?;
    step("copying the kept files")?;
    let (mut kept, mut missing) = (Vec::new(), Vec::new());
    for path in keep {
        if copy_kept(&upper, &next, path)? {
            kept.push(path.clone());
        } else {
            missing.push(path.clone());
        }
    }
    sync_tree(&next)?;

    step("emptying the work directory")?;
    if exists(&work)? {
        remove_all(&work)?;
    }
    make_dir(&work, 0o755)?;

    step("moving the old upper aside")?;
    if exists(&upper)? {
        rename(&upper, &dir.join(UPPER_OLD))?;
    }
    step("renaming the new upper")?;
    rename(&next, &upper)?;
    sync_dir(dir)?;

    step("recording the version")?;
    write_record(dir, VERSION_RECORD, version)?;

    step("removing the old upper")?;
    let old = dir.join(UPPER_OLD);
    if exists(&old)? {
        remove_all(&old)?;
    }
    Ok(EtcPrepared {
        version: version.to_owned(),
        change: EtcChange::FirstBoot,
        machine_id,
        machine_id_generated: generated,
        kept,
        missing,
        recovered: Vec::new(),
        hooks_due: true,
    })
}

/// `keep` checked and normalized: relative to `/etc` (a leading `/etc/` is accepted), plain
/// names only, without `machine-id` (always kept) and duplicates.
fn keep_list(keep: &[PathBuf]) -> Result<Vec<PathBuf>, EtcError> {
    let mut out: Vec<PathBuf> = Vec::new();
    for path in keep {
        let invalid = |reason| EtcError::InvalidKeep {
            path: path.clone(),
            reason,
        };
        let relative = path.strip_prefix(ETC).unwrap_or(path);
        if relative.as_os_str().is_empty() {
            return Err(invalid("it names no file"));
        }
        if !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(invalid(
                "only a path under /etc, without `.` or `..`, can be kept",
            ));
        }
        let relative = relative.to_path_buf();
        if relative != Path::new(MACHINE_ID) && !out.contains(&relative) {
            out.push(relative);
        }
    }
    Ok(out)
}

/// Copy `path` (relative) from the old upper to the new one, creating its parent directories
/// as the old upper has them. Symlinks are copied as links, never followed, in the path or in
/// a directory. `false` when the old upper has no such file, directory or symlink.
fn copy_kept(old: &Path, new: &Path, path: &Path) -> Result<bool, EtcError> {
    let mut from = old.to_path_buf();
    let mut to = new.to_path_buf();
    let mut components = path.components().peekable();
    while let Some(component) = components.next() {
        from.push(component);
        to.push(component);
        let Some(meta) = symlink_metadata(&from)? else {
            return Ok(false);
        };
        if components.peek().is_none() {
            return copy_entry(&from, &to, &meta);
        }
        if !meta.is_dir() {
            return Ok(false);
        }
        if !exists(&to)? {
            make_dir(&to, meta.mode())?;
            copy_owner(&to, &meta)?;
        }
    }
    Ok(false)
}

/// Copy one entry (recursively for a directory), syncing what it writes; `false` for a type
/// that is not copied (device nodes, whiteouts, sockets, FIFOs).
fn copy_entry(from: &Path, to: &Path, meta: &fs::Metadata) -> Result<bool, EtcError> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        let target = fs::read_link(from).map_err(io_error("read the link", from))?;
        symlink(&target, to).map_err(io_error("create the link", to))?;
    } else if kind.is_file() {
        let mut bytes = Vec::new();
        File::open(from)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(io_error("read", from))?;
        write_file(to, &bytes, meta.mode())?;
    } else if kind.is_dir() {
        // Writable while it is filled, its own mode after.
        make_dir(to, 0o700)?;
        let entries = fs::read_dir(from).map_err(io_error("list", from))?;
        for entry in entries {
            let entry = entry.map_err(io_error("list", from))?;
            if let Some(meta) = symlink_metadata(&entry.path())? {
                copy_entry(&entry.path(), &to.join(entry.file_name()), &meta)?;
            }
        }
        fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(io_error("set the mode of", to))?;
    } else {
        return Ok(false);
    }
    copy_owner(to, meta)?;
    Ok(true)
}

/// Give `path` `meta`'s owner when it differs (machined runs as root; a test does not need to).
fn copy_owner(path: &Path, meta: &fs::Metadata) -> Result<(), EtcError> {
    let now = fs::symlink_metadata(path).map_err(io_error("inspect", path))?;
    if (now.uid(), now.gid()) != (meta.uid(), meta.gid()) {
        lchown(path, Some(meta.uid()), Some(meta.gid())).map_err(io_error("chown", path))?;
    }
    Ok(())
}

/// The machine ID in `upper`, when it is a regular file holding a valid one.
fn read_machine_id(upper: &Path) -> Result<Option<String>, EtcError> {
    let path = upper.join(MACHINE_ID);
    match symlink_metadata(&path)? {
        Some(meta) if meta.is_file() => {}
        _ => return Ok(None),
    }
    let text = fs::read_to_string(&path).unwrap_or_default();
    let id = text.strip_suffix('\n').unwrap_or(&text);
    let valid = id.len() == 32
        && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && id.bytes().any(|b| b != b'0');
    Ok(valid.then(|| id.to_owned()))
}

fn machine_id_text(id: &str) -> String {
    format!("{id}\n")
}

/// A new machine ID: 128 random bits formatted as a version 4 UUID without dashes, as systemd
/// generates one.
fn generate_machine_id() -> Result<String, EtcError> {
    let source = Path::new("/dev/urandom");
    let mut bytes = [0u8; 16];
    File::open(source)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(io_error("read", source))?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Sync `path` and every directory beneath it (their entries; files are synced as written).
fn sync_tree(path: &Path) -> Result<(), EtcError> {
    for entry in fs::read_dir(path).map_err(io_error("list", path))? {
        let entry = entry.map_err(io_error("list", path))?;
        if entry
            .file_type()
            .map_err(io_error("inspect", &entry.path()))?
            .is_dir()
        {
            sync_tree(&entry.path())?;
        }
    }
    sync_dir(path)
}

fn make_dir(path: &Path, mode: u32) -> Result<(), EtcError> {
    fs::DirBuilder::new()
        .mode(mode & 0o7777)
        .create(path)
        .map_err(io_error("create the directory", path))?;
    // Exactly `mode`, whatever the umask.
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))
        .map_err(io_error("set the mode of", path))
}

fn create_dir_all(path: &Path) -> Result<(), EtcError> {
    fs::create_dir_all(path).map_err(io_error("create the directory", path))
}

fn remove_all(path: &Path) -> Result<(), EtcError> {
    fs::remove_dir_all(path).map_err(io_error("remove", path))
}

fn remove_file_if_exists(path: &Path) -> Result<(), EtcError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("remove", path)(e)),
        _ => Ok(()),
    }
}

fn symlink_metadata(path: &Path) -> Result<Option<fs::Metadata>, EtcError> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("inspect", path)(e)),
    }
}

fn exists(path: &Path) -> Result<bool, EtcError> {
    Ok(symlink_metadata(path)?.is_some())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
