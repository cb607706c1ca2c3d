//! A systemd image (the initramfs holds `etc/slate/root-init` = `systemd`, written by the
//! imager for `[os] init = "systemd"`): after the switch to the root and before executing
//! systemd, init does what machined's Boot phases do on slate's own OS — STATE on
//! `/system/state` and EPHEMERAL on `/var` (formatted when blank, checked when due; afresh at
//! every boot when /var is ephemeral), then
//! `/etc` as the per-version overlay (reset when another version last wrote it, machine ID
//! kept). /var's mode and a `tpm2` /var's unlock are `systemd_var`'s. The setup hooks run later, from `slate-setup-hooks.service`. The logic is
//! `slate_node_fs`'s, shared with machined. docs/node.md, "A systemd image".

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use slate_host::{self as host, KmsgLogger};
use slate_node_fs::etc::USER_SETUP_HOOKS_CONFINE;
use slate_node_fs::etc::{mount_overlay, prepare_upper, state_etc_dir};
use slate_node_fs::hooks::{hooks_due, run_setup_hooks, HookDir, HookRun};
use slate_node_fs::var_record::{VarRecord, VAR_RECORD};
use slate_node_fs::volumes::{mount_volume, EPHEMERAL_MOUNT, STATE_LABEL, STATE_MOUNT};
use slate_node_fs::{ETC, SETUP_HOOKS_DIR, USER_SETUP_HOOKS_DIR};
use slate_profile::image_contract::ROOT_INIT;
use slate_profile::{VarMode, NODE_CONFIG_PATH};
use slate_sequencer::CancelToken;

use crate::systemd_var::{mount_var, var_choice, VarOutcome, LOCKED};

/// What the root's init is, by the initramfs' marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootInit {
    /// No marker: the root's init (machined) sets up the volumes and /etc itself.
    Slate,
    /// `systemd`: init sets them up before executing systemd.
    Systemd,
}

/// The marker's meaning; anything but `systemd` (one line) is refused rather than guessed.
pub fn parse_root_init(text: Option<&str>) -> Result<RootInit> {
    match text.map(|t| t.strip_suffix('\n').unwrap_or(t)) {
        None => Ok(RootInit::Slate),
        Some("systemd") => Ok(RootInit::Systemd),
        Some(other) => bail!("{ROOT_INIT} says {other:?}; this init knows only \"systemd\""),
    }
}

/// Read the marker (in the initramfs: before the switch).
pub fn root_init() -> Result<RootInit> {
    let text = match std::fs::read_to_string(ROOT_INIT) {
        Ok(text) => Some(text),
        Err(err) if err.kind() == ErrorKind::NotFound => None,
        Err(err) => return Err(err).with_context(|| format!("reading {ROOT_INIT}")),
    };
    parse_root_init(text.as_deref())
}

/// The booted version from os-release: `IMAGE_VERSION`, else `VERSION_ID` (as machined reads
/// it), quotes taken off.
pub fn os_release_version(text: &str) -> Option<String> {
    let value = |key: &str| {
        text.lines().find_map(|line| {
            let value = line.strip_prefix(key)?.strip_prefix('=')?;
            let value = value.trim().trim_matches('"').trim_matches('\'');
            (!value.is_empty()).then(|| value.to_owned())
        })
    };
    value("IMAGE_VERSION").or_else(|| value("VERSION_ID"))
}

/// The root's version, as its os-release names it (`/etc`'s, else `/usr/lib`'s).
fn booted_version() -> Result<String> {
    let os_release = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .context("reading the root's os-release")?;
    os_release_version(&os_release)
        .context("the root's os-release names no IMAGE_VERSION or VERSION_ID")
}

