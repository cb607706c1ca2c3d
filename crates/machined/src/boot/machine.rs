//! The node's machine configuration on STATE, its identity, and what applying a new
//! configuration does to the running node.
//!
//! STATE layout (under `base::paths::STATE_MOUNT`):
//! - `config/machine.toml` (0600): the document as written by the installer or `apply-config`;
//!   `config/machine.toml.previous`: the one it replaced.
//! - `pki/node.key` (0600): made here on the first boot, never sent anywhere; `pki/node.crt`:
//!   issued from the configuration's CA; `pki/identity`: the CA fingerprint and names it was
//!   issued for, so a change of either re-issues it.

use std::path::Path;
use std::sync::atomic::Ordering;

use slate_api::{ApplyConfigRequest, ApplyConfigResult, ApplyMode, BackendError, ConfigView};
use slate_machine_config::{MachineConfig, Parsed, PREVIOUS_STATE_PATH, STATE_PATH};

use crate::base::files::{write_atomically, write_if_changed};
use crate::base::node::Node;
use crate::base::paths::state_dir;

/// The stored configuration, parsed (and migrated); `None` when there is none.
pub fn load(state: &Path) -> Result<Option<Parsed>, String> {
    let path = state.join(STATE_PATH);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    slate_machine_config::parse(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What `slate status` says is unsafe about `config` as it runs: a key on this node's disk
/// that signs for others. Loud, since such a configuration is accepted at boot (refusing it
/// would strand the node) but refused by every writer.
pub fn warnings(config: &MachineConfig) -> Vec<String> {
    slate_machine_config::trust_findings(config)
        .into_iter()
        .map(|finding| {
            format!(
                "INSECURE machine configuration: {finding}; {}",
                slate_machine_config::trust::HOW_TO_FIX
            )
        })
        .collect()
}

/// Store a validated document, keeping the one it replaces as `.previous`.
pub fn store(state: &Path, text: &str) -> std::io::Result<()> {
    let path = state.join(STATE_PATH);
    if let Ok(old) = std::fs::read(&path) {
        write_atomically(&state.join(PREVIOUS_STATE_PATH), &old, 0o600)?;
    }
    write_atomically(&path, text.as_bytes(), 0o600)
}

/// The serving certificate and key for `config`, made or re-issued as needed. Returns
/// (certificate PEM, key PEM, whether it was issued now).
pub fn identity(
    state: &Path,
    config: &MachineConfig,
    addresses: &[String],
) -> Result<(String, String, bool), String> {
    let pki = state.join("pki");
    let key_path = pki.join("node.key");
    let key = match std::fs::read_to_string(&key_path) {
        Ok(key) => key,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = slate_api::generate_key_pem().map_err(|e| e.to_string())?;
            write_atomically(&key_path, key.as_bytes(), 0o600)
                .map_err(|e| format!("writing {}: {e}", key_path.display()))?;
            key
        }
        Err(e) => return Err(format!("reading {}: {e}", key_path.display())),
    };
    let mut names = vec![config.node.name.clone(), config.hostname().to_owned()];
    names.extend(addresses.iter().cloned());
    names.extend(config.api.extra_sans.iter().cloned());
    let names = slate_api::serving_names(&names);
    let ca = slate_api::fingerprint(&config.api.ca_cert).map_err(|e| e.to_string())?;
    let wanted = format!("ca {ca}\nnames {}\n", names.join(" "));
    let (cert_path, record_path) = (pki.join("node.crt"), pki.join("identity"));
    let issued_for = std::fs::read_to_string(&record_path).unwrap_or_default();
    if issued_for == wanted {
        if let Ok(cert) = std::fs::read_to_string(&cert_path) {
            return Ok((cert, key, false));
        }
    }
    let cert = slate_api::issue_serving_cert(&config.api.ca_cert, &config.api.ca_key, &key, &names)
        .map_err(|e| format!("issuing the serving certificate: {e}"))?;
    write_atomically(&cert_path, cert.as_bytes(), 0o644)
        .and_then(|()| write_atomically(&record_path, wanted.as_bytes(), 0o644))
        .map_err(|e| format!("writing {}: {e}", cert_path.display()))?;
    Ok((cert, key, true))
}

/// Set the kernel hostname (and /etc/hostname, when /etc is writable).
pub fn set_hostname(node: &Node, hostname: &str) -> Result<(), String> {
    std::fs::write("/proc/sys/kernel/hostname", hostname)
        .map_err(|e| format!("setting the hostname: {e}"))?;
    if let Err(e) = write_if_changed(
        Path::new("/etc/hostname"),
        format!("{hostname}\n").as_bytes(),
        0o644,
    ) {
        node.journal
            .info(format_args!("/etc/hostname not written: {e}"));
    }
    node.journal.info(format_args!("hostname {hostname}"));
    Ok(())
}

/// Write the files the configuration places into /etc.
pub fn write_etc_files(etc: &Path, config: &MachineConfig) -> Result<Vec<String>, String> {
    let mut written = Vec::new();
    for file in &config.etc.files {
        let path = etc.join(&file.path);
        write_if_changed(&path, file.content.as_bytes(), file.mode)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        written.push(file.path.clone());
    }
    Ok(written)
}

/// Everything in effect right now, for status.
pub fn read_machine_id() -> Option<String> {
    std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// `GET /v1/config`.
pub fn show(node: &Node) -> Result<ConfigView, BackendError> {
    let parsed = node
        .machine
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or_else(|| BackendError::Unsupported("the node has no machine configuration".into()))?;
    let config = serde_json::to_value(parsed.config.redacted())
        .map_err(|e| BackendError::Failed(e.to_string()))?;
    Ok(ConfigView {
        config,
        migrated_from: parsed.migrated_from,
        pending_reboot: node.machine.pending_reboot.load(Ordering::SeqCst),
    })
}

/// Validate a document as `apply-config` must before writing it: the crate's rules, a key
/// that signs for this node only, and a serving certificate actually issued from its CA.
pub fn check(text: &str) -> Result<Parsed, BackendError> {
    let parsed = slate_machine_config::parse_for_writing(text).map_err(|e| {
        BackendError::InvalidArgument(format!("the machine configuration is refused: {e}"))
    })?;
    // The node's services with the image's, against this root's programs.
    let image = crate::boot::health::load_config(Path::new(crate::boot::health::NODE_CONFIG))
        .map_err(|e| BackendError::Failed(format!("{e:#}")))?;
    crate::boot::services::merged(
        &image.services,
        &parsed.config.services,
        &crate::boot::services::has_program,
    )
    .map_err(|e| {
        BackendError::InvalidArgument(format!(
            "the machine configuration is refused: services: {e}"
        ))
    })?;
    if let Some(drain) = &parsed.config.drain {
        let program = Path::new(&drain.command[0]);
        if !crate::boot::services::has_program(program) {
            return Err(BackendError::InvalidArgument(format!(
                "the machine configuration is refused: drain.command: this node holds no \
                 executable {}",
                program.display()
            )));
        }
    }
    let key = slate_api::generate_key_pem().map_err(|e| BackendError::Failed(e.to_string()))?;
    let api = &parsed.config.api;
    slate_api::issue_serving_cert(
        &api.ca_cert,
        &api.ca_key,
        &key,
        std::slice::from_ref(&parsed.config.node.name),
    )
    .map_err(|e| {
        BackendError::InvalidArgument(format!(
            "api.ca_cert/api.ca_key cannot issue a certificate: {e}"
        ))
    })?;
    Ok(parsed)
}

/// `POST /v1/config` on a configured node.
pub fn apply(node: &Node, req: ApplyConfigRequest) -> Result<ApplyConfigResult, BackendError> {
    let parsed = check(&req.config)?;
    let Some(current) = node.machine.current() else {
        return Err(BackendError::Unsupported(
            "the node has no machine configuration loaded yet".into(),
        ));
    };
    let change = slate_machine_config::change(&current, &parsed.config);
    let result = |outcome: &str| ApplyConfigResult {
        changed: change.changed.clone(),
        reboot_required: change.reboot_required,
        outcome: outcome.to_owned(),
    };
    if req.dry_run {
        return Ok(result("dry-run"));
    }
    if change.changed.is_empty() {
        return Ok(result("unchanged"));
    }
    if req.mode == ApplyMode::NoReboot && change.reboot_required {
        return Err(BackendError::InvalidArgument(format!(
            "{} cannot change without a reboot; nothing was written (use --mode reboot, staged or auto)",
            change.changed.join(", ")
        )));
    }
    let reboot =
        req.mode == ApplyMode::Reboot || (req.mode == ApplyMode::Auto && change.reboot_required);
    // Taken before writing, so a reboot that cannot start (another sequence runs) writes nothing.
    let guard = if reboot {
        Some(
            node.lock
                .try_lock(slate_sequencer::SequenceKind::Reboot)
                .map_err(|e| BackendError::Locked(e.to_string()))?,
        )
    } else {
        None
    };
    store(&state_dir(), &req.config)
        .map_err(|e| BackendError::Failed(format!("writing the machine configuration: {e}")))?;
    node.journal.info(format_args!(
        "machine configuration written ({}); mode {:?}",
        change.changed.join(", "),
        req.mode
    ));
    if let Some(guard) = guard {
        node.machine.pending_reboot.store(true, Ordering::SeqCst);
        node.request(crate::base::node::Request::Reboot(
            slate_sequencer::RebootMode::Default,
            guard,
        ))
        .map_err(BackendError::Failed)?;
        return Ok(result("rebooting"));
    }
    if req.mode == ApplyMode::Staged || change.reboot_required {
        node.machine.pending_reboot.store(true, Ordering::SeqCst);
        return Ok(result("staged"));
    }
    apply_live(node, &current, &parsed.config).map_err(BackendError::Failed)?;
    node.machine.set(parsed);
    Ok(result("applied"))
}

/// The changes that take effect without a reboot.
fn apply_live(node: &Node, old: &MachineConfig, new: &MachineConfig) -> Result<(), String> {
    if old.hostname() != new.hostname() {
        set_hostname(node, new.hostname())?;
    }
    if old.etc != new.etc {
        let written = write_etc_files(Path::new("/etc"), new)?;
        node.journal.info(format_args!(
            "/etc files from the configuration: {}",
            written.join(" ")
        ));
    }
    // Before the Boot sequence's `services` phase there is nothing to change: it starts the
    // set of the configuration it reads then.
    if old.services != new.services {
        if let Some(running) = node.services.get() {
            let image =
                crate::boot::health::load_config(Path::new(crate::boot::health::NODE_CONFIG))
                    .map_err(|e| format!("{e:#}"))?;
            let services = crate::boot::services::merged(
                &image.services,
                &new.services,
                &crate::boot::services::has_program,
            )
            .map_err(|e| format!("services: {e}"))?;
            running.replace(services);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared-CA shape slate wrote before issue 36 (still booted, never written).
    const FIXTURE: &str = include_str!("../../../machine-config/tests/fixtures/node-v1.toml");
    /// What `slate gen config` writes now: the node's own name-constrained CA.
    const OWN_CA: &str = include_str!("../../../machine-config/tests/fixtures/node-v1-own-ca.toml");

    #[test]
    fn the_identity_is_made_once_and_reissued_when_its_names_change() {
        let dir = tempfile::tempdir().unwrap();
        let config = slate_machine_config::parse(FIXTURE).unwrap().config;
        let addresses = vec!["10.0.2.15".to_owned()];
        let (cert, key, issued) = identity(dir.path(), &config, &addresses).unwrap();
        assert!(issued);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("pki/node.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Same names, same CA: kept as it is.
        let again = identity(dir.path(), &config, &addresses).unwrap();
        assert_eq!(again, (cert.clone(), key.clone(), false));
        // A new address: re-issued for the same key.
        let moved = identity(dir.path(), &config, &["10.0.2.16".to_owned()]).unwrap();
        assert!(moved.2);
        assert_ne!(moved.0, cert);
        assert_eq!(moved.1, key);
        let record = std::fs::read_to_string(dir.path().join("pki/identity")).unwrap();
        assert!(
            record.contains("names node1 node1.example.net 10.0.2.16 node1.lab localhost"),
            "{record}"
        );
        // A new hostname too.
        let mut renamed = config.clone();
        renamed.node.hostname = Some("other".into());
        assert!(
            identity(dir.path(), &renamed, &["10.0.2.16".to_owned()])
                .unwrap()
                .2
        );
    }

    #[test]
    fn check_refuses_what_the_crate_refuses_and_names_the_field() {
        let err = check(&FIXTURE.replace("[node]\n", "[node]\nnmae = 1\n")).unwrap_err();
        assert!(
            matches!(&err, BackendError::InvalidArgument(m) if m.contains("node.nmae")),
            "{err}"
        );
        let err = check(FIXTURE).unwrap_err();
        assert!(
            matches!(&err, BackendError::InvalidArgument(m)
                if m.contains("no node may hold a key that signs for others")),
            "{err}"
        );
        assert!(check(OWN_CA).is_ok());
        let drain = |program: &str| format!("{OWN_CA}\n[drain]\ncommand = [\"{program}\"]\n");
        assert!(check(&drain("/bin/sh")).is_ok());
        let err = check(&drain("/nonexistent/cordon")).unwrap_err();
        assert!(
            err.to_string()
                .contains("drain.command: this node holds no executable /nonexistent/cordon"),
            "{err}"
        );
        assert!(!warnings(&slate_machine_config::parse(FIXTURE).unwrap().config).is_empty());
        assert!(warnings(&slate_machine_config::parse(OWN_CA).unwrap().config).is_empty());
    }

    /// Under the node's own CA the serving certificate names what the CA permits: the node,
    /// not the address DHCP gave it nor the loopback names; and it is served with its CA.
    #[test]
    fn the_serving_certificate_names_what_the_nodes_ca_permits() {
        let dir = tempfile::tempdir().unwrap();
        let config = slate_machine_config::parse(OWN_CA).unwrap().config;
        let (cert, _, _) = identity(dir.path(), &config, &["10.0.2.15".to_owned()]).unwrap();
        let blocks: Vec<_> = x509_parser::pem::Pem::iter_from_buffer(cert.as_bytes())
            .map(|p| p.unwrap())
            .collect();
        assert_eq!(blocks.len(), 2, "the certificate, then its issuing CA");
        let (_, leaf) = x509_parser::parse_x509_certificate(&blocks[0].contents).unwrap();
        let names: Vec<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, ["DNSName(node1)"]);
    }

    #[test]
    fn store_keeps_the_previous_document() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), "one").unwrap();
        store(dir.path(), "two").unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read(STATE_PATH), "two");
        assert_eq!(read(PREVIOUS_STATE_PATH), "one");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join(STATE_PATH))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(load(dir.path()).unwrap_err().contains("machine.toml"));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(load(empty.path()).unwrap(), None);
    }
}

#[cfg(test)]
mod service_tests {
    const OWN_CA: &str = include_str!("../../../machine-config/tests/fixtures/node-v1-own-ca.toml");

    #[test]
    fn a_configuration_whose_services_this_root_cannot_run_is_refused() {
        let with = |command: &str| {
            format!("{OWN_CA}\n[[services]]\nname = \"web\"\ncommand = [\"{command}\"]\n")
        };
        let parsed = super::check(&with("/bin/sh")).expect("/bin/sh is here");
        assert_eq!(parsed.config.services[0].name, "web");
        let err = super::check(&with("/no/such/program"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "services: service \"web\": command: the image holds no executable /no/such/program"
            ),
            "{err}"
        );
        let cycle = format!(
            "{OWN_CA}\n[[services]]\nname = \"a\"\ncommand = [\"/bin/sh\"]\ndepends_on = [\"b\"]\n\
             [[services]]\nname = \"b\"\ncommand = [\"/bin/sh\"]\ndepends_on = [\"a\"]\n"
        );
        let err = super::check(&cycle).unwrap_err().to_string();
        assert!(err.contains("in a circle: a -> b -> a"), "{err}");
    }
}
