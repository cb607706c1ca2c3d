//! `slate snapshot install-units`: step 8 on a systemd root (formats.md §12.7). A oneshot that
//! runs the health check and then commits; `OnFailure=` a oneshot that rolls back and reboots;
//! a manager drop-in arming the hardware watchdog, so a hang is reset and boot counting takes
//! over. Text only; the edge writes it.

use crate::SnapshotError;

pub const MARK_GOOD: &str = "slate-snapshot-mark-good.service";
pub const ROLLBACK: &str = "slate-snapshot-rollback.service";
/// Units live here, relative to the root.
pub const UNIT_DIR: &str = "etc/systemd/system";
/// The `enable` symlink: multi-user.target wants the mark-good unit.
pub const WANTS_DIR: &str = "etc/systemd/system/multi-user.target.wants";
pub const WATCHDOG_DROPIN: &str = "etc/systemd/system.conf.d/50-slate-watchdog.conf";
/// systemd's own "is this boot healthy" answer: exit 0 only when every unit started
/// (`running`); `degraded` (a failed unit) fails the check.
pub const DEFAULT_HEALTH_CHECK: &str = "/usr/bin/systemctl is-system-running --wait";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitsSpec {
    /// Absolute path of the slate binary the units run.
    pub slate: String,
    /// `--esp-disk` for commit and rollback.
    pub esp_disk: String,
    /// An `ExecStart=` command line; exit 0 = healthy.
    pub health_check: String,
    /// How long the health check may take before it counts as failed (a hang).
    pub timeout_secs: u32,
    /// `RuntimeWatchdogSec=`: the hardware watchdog resets a machine whose manager hangs.
    pub watchdog_secs: u32,
}

fn check(spec: &UnitsSpec) -> Result<(), SnapshotError> {
    let plain_path = |what: &str, p: &str| {
        if !p.starts_with('/')
            || p.chars().any(|c| {
                c.is_whitespace()
                    || c.is_control()
                    || c == '%'
                    || c == '"'
                    || c == '\''
                    || c == '\\'
            })
        {
            return Err(SnapshotError::Invalid(format!(
                "{what} {p:?} must be an absolute path without spaces, quotes, backslashes or %"
            )));
        }
        Ok(())
    };
    plain_path("the slate binary", &spec.slate)?;
    plain_path("the ESP disk", &spec.esp_disk)?;
    let hc = spec.health_check.trim();
    if hc.is_empty() || hc.chars().any(char::is_control) || !hc.starts_with('/') {
        return Err(SnapshotError::Invalid(format!(
            "health check {:?} must be one line starting with an absolute program path",
            spec.health_check
        )));
    }
    if !(10..=3600).contains(&spec.timeout_secs) || !(5..=600).contains(&spec.watchdog_secs) {
        return Err(SnapshotError::Invalid(
            "the health-check timeout must be 10-3600 s and the watchdog 5-600 s".into(),
        ));
    }
    Ok(())
}

/// What `install-units` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFiles {
    /// (path relative to the root, content).
    pub files: Vec<(String, String)>,
    /// The `enable` symlink: (link path relative to the root, target).
    pub wants_link: (String, String),
}

/// The unit files and the link that enables the mark-good unit.
pub fn units(spec: &UnitsSpec) -> Result<UnitFiles, SnapshotError> {
    check(spec)?;
    let UnitsSpec {
        slate,
        esp_disk,
        health_check,
        timeout_secs,
        watchdog_secs,
    } = spec;
    let health = health_check.trim().replace('%', "%%");
    let mark_good = format!(
        "# Written by `slate snapshot install-units` (docs/formats.md §12.7).
[Unit]
Description=slate: commit the booted snapshot once the system is healthy
After=multi-user.target
OnFailure={ROLLBACK}

[Service]
Type=oneshot
RemainAfterExit=yes
# A check that hangs is a failed check.
TimeoutStartSec={timeout_secs}
ExecStart={health}
ExecStart={slate} snapshot --esp-disk {esp_disk} commit

[Install]
WantedBy=multi-user.target
"
    );
    let rollback = format!(
        "# Written by `slate snapshot install-units` (docs/formats.md §12.7).
[Unit]
Description=slate: boot the previous snapshot next and reboot

[Service]
Type=oneshot
# warn: a mismatch is reported, and the machine still rolls back (refusing would loop).
ExecStart={slate} snapshot --esp-disk {esp_disk} rollback --verify-on-rollback warn
ExecStart=/usr/bin/systemctl --no-block reboot
"
    );
    let watchdog = format!(
        "# Written by `slate snapshot install-units`: a hung manager is reset by the hardware
# watchdog; boot counting then falls back (docs/formats.md §12.7).
[Manager]
RuntimeWatchdogSec={watchdog_secs}s
RebootWatchdogSec=10min
"
    );
    Ok(UnitFiles {
        files: vec![
            (format!("{UNIT_DIR}/{MARK_GOOD}"), mark_good),
            (format!("{UNIT_DIR}/{ROLLBACK}"), rollback),
            (WATCHDOG_DROPIN.to_owned(), watchdog),
        ],
        wants_link: (
            format!("{WANTS_DIR}/{MARK_GOOD}"),
            format!("/{UNIT_DIR}/{MARK_GOOD}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> UnitsSpec {
        UnitsSpec {
            slate: "/usr/bin/slate".into(),
            esp_disk: "/dev/vda".into(),
            health_check: DEFAULT_HEALTH_CHECK.into(),
            timeout_secs: 120,
            watchdog_secs: 30,
        }
    }

    #[test]
    fn units_name_their_commands() {
        let UnitFiles {
            files,
            wants_link: link,
        } = units(&spec()).unwrap();
        assert_eq!(files.len(), 3);
        assert!(files[0]
            .1
            .contains("ExecStart=/usr/bin/slate snapshot --esp-disk /dev/vda commit\n"));
        assert!(files[0]
            .1
            .contains("OnFailure=slate-snapshot-rollback.service\n"));
        assert!(files[0].1.contains("TimeoutStartSec=120\n"));
        assert!(files[1].1.contains("rollback --verify-on-rollback warn\n"));
        assert!(files[2].1.contains("RuntimeWatchdogSec=30s\n"));
        assert_eq!(
            link.1,
            "/etc/systemd/system/slate-snapshot-mark-good.service"
        );
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            UnitsSpec {
                slate: "slate".into(),
                ..spec()
            },
            UnitsSpec {
                esp_disk: "/dev/my disk".into(),
                ..spec()
            },
            UnitsSpec {
                health_check: "check\nExecStart=/bin/evil".into(),
                ..spec()
            },
            UnitsSpec {
                timeout_secs: 1,
                ..spec()
            },
            UnitsSpec {
                watchdog_secs: 0,
                ..spec()
            },
        ] {
            assert!(units(&bad).is_err(), "{bad:?}");
        }
    }
}
