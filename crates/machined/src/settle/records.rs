//! The records machined keeps in META for the next boot and shows in its status: the last
//! failed boot (`LastBootFailure`), the last return to an older version (`LastRollback`), the
//! pinned versions (`PinnedVersions`). Read once at boot; written by `transaction.rs`.

use slate_meta::tags;

use crate::base::node::Node;

/// Load the records from META values (`get` by tag) into `node`; the lines to log.
pub fn load<'a>(node: &Node, get: impl Fn(u8) -> Option<&'a [u8]>) -> Vec<String> {
    let mut log = Vec::new();
    if let Some(failure) = get(tags::LAST_BOOT_FAILURE) {
        match serde_json::from_slice::<slate_api::Failure>(failure) {
            Ok(failure) => {
                log.push(format!(
                    "the last failed boot was {}: {}",
                    failure.version, failure.reason
                ));
                *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure);
            }
            Err(err) => log.push(format!("META LastBootFailure is not readable: {err}")),
        }
    }
    if let Some(rollback) = get(tags::LAST_ROLLBACK) {
        match serde_json::from_slice::<slate_api::RollbackRecord>(rollback) {
            Ok(record) => {
                *node.last_rollback.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
            }
            Err(err) => log.push(format!("META LastRollback is not readable: {err}")),
        }
    }
    if let Some(pins) = get(tags::PINNED_VERSIONS) {
        match slate_meta::pins::parse_pinned(pins) {
            Ok(pins) => *node.pinned.lock().unwrap_or_else(|p| p.into_inner()) = pins,
            Err(err) => log.push(format!("META PinnedVersions: {err}")),
        }
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_loaded_and_unreadable_ones_reported() {
        let journal = std::sync::Arc::new(crate::base::journal::Journal::new(
            slate_host::KmsgLogger::stderr("test"),
        ));
        let (node, _requests) = Node::new(journal, "");
        let rollback = br#"{"from":"3.0.0","to":"1.0.0","reason":"r","time":7}"#;
        let log = load(&node, |tag| match tag {
            tags::LAST_ROLLBACK => Some(&rollback[..]),
            tags::PINNED_VERSIONS => Some(&b"1.0.0,2.0.0"[..]),
            tags::LAST_BOOT_FAILURE => Some(&b"{not json"[..]),
            _ => None,
        });
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(
            log[0].contains("LastBootFailure is not readable"),
            "{log:?}"
        );
        let record = node.last_rollback.lock().unwrap().clone().unwrap();
        assert_eq!((record.from.as_str(), record.time), ("3.0.0", 7));
        assert_eq!(*node.pinned.lock().unwrap(), ["1.0.0", "2.0.0"]);
    }
}
