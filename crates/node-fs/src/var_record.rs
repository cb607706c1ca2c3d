//! What init did with /var on a systemd image, for machined's `slate status`: written by init
//! to `/run/slate/var.json` (a tmpfs only init and root write) before it executes systemd,
//! read by `slate-machined.service`. On slate's own OS machined mounts /var itself and needs
//! no record.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where init leaves the record (on /run, which systemd keeps).
pub const VAR_RECORD: &str = "/run/slate/var.json";

/// /var at this boot, as init left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VarRecord {
    /// The mode in force (`persistent`, `ephemeral`, `tpm2`).
    pub mode: String,
    /// Whose mode it is: `machine configuration` or `image`.
    pub from: String,
    /// What init did: `formatted (blank)`, `formatted (ephemeral)`, `checked`, `mounted`, or
    /// `not mounted: locked`.
    pub prepared: String,
    /// A `tpm2` /var: inside LUKS2.
    #[serde(default)]
    pub encrypted: bool,
    /// How an encrypted /var was unlocked (`TPM (PCR sha256:7)`).
    #[serde(default)]
    pub unlocked: Option<String>,
    /// Why /var was refused (nothing written to EPHEMERAL; /var is a tmpfs for this boot and
    /// the node waits for its owner).
    #[serde(default)]
    pub locked: Option<String>,
}

impl VarRecord {
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let json = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        std::fs::write(path, json)
    }

    /// The record init left; `None` when there is none (an init older than the record).
    pub fn read(path: &Path) -> std::io::Result<Option<Self>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::VarRecord;

    #[test]
    fn a_record_reads_back_as_written_and_a_foreign_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/slate/var.json");
        assert_eq!(VarRecord::read(&path).unwrap(), None);
        let record = VarRecord {
            mode: "ephemeral".into(),
            from: "machine configuration".into(),
            prepared: "formatted (ephemeral)".into(),
            encrypted: false,
            unlocked: None,
            locked: None,
        };
        record.write(&path).unwrap();
        assert_eq!(VarRecord::read(&path).unwrap(), Some(record.clone()));
        let locked = VarRecord {
            mode: "tpm2".into(),
            encrypted: true,
            prepared: "not mounted: locked".into(),
            locked: Some("needs a TPM 2.0 and this machine has none".into()),
            ..record.clone()
        };
        locked.write(&path).unwrap();
        assert_eq!(VarRecord::read(&path).unwrap(), Some(locked));
        // A record of an init before tpm2 on this image: plain, unlocked by nothing.
        std::fs::write(
            &path,
            r#"{"mode":"ephemeral","from":"machine configuration","prepared":"formatted (ephemeral)"}"#,
        )
        .unwrap();
        assert_eq!(VarRecord::read(&path).unwrap(), Some(record));
        std::fs::write(
            &path,
            r#"{"mode":"x","from":"image","prepared":"y","extra":1}"#,
        )
        .unwrap();
        assert!(VarRecord::read(&path).is_err());
        std::fs::write(&path, "not json").unwrap();
        assert!(VarRecord::read(&path).is_err());
    }
}
