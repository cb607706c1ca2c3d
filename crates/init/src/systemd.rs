//! A systemd image (the initramfs holds `etc/slate/root-init` = `systemd`, written by the
//! imager for `[os] init = "systemd"`): after the switch to the root and before executing
//! systemd, init does what machined's Boot phases do on slate's own OS — STATE on
//! `/system/state` and EPHEMERAL on `/var` (formatted when blank, checked when due; afresh at
//! every boot when /var is ephemeral), then
//! `/etc` as the per-version overlay (reset when another version last wrote it, machine ID
//! kept). The setup hooks run later, from `slate-setup-hooks.service`. The logic is
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
use slate_node_fs::volumes::{
    mount_volume, mount_volume_as, EPHEMERAL_LABEL, EPHEMERAL_MOUNT, STATE_LABEL, STATE_MOUNT,
};
use slate_node_fs::{ETC, SETUP_HOOKS_DIR, USER_SETUP_HOOKS_DIR};
use slate_profile::image_contract::ROOT_INIT;
use slate_profile::{VarMode, NODE_CONFIG_PATH};
use slate_sequencer::CancelToken;

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
    let (mode, from) = var_mode(
        read_optional(&Path::new(STATE_MOUNT).join(slate_machine_config::STATE_PATH)),
        read_optional(Path::new(&format!("/{NODE_CONFIG_PATH}"))),
        &|warning| log.warn(warning),
    );
    let prepared = if mode == VarMode::Tpm2 {
        // Refused closed: never a plain /var where an encrypted one was asked for, and never a
        // write to EPHEMERAL, which may hold an encrypted volume. A tmpfs lets systemd and
        // slate-machined come up, so the node stays reachable and says why.
        log.warn(format_args!(
            "[var] mode = \"tpm2\" (the {from}'s) is not available on a systemd image yet: \
             {EPHEMERAL_LABEL} is left untouched and {EPHEMERAL_MOUNT} is a tmpfs for this boot"
        ));
        host::mount(
            "tmpfs",
            Path::new(EPHEMERAL_MOUNT),
            "tmpfs",
            host::MsFlags::MS_NOSUID | host::MsFlags::MS_NODEV,
            Some("mode=0755"),
        )
        .context("mounting a tmpfs on /var")?;
        TPM2_REFUSED
    } else {
        mount_volume_as(
            EPHEMERAL_LABEL,
            None,
            Path::new(EPHEMERAL_MOUNT),
            mode == VarMode::Ephemeral,
            &line,
            &sleep,
        )
        .with_context(|| format!("mounting {EPHEMERAL_LABEL} on {EPHEMERAL_MOUNT}"))?
    };
    log.info(format_args!(
        "/var: {} (the {from}'s mode), {prepared}",
        mode.name()
    ));
    let record = VarRecord {
        mode: mode.name().to_owned(),
        from: from.to_owned(),
        prepared: prepared.to_owned(),
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

/// What init did with /var when a `tpm2` /var was asked for on a systemd image.
const TPM2_REFUSED: &str =
    "refused: tpm2 is not available on a systemd image; EPHEMERAL untouched, /var a tmpfs";

/// A file's text, `None` when it does not exist (any other error is the text's absence too,
/// said by [`var_mode`]'s caller through the parse that follows: an unreadable file is logged).
fn read_optional(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// /var's mode at this boot and whose it is: the machine configuration's `[var] mode` (on
/// STATE) wins over the image's (`/etc/slate/node.toml`), as machined decides on slate's own
/// OS. A document that cannot be read or parsed is warned about and skipped: the next in line
/// decides, and with neither /var stays persistent — the mode that loses nothing.
fn var_mode(
    machine: Result<Option<String>, String>,
    image: Result<Option<String>, String>,
    warn: &dyn Fn(&str),
) -> (VarMode, &'static str) {
    let machine = machine.and_then(|text| {
        text.map(|t| {
            slate_machine_config::parse(&t)
                .map(|p| p.config.var_mode())
                .map_err(|e| format!("the machine configuration: {e}"))
        })
        .transpose()
        .map(Option::flatten)
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
    let choose = |found: Result<Option<VarMode>, String>| match found {
        Ok(mode) => mode,
        Err(why) => {
            warn(&format!("{why}; its [var] mode is not used"));
            None
        }
    };
    if let Some(mode) = choose(machine) {
        return (mode, "machine configuration");
    }
    (choose(image).unwrap_or_default(), "image")
}

/// How long one setup hook may run before it is killed (machined's limit too).
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// `slate setup-hooks`, run by `slate-setup-hooks.service` on a systemd image: the image's and
/// the user's setup hooks when they are due for the booted version (after a reset of /etc),
/// nothing otherwise. Each line goes to stdout (the journal and the console). An error — a
/// hook failed or timed out, a user's hook leads out of /var — fails the unit; `hooks.done` is
/// not written, so the next boot resets /etc again and runs them again.
pub fn setup_hooks() -> Result<()> {
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
    #[test]
    fn the_machine_configurations_var_mode_wins_and_a_bad_document_is_skipped() {
        let warned = std::cell::RefCell::new(Vec::new());
        let warn = |w: &str| warned.borrow_mut().push(w.to_owned());
        const MACHINE: &str = include_str!("../../machine-config/tests/fixtures/node-v1.toml");
        let machine = |mode: &str| Ok(Some(format!("{MACHINE}\n[var]\nmode = \"{mode}\"\n")));
        let image = |mode: &str| Ok(Some(format!("[var]\nmode = \"{mode}\"\n")));
        assert_eq!(
            var_mode(machine("ephemeral"), image("persistent"), &warn),
            (VarMode::Ephemeral, "machine configuration")
        );
        assert_eq!(
            var_mode(Ok(Some(MACHINE.into())), image("ephemeral"), &warn),
            (VarMode::Ephemeral, "image")
        );
        assert_eq!(
            var_mode(Ok(None), Ok(None), &warn),
            (VarMode::Persistent, "image")
        );
        assert!(warned.borrow().is_empty(), "{:?}", warned.borrow());
        // A machine configuration that does not parse: the image decides, and it is said.
        assert_eq!(
            var_mode(machine("sometimes"), image("ephemeral"), &warn),
            (VarMode::Ephemeral, "image")
        );
        assert_eq!(
            var_mode(Err("reading x: EIO".into()), Ok(None), &warn),
            (VarMode::Persistent, "image")
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
}
