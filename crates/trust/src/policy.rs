//! The update policy: may this node move to that bundle? Pure: a function of the bundle
//! manifest, facts about the node and the operator's `--allow-downgrade`.
//!
//! - The bundle's arch and variant must be the node's.
//! - A version is compared with UAPI version order (`slate_bootspec::compare_versions`, the
//!   order systemd-boot sorts entries by).
//! - Same version: allowed (a reinstall). Newer: allowed.
//! - Older: refused unless `allow_downgrade`.
//! - The version floor (META `VersionFloor`, when recorded) is absolute: a target below it is
//!   refused whatever the flag says, even when it is newer than the running version. With no
//!   floor recorded, a downgrade needs only `allow_downgrade`.

use std::cmp::Ordering;

use slate_bootspec::compare_versions;
use slate_bundle::BundleManifest;

/// What the policy needs to know about the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub arch: String,
    pub variant: String,
    /// The version the node runs now.
    pub running_version: String,
    /// META `VersionFloor`: the lowest version this node may ever be moved to.
    pub version_floor: Option<String>,
}

/// What kind of move an allowed update is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    Upgrade,
    Reinstall,
    Downgrade,
}

/// Why an update is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("the bundle is for arch {bundle}, this node is {node}")]
    WrongArch { bundle: String, node: String },
    #[error("the bundle is variant {bundle:?}, this node runs variant {node:?}")]
    WrongVariant { bundle: String, node: String },
    #[error("{target} is older than the running {running}; a downgrade needs --allow-downgrade")]
    Downgrade { target: String, running: String },
    #[error(
        "{target} is below this node's version floor {floor} (META VersionFloor); no update may \
         go below it, --allow-downgrade or not"
    )]
    BelowFloor { target: String, floor: String },
    #[error("the bundle's version is empty")]
    NoVersion,
}

/// May `node` move to `target`? See the module documentation for the rules.
pub fn check_update(
    target: &BundleManifest,
    node: &NodeFacts,
    allow_downgrade: bool,
) -> Result<UpdateKind, PolicyError> {
    if target.arch != node.arch {
        return Err(PolicyError::WrongArch {
            bundle: target.arch.clone(),
            node: node.arch.clone(),
        });
    }
    if target.variant != node.variant {
        return Err(PolicyError::WrongVariant {
            bundle: target.variant.clone(),
            node: node.variant.clone(),
        });
    }
    if target.version.is_empty() {
        return Err(PolicyError::NoVersion);
    }
    if let Some(floor) = &node.version_floor {
        if compare_versions(&target.version, floor) == Ordering::Less {
            return Err(PolicyError::BelowFloor {
                target: target.version.clone(),
                floor: floor.clone(),
            });
        }
    }
    match compare_versions(&target.version, &node.running_version) {
        Ordering::Greater => Ok(UpdateKind::Upgrade),
        Ordering::Equal => Ok(UpdateKind::Reinstall),
        Ordering::Less if allow_downgrade => Ok(UpdateKind::Downgrade),
        Ordering::Less => Err(PolicyError::Downgrade {
            target: target.version.clone(),
            running: node.running_version.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(version: &str) -> BundleManifest {
        serde_json::from_value(serde_json::json!({
            "name": "slate",
            "version": version,
            "arch": "amd64",
            "variant": "demo",
            "blobs": {},
        }))
        .unwrap()
    }

    fn node(running: &str, floor: Option<&str>) -> NodeFacts {
        NodeFacts {
            arch: "amd64".into(),
            variant: "demo".into(),
            running_version: running.into(),
            version_floor: floor.map(str::to_owned),
        }
    }

    #[test]
    fn upgrades_and_reinstalls_are_allowed() {
        let n = node("1.9.0", None);
        assert_eq!(
            check_update(&bundle("1.10.0"), &n, false),
            Ok(UpdateKind::Upgrade)
        );
        assert_eq!(
            check_update(&bundle("1.9.0"), &n, false),
            Ok(UpdateKind::Reinstall)
        );
        // UAPI order, not string order: 1.10 > 1.9, ~rc before the release.
        assert_eq!(
            check_update(&bundle("1.9.0~rc1"), &n, false),
            Err(PolicyError::Downgrade {
                target: "1.9.0~rc1".into(),
                running: "1.9.0".into()
            })
        );
    }

    #[test]
    fn downgrades_need_the_flag_and_respect_the_floor() {
        let no_floor = node("2.0.0", None);
        assert!(matches!(
            check_update(&bundle("1.0.0"), &no_floor, false),
            Err(PolicyError::Downgrade { .. })
        ));
        assert_eq!(
            check_update(&bundle("1.0.0"), &no_floor, true),
            Ok(UpdateKind::Downgrade)
        );
        let floored = node("2.0.0", Some("1.5.0"));
        assert_eq!(
            check_update(&bundle("1.5.0"), &floored, true),
            Ok(UpdateKind::Downgrade)
        );
        let err = check_update(&bundle("1.4.9"), &floored, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "1.4.9 is below this node's version floor 1.5.0 (META VersionFloor); no update may go \
             below it, --allow-downgrade or not"
        );
        // The floor binds even a move up from a version that is itself below it.
        let under = node("1.0.0", Some("1.5.0"));
        assert!(matches!(
            check_update(&bundle("1.2.0"), &under, false),
            Err(PolicyError::BelowFloor { .. })
        ));
        assert_eq!(
            check_update(&bundle("1.5.0"), &under, false),
            Ok(UpdateKind::Upgrade)
        );
    }

    #[test]
    fn arch_and_variant_must_match() {
        let mut other = bundle("2.0.0");
        other.arch = "arm64".into();
        assert_eq!(
            check_update(&other, &node("1.0.0", None), true)
                .unwrap_err()
                .to_string(),
            "the bundle is for arch arm64, this node is amd64"
        );
        let mut other = bundle("2.0.0");
        other.variant = "edge".into();
        assert_eq!(
            check_update(&other, &node("1.0.0", None), true)
                .unwrap_err()
                .to_string(),
            "the bundle is variant \"edge\", this node runs variant \"demo\""
        );
        assert_eq!(
            check_update(&bundle(""), &node("1.0.0", None), true),
            Err(PolicyError::NoVersion)
        );
    }
}
