//! Opening files of a layout: regular files only. A FIFO would block the open (or the read)
//! forever, a device could be read without end, and a symbolic link points anywhere; all three
//! are refused with [`TransportError::NotRegularFile`] before a byte is read, never waited on.
//! (`slate_bundle` applies the same rule when it opens a bundle.)

use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use nix::fcntl::OFlag;

use crate::TransportError;

pub(crate) use slate_bundle::irregular_kind;

/// Open `path` for reading if it is a regular file. The link is not followed (`O_NOFOLLOW`) and
/// the open does not wait for a FIFO's writer (`O_NONBLOCK`, which changes nothing for a regular
/// file); what was opened is checked again, so a file swapped after the first look is refused
/// too. A missing file is the `Io` error with `NotFound`.
pub(crate) fn open_regular(path: &Path) -> Result<File, TransportError> {
    let refuse = |meta: &Metadata| {
        irregular_kind(meta).map(|kind| TransportError::NotRegularFile {
            path: path.to_owned(),
            kind,
        })
    };
    let meta = std::fs::symlink_metadata(path).map_err(TransportError::io(path))?;
    if let Some(refused) = refuse(&meta) {
        return Err(refused);
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW).bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // The name became a link between the look and the open.
            Some(code) if code == nix::errno::Errno::ELOOP as i32 => {
                TransportError::NotRegularFile {
                    path: path.to_owned(),
                    kind: "a symbolic link",
                }
            }
            _ => TransportError::io(path)(e),
        })?;
    let meta = file.metadata().map_err(TransportError::io(path))?;
    match refuse(&meta) {
        Some(refused) => Err(refused),
        None => Ok(file),
    }
}

/// Whether `path` is a regular file (not following a link); `false` when it is missing.
pub(crate) fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"bytes").unwrap();
        open_regular(&file).unwrap();
        assert!(is_regular(&file));

        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        for (path, kind) in [
            (&fifo, "a FIFO (named pipe)"),
            (&link, "a symbolic link"),
            (&socket, "a socket"),
            (&dir.path().to_owned(), "a directory"),
            (&"/dev/null".into(), "a character device"),
        ] {
            let err = open_regular(path).unwrap_err();
            assert!(
                matches!(&err, TransportError::NotRegularFile { kind: k, .. } if *k == kind),
                "{}: {err:?}",
                path.display()
            );
            assert!(!is_regular(path));
        }
        let missing = open_regular(&dir.path().join("missing")).unwrap_err();
        assert!(
            matches!(&missing, TransportError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{missing:?}"
        );
    }
}
