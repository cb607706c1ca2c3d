//! The Secure Boot keys a slate ESP enrols (`loader/keys/auto/db.auth`), read back: offline, the
//! one record of what the target's firmware trusts (docs/formats.md §11.4).

use std::io::{Read, Seek, SeekFrom};

use slate_disk::Disk;
use slate_esp::{session, SECURE_BOOT_DB_AUTH_PATH};

use crate::parts::{fat_err, invalid, Result};

/// A `db.auth` larger than this is not one slate wrote (one certificate is about 1 KiB).
const DB_AUTH_LIMIT: u64 = 1 << 20;

/// The ESP's `db.auth`, or `None` when the disk enrols no keys.
pub fn enrolled_db_auth<D: Disk>(disk: &D) -> Result<Option<Vec<u8>>> {
    let fs = session::mount_read_only(disk)?;
    let mut file = match fs.root_dir().open_file(SECURE_BOOT_DB_AUTH_PATH) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fat_err("opening", SECURE_BOOT_DB_AUTH_PATH)(e)),
    };
    let len = file
        .seek(SeekFrom::End(0))
        .and_then(|len| file.seek(SeekFrom::Start(0)).map(|_| len))
        .map_err(fat_err("reading", SECURE_BOOT_DB_AUTH_PATH))?;
    if len > DB_AUTH_LIMIT {
        return Err(invalid(format!(
            "{SECURE_BOOT_DB_AUTH_PATH} is {len} bytes, more than a db.auth slate writes"
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.read_to_end(&mut bytes)
        .map_err(fat_err("reading", SECURE_BOOT_DB_AUTH_PATH))?;
    Ok(Some(bytes))
}
