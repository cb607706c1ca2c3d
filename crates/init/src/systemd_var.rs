//! /var on a systemd image (docs/node.md, "/var modes" and "A systemd image"): its mode chosen
//! as machined chooses it on slate's own OS, then EPHEMERAL mounted in that mode before systemd
//! starts — a `tpm2` one opened through `slate_node_fs::var_crypt` with the root's own
//! cryptsetup and tpm2-tools, the same volume, token and recovery key as machined's. What
//! cannot be opened is refused closed: nothing written to EPHEMERAL, a tmpfs on /var for this
//! boot so that systemd and slate-machined come up, and init's record says the node waits.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};
use slate_machine_config::{RecoveryKey, RECOVERY_KEY_STATE_PATH};
use slate_node_fs::var_crypt::{self, CryptError, Recovery, Setting};
use slate_node_fs::volumes::{
    mount_device_as, mount_volume_as, wait_for_partition, VolumeError, EPHEMERAL_LABEL,
    EPHEMERAL_MOUNT, STATE_MOUNT,
};
use slate_profile::{VarMode, NODE_CONFIG_PATH};

/// /var's mode at this boot, whose it is, and where a new `tpm2` volume's recovery key goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarChoice {
    pub mode: VarMode,
    /// `machine configuration` or `image`.
    pub from: &'static str,
    /// The machine configuration's `[var] recovery_key` (the image has none).
    pub recovery_key: RecoveryKey,
}

/// The machine configuration's `[var] mode` (on STATE) wins over the image's
/// (`/etc/slate/node.toml`), as machined decides on slate's own OS. A document that cannot be
/// read or parsed is warned about and skipped: the next in line decides, and with neither /var
/// stays persistent — the mode that loses nothing.
pub fn var_choice(
    machine: Result<Option<String>, String>,
    image: Result<Option<String>, String>,
    warn: &dyn Fn(&str),
) -> VarChoice {
    let machine = machine.and_then(|text| {
        text.map(|t| {
            slate_machine_config::parse(&t)
                .map(|p| (p.config.var_mode(), p.config.recovery_key()))
                .map_err(|e| format!("the machine configuration: {e}"))
        })
        .transpose()
    });
    let image = image.and_then(|text| {
        text.map(|t| {
            slate_profile::NodeConfig::parse(&t)
                .map(|c| c.var.map(|v| v.mode))
                .map_err(|e| format!("the image's {NODE_CONFIG_PATH}: {e}"))
        })
        .transpose()
        .map(Option::flatten)
    });
    let machine = match machine {
        Ok(found) => found,
        Err(why) => {
            warn(&format!("{why}; its [var] mode is not used"));
            None
        }
    };
    let recovery_key = machine.map(|(_, key)| key).unwrap_or_default();
    if let Some(mode) = machine.and_then(|(mode, _)| mode) {
        return VarChoice {
            mode,
            from: "machine configuration",
            recovery_key,
        };
    }
    let mode = match image {
        Ok(mode) => mode,
        Err(why) => {
            warn(&format!("{why}; its [var] mode is not used"));
            None
        }
    };
    VarChoice {
        mode: mode.unwrap_or_default(),
        from: "image",
        recovery_key,
    }
}

/// What became of /var.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarOutcome {
    /// Mounted: what was done before (`formatted (blank)`, `checked`, …) and, encrypted, how
    /// it was unlocked.
    Mounted {
        prepared: &'static str,
        unlocked: Option<String>,
    },
    /// Refused with nothing written to EPHEMERAL: why, and what the owner can do.
    Locked(String),
}

/// Where a new `tpm2` volume's recovery key goes (machined's mapping, over init's STATE).
pub fn recovery_destination(key: RecoveryKey) -> Recovery {
    match key {
        RecoveryKey::Console => Recovery::Log,
        RecoveryKey::State => Recovery::File(Path::new(STATE_MOUNT).join(RECOVERY_KEY_STATE_PATH)),
        RecoveryKey::None => Recovery::None,
    }
}