/// In the new root, before systemd: volumes, then /etc. Any failure is init's failure (logged,
/// reboot: boot counting takes over).
pub fn prepare(log: &KmsgLogger) -> Result<()> {
    // The kernel gives init no PATH; e2fsprogs are in /usr/sbin on Debian.
    std::env::set_var("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let line = |l: &str| log.info(l);
    let sleep = |d: Duration| {
        std::thread::sleep(d);
        true
    };
    mount_volume(STATE_LABEL, None, Path::new(STATE_MOUNT), &line, &sleep)
        .with_context(|| format!("mounting {STATE_LABEL} on {STATE_MOUNT}"))?;
    // After STATE: the machine configuration's `[var] mode` wins over the image's.
    let choice = var_choice(
        read_optional(&Path::new(STATE_MOUNT).join(slate_machine_config::STATE_PATH)),
        read_optional(Path::new(&format!("/{NODE_CONFIG_PATH}"))),
        &|warning| log.warn(warning),
    );
    let (mode, from) = (choice.mode, choice.from);
    let record = match mount_var(&choice, &line)? {
        VarOutcome::Mounted { prepared, unlocked } => {
            log.info(format_args!(
                "/var: {} (the {from}'s mode), {prepared}{}",
                mode.name(),
                unlocked
                    .as_deref()
                    .map(|how| format!(", unlocked by {how}"))
                    .unwrap_or_default()
            ));
            VarRecord {
                mode: mode.name().to_owned(),
                from: from.to_owned(),
                prepared: prepared.to_owned(),
                encrypted: mode == VarMode::Tpm2,
                unlocked,
                locked: None,
            }
        }
        VarOutcome::Locked(why) => {
            // Refused closed: nothing was written to EPHEMERAL. A tmpfs lets systemd and
            // slate-machined come up, so the node stays reachable, says why and waits
            // (no setup hooks, no commit).
            log.error(format_args!(
                "/var is locked: {why}; {EPHEMERAL_MOUNT} is a tmpfs for this boot and the \
                 node waits for its owner (slate status)"
            ));
            host::mount(
                "tmpfs",
                Path::new(EPHEMERAL_MOUNT),
                "tmpfs",
                host::MsFlags::MS_NOSUID | host::MsFlags::MS_NODEV,
                Some("mode=0755"),
            )
            .context("mounting a tmpfs on /var")?;
            VarRecord {
                mode: mode.name().to_owned(),
                from: from.to_owned(),
                prepared: LOCKED.to_owned(),
                encrypted: mode == VarMode::Tpm2,
                unlocked: None,
                locked: Some(why),
            }
        }
    };
    if let Err(err) = record.write(Path::new(VAR_RECORD)) {
        log.warn(format_args!("writing {VAR_RECORD}: {err}"));
    }
    let user_hooks = Path::new(USER_SETUP_HOOKS_DIR);
    if let Err(err) = std::fs::create_dir_all(user_hooks) {
        log.warn(format_args!("creating {USER_SETUP_HOOKS_DIR}: {err}"));
    }

    let version = booted_version()?;
    let dir = state_etc_dir();
    // No machine configuration is read here yet: only machine-id survives a reset.
    let prepared = prepare_upper(&dir, &version, &[]).context("preparing /etc's upper")?;
    for note in &prepared.recovered {
        log.info(format_args!(
            "/etc: an interrupted reset was cleaned up: {note}"
        ));
    }
    log.info(prepared.summary());
    mount_overlay(Path::new(ETC), &dir).context("mounting the /etc overlay")?;
    log.info(format_args!(
        "/etc is an overlay: the image's /etc below, {} above{}",
        dir.join("upper").display(),
        if prepared.hooks_due {
            "; setup hooks due (slate-setup-hooks.service)"
        } else {
            ""
        }
    ));
    host::record_milestone(Path::new(host::INIT_MILESTONES), "volumes and /etc ready");
    Ok(())
}

/// A file's text, `None` when it does not exist (any other error is the text's absence too,
/// said by [`var_mode`]'s caller through the parse that follows: an unreadable file is logged).
fn read_optional(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// How long one setup hook may run before it is killed (machined's limit too).
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// `slate setup-hooks`, run by `slate-setup-hooks.service` on a systemd image: the image's and
/// the user's setup hooks when they are due for the booted version (after a reset of /etc),
/// nothing otherwise. Each line goes to stdout (the journal and the console). An error — a
/// hook failed or timed out, a user's hook leads out of /var — fails the unit; `hooks.done` is
/// not written, so the next boot resets /etc again and runs them again.
pub fn setup_hooks() -> Result<()> {
    // The user's hooks are on /var: with /var locked (a tmpfs) they cannot run, and
    // `hooks.done` must not say they did. The unit fails, so boot-complete.target is not
    // reached and nothing blesses this boot while the node waits.
    match VarRecord::read(Path::new(VAR_RECORD)) {
        Ok(Some(VarRecord {
            locked: Some(why), ..
        })) => bail!("/var is locked ({why}): the setup hooks wait for it; none ran"),
        Ok(_) => {}
        Err(err) => println!("reading {VAR_RECORD}: {err}; running the hooks"),
    }
    let version = booted_version()?;
    let state_etc_dir = state_etc_dir();
    let out = |line: &str| println!("{line}");
    if !hooks_due(&state_etc_dir, &version)? {
        out(&format!(
            "setup hooks already ran for {version}: /etc was not reset at this boot"
        ));
        return Ok(());
    }
    let dirs = [
        HookDir::image(Path::new(SETUP_HOOKS_DIR)),
        HookDir::user(
            Path::new(USER_SETUP_HOOKS_DIR),
            Path::new(USER_SETUP_HOOKS_CONFINE),
        ),
    ];
    let run = HookRun {
        dirs: &dirs,
        timeout: HOOK_TIMEOUT,
        state_etc_dir: &state_etc_dir,
        version: &version,
    };
    run_setup_hooks(&run, out, &CancelToken::new())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_says_systemd_or_nothing() {
        assert_eq!(parse_root_init(None).unwrap(), RootInit::Slate);
        assert_eq!(
            parse_root_init(Some("systemd\n")).unwrap(),
            RootInit::Systemd
        );
        assert_eq!(parse_root_init(Some("systemd")).unwrap(), RootInit::Systemd);
        let err = parse_root_init(Some("openrc\n")).unwrap_err().to_string();
        assert!(err.contains("\"openrc\""), "{err}");
        assert!(parse_root_init(Some("systemd\nmore\n")).is_err());
    }

    #[test]
    fn the_version_is_image_version_else_version_id() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\n";
        assert_eq!(os_release_version(debian).as_deref(), Some("12"));
        let slate = "NAME=\"debian\"\nVERSION_ID=2.0.0\nIMAGE_VERSION=2.0.0-rc1\n";
        assert_eq!(os_release_version(slate).as_deref(), Some("2.0.0-rc1"));
        assert_eq!(os_release_version("IMAGE_VERSION=\nNAME=x\n"), None);
        assert_eq!(os_release_version("IMAGE_VERSION_X=1\n"), None);
    }
}
