//! The second record of the committed slot, `grub/slate-default.env` (docs/formats.md §4.3):
//! what slate says about it and about a damaged grubenv, and its writes. GRUB reads it only
//! when grubenv's `saved_entry` is not a slot id; commit and revert rewrite it after grubenv,
//! an upgrade brings a lagging one in line before it empties a slot.

use slate_bootspec::{GrubEnv, GrubEnvError};
use slate_disk::Disk;
use slate_esp::{GRUBENV_PATH, GRUB_DEFAULT_ENV_PATH};

use super::{config, Grub, GrubStatus};
use crate::parts::Result;

/// The warnings of a status: grubenv unreadable (and what GRUB does instead), the record
/// unreadable or lagging behind grubenv.
pub(super) fn warnings(
    env: &GrubEnv,
    env_error: Option<&GrubEnvError>,
    default_record: Option<&std::result::Result<GrubEnv, GrubEnvError>>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let record = default_record.and_then(|r| r.as_ref().ok());
    let record_says = record.and_then(|r| r.get_nonempty("saved_entry"));
    if let Some(err) = env_error {
        let record_text = match (default_record, record_says) {
            (Some(Ok(_)), Some(slot)) => {
                format!("grub.cfg takes saved_entry={slot} from {GRUB_DEFAULT_ENV_PATH}")
            }
            (Some(Ok(_)), None) => {
                format!("{GRUB_DEFAULT_ENV_PATH} names no slot either: GRUB starts the first entry")
            }
            (Some(Err(e)), _) => {
                format!(
                    "{GRUB_DEFAULT_ENV_PATH} is unreadable too ({e}): GRUB starts the first entry"
                )
            }
            (None, _) => format!(
                "there is no {GRUB_DEFAULT_ENV_PATH} (a disk imaged before slate kept one): \
                 GRUB starts the first entry"
            ),
        };
        warnings.push(format!(
            "{GRUBENV_PATH}: {err}: GRUB loads no slot from it; {record_text}; slate writes \
             nothing to the boot loader until grubenv is repaired"
        ));
    } else {
        match (default_record, record_says) {
            (Some(Err(e)), _) => warnings.push(format!(
                "{GRUB_DEFAULT_ENV_PATH}: {e}: should grubenv become unreadable, GRUB would \
                 start the first entry; the next commit rewrites it"
            )),
            (Some(Ok(_)), found) => {
                let saved = env.get_nonempty("saved_entry");
                if saved.is_some() && found != saved {
                    warnings.push(format!(
                        "{GRUB_DEFAULT_ENV_PATH} names {}, grubenv saved_entry={}: the next \
                         commit or upgrade brings the record in line",
                        found.unwrap_or("no slot"),
                        saved.unwrap_or_default()
                    ));
                }
            }
            (None, _) => {}
        }
    }
    warnings
}

impl<D: Disk> Grub<D> {
    /// Rewrite the second record, `grub/slate-default.env`, in place with a fresh block naming
    /// `slot` (flushed). Its 1024 bytes span two sectors, and `saved_entry` sits in the first:
    /// a torn write leaves the old or the new slot (the crash matrix replays it).
    pub(super) fn write_record(&mut self, slot: &str) -> Result<()> {
        super::write_block(
            &mut self.disk,
            self.source_date_epoch,
            GRUB_DEFAULT_ENV_PATH,
            &config::default_record(slot),
        )
    }

    /// The record rewritten to name `slot` if it is present and names something else (a disk
    /// imaged before the record existed keeps doing without it).
    pub(super) fn sync_record(&mut self, status: &GrubStatus, slot: &str) -> Result<()> {
        if status.default_record.is_some() && status.record_entry() != Some(slot) {
            self.write_record(slot)?;
        }
        Ok(())
    }
}