/// EPHEMERAL on /var as `choice` says. A refusal (a volume this machine's TPM does not open,
/// no TPM, a LUKS volume under a plain mode) is [`VarOutcome::Locked`]; anything else that
/// fails is init's failure.
pub fn mount_var(choice: &VarChoice, line: &dyn Fn(&str)) -> Result<VarOutcome> {
    let sleep = |d: Duration| {
        std::thread::sleep(d);
        true
    };
    let target = Path::new(EPHEMERAL_MOUNT);
    if choice.mode != VarMode::Tpm2 {
        let afresh = choice.mode == VarMode::Ephemeral;
        return match mount_volume_as(EPHEMERAL_LABEL, None, target, afresh, line, &sleep) {
            Ok(prepared) => Ok(VarOutcome::Mounted {
                prepared,
                unlocked: None,
            }),
            Err(err @ VolumeError::Encrypted { .. }) => Ok(VarOutcome::Locked(err.to_string())),
            Err(err) => {
                Err(err).with_context(|| format!("mounting {EPHEMERAL_LABEL} on {EPHEMERAL_MOUNT}"))
            }
        };
    }
    let part = wait_for_partition(EPHEMERAL_LABEL, None, &sleep)
        .with_context(|| format!("finding {EPHEMERAL_LABEL}"))?;
    let recovery = recovery_destination(choice.recovery_key);
    let opened = match var_crypt::open(
        &part.device,
        EPHEMERAL_LABEL,
        &Setting::node(),
        &recovery,
        line,
    ) {
        Ok(opened) => opened,
        Err(CryptError::Refused(why)) => return Ok(VarOutcome::Locked(why)),
        Err(err) => {
            return Err(err).with_context(|| {
                format!(
                    "opening {EPHEMERAL_LABEL} ({}) as a tpm2 /var",
                    part.device.display()
                )
            })
        }
    };
    let prepared = mount_device_as(EPHEMERAL_LABEL, &opened.device, target, false, line)
        .with_context(|| format!("mounting {} on {EPHEMERAL_MOUNT}", opened.device.display()))?;
    Ok(VarOutcome::Mounted {
        prepared,
        unlocked: Some(opened.how),
    })
}

/// What init's record says of a /var it refused (`slate status`'s words on slate's own OS).
pub const LOCKED: &str = "not mounted: locked";

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINE: &str = include_str!("../../machine-config/tests/fixtures/node-v1.toml");

    fn choice(mode: VarMode, from: &'static str, recovery_key: RecoveryKey) -> VarChoice {
        VarChoice {
            mode,
            from,
            recovery_key,
        }
    }

    #[test]
    fn the_machine_configurations_var_mode_wins_and_a_bad_document_is_skipped() {
        let warned = std::cell::RefCell::new(Vec::new());
        let warn = |w: &str| warned.borrow_mut().push(w.to_owned());
        let machine = |mode: &str| Ok(Some(format!("{MACHINE}\n[var]\nmode = \"{mode}\"\n")));
        let image = |mode: &str| Ok(Some(format!("[var]\nmode = \"{mode}\"\n")));
        assert_eq!(
            var_choice(machine("ephemeral"), image("persistent"), &warn),
            choice(
                VarMode::Ephemeral,
                "machine configuration",
                RecoveryKey::Console
            )
        );
        assert_eq!(
            var_choice(Ok(Some(MACHINE.into())), image("ephemeral"), &warn),
            choice(VarMode::Ephemeral, "image", RecoveryKey::Console)
        );
        assert_eq!(
            var_choice(Ok(None), Ok(None), &warn),
            choice(VarMode::Persistent, "image", RecoveryKey::Console)
        );
        assert!(warned.borrow().is_empty(), "{:?}", warned.borrow());
        // A machine configuration that does not parse: the image decides, and it is said.
        assert_eq!(
            var_choice(machine("sometimes"), image("ephemeral"), &warn),
            choice(VarMode::Ephemeral, "image", RecoveryKey::Console)
        );
        assert_eq!(
            var_choice(Err("reading x: EIO".into()), Ok(None), &warn),
            choice(VarMode::Persistent, "image", RecoveryKey::Console)
        );
        let warned = warned.borrow();
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(
            warned[0].starts_with("the machine configuration: "),
            "{}",
            warned[0]
        );
        assert!(warned[1].starts_with("reading x: EIO"), "{}", warned[1]);
    }

    #[test]
    fn the_recovery_key_setting_is_the_machine_configurations_whoever_chose_tpm2() {
        let warn = |w: &str| panic!("{w}");
        let machine = |var: &str| Ok(Some(format!("{MACHINE}\n[var]\n{var}\n")));
        // The image asks for tpm2; the node says where its recovery key goes.
        assert_eq!(
            var_choice(
                machine("recovery_key = \"state\""),
                Ok(Some("[var]\nmode = \"tpm2\"\n".into())),
                &warn
            ),
            choice(VarMode::Tpm2, "image", RecoveryKey::State)
        );
        assert_eq!(
            var_choice(
                machine("mode = \"tpm2\"\nrecovery_key = \"none\""),
                Ok(None),
                &warn
            ),
            choice(VarMode::Tpm2, "machine configuration", RecoveryKey::None)
        );
        assert_eq!(
            recovery_destination(RecoveryKey::State),
            Recovery::File("/system/state/recovery/var.key".into())
        );
        assert_eq!(recovery_destination(RecoveryKey::Console), Recovery::Log);
        assert_eq!(recovery_destination(RecoveryKey::None), Recovery::None);
    }
}
