//! The file store's record of one group (`docs/formats.md §8`): the semaphore in airlock's
//! layout and the version that compare-and-swap compares, in one JSON document so that a
//! rename replaces both at once:
//!
//! ```json
//! {"version":3,"semaphore":{"total_slots":2,"holders":["node-a"]}}
//! ```

use serde::Deserialize;
use thiserror::Error;

use crate::semaphore::{RawSemaphore, Semaphore, SemaphoreError, MAX_SEMAPHORE_LEN};
use crate::store::Version;

/// The semaphore's cap plus room for the wrapper.
pub const MAX_RECORD_LEN: usize = MAX_SEMAPHORE_LEN + 256;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("{len} bytes, at most {MAX_RECORD_LEN} are allowed")]
    TooLarge { len: usize },
    #[error("not a semaphore record: {0}")]
    Json(String),
    #[error("version 0: versions start at 1")]
    VersionZero,
    #[error(transparent)]
    Semaphore(#[from] SemaphoreError),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRecord {
    version: u64,
    semaphore: RawSemaphore,
}

/// Parses a record strictly (the semaphore as [`Semaphore::parse`] does).
pub fn parse_record(bytes: &[u8]) -> Result<(Version, Semaphore), RecordError> {
    if bytes.len() > MAX_RECORD_LEN {
        return Err(RecordError::TooLarge { len: bytes.len() });
    }
    let raw: RawRecord =
        serde_json::from_slice(bytes).map_err(|e| RecordError::Json(e.to_string()))?;
    if raw.version == 0 {
        return Err(RecordError::VersionZero);
    }
    Ok((
        Version(raw.version),
        Semaphore::try_from_raw(raw.semaphore)?,
    ))
}

/// The record's bytes, one line.
pub fn encode_record(version: Version, semaphore: &Semaphore) -> Vec<u8> {
    format!(
        "{{\"version\":{},\"semaphore\":{}}}\n",
        version.0,
        semaphore.to_json()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ClientId;
    use crate::semaphore::Transition;

    #[test]
    fn round_trip_and_layout() {
        let Ok(Transition::Changed(s)) =
            Semaphore::new(2).lock(&ClientId::new("node-a").unwrap(), 2)
        else {
            panic!("lock failed")
        };
        let bytes = encode_record(Version(3), &s);
        assert_eq!(
            bytes,
            b"{\"version\":3,\"semaphore\":{\"total_slots\":2,\"holders\":[\"node-a\"]}}\n"
        );
        assert_eq!(parse_record(&bytes), Ok((Version(3), s)));
    }

    #[test]
    fn refused_records() {
        for (bytes, text) in [
            (
                &br#"{"version":0,"semaphore":{"total_slots":1,"holders":[]}}"#[..],
                "version 0",
            ),
            (
                br#"{"semaphore":{"total_slots":1,"holders":[]}}"#,
                "missing field `version`",
            ),
            (
                br#"{"version":1,"semaphore":{"total_slots":1,"holders":[]},"x":1}"#,
                "unknown field",
            ),
            (
                br#"{"version":1,"semaphore":{"total_slots":0,"holders":["a"]}}"#,
                "1 holders but only 0 slots",
            ),
            (b"{\"version\":1,", "not a semaphore record"),
        ] {
            let err = parse_record(bytes).unwrap_err().to_string();
            assert!(err.contains(text), "{err}");
        }
    }
}
