//! A node's own identity and configuration (issue 12): certificates, first-boot /etc and setup
//! hooks, `apply-config`.

use super::*;

/// `slate boot explain --disk` as JSON.
pub(super) fn explain_disk(slate: &Path, disk: &Path) -> Result<serde_json::Value> {
    let text = output(
        Command::new(slate)
            .args(["boot", "explain", "--output", "json", "--disk"])
            .arg(disk),
    )?;
    Ok(serde_json::from_str(&text)?)
}

/// What [`node_identity`] saw.
pub(super) struct Identity {
    pub(super) machine_id: String,
    pub(super) summary: String,
}

/// The console line (without its prefixes) that contains `text`.
pub(super) fn said_line(boot: &Running, text: &str) -> Result<String> {
    let serial = boot.serial();
    let line = serial.lines().find(|l| l.contains(text)).with_context(|| {
        format!(
            "expected {text:?} on the console; it ended with:\n{}",
            crate::vm::tail(&serial, 40)
        )
    })?;
    Ok(line
        .split_once("): ")
        .map_or(line, |(_, rest)| rest)
        .trim()
        .to_owned())
}

/// The setup hooks this boot ran, in order (`setup hook NAME ok`).
pub(super) fn hook_order(boot: &Running) -> Result<Vec<String>> {
    Ok(boot
        .serial()
        .lines()
        .filter_map(|l| l.split_once("setup hook ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.strip_suffix(')').and(rest.split_once(" ok (")))
        .map(|(name, _)| name.to_owned())
        .collect())
}

/// The serving certificate's fingerprint this boot logged.
pub(super) fn fingerprint(boot: &Running) -> Result<String> {
    let line = said_line(boot, "API identity: serving certificate sha256 ")?;
    Ok(line
        .split("sha256 ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_owned())
}

/// Issue 12 on a freshly installed, configured v1: its own identity (a second node installed
/// from the same bundle answers with another certificate; a client of another CA is refused),
/// the first boot's /etc and setup hooks, `apply-config` (live hostname change; a change that
/// needs a reboot and a malformed document refused, nothing written), and /etc surviving a
/// reboot.
pub(super) fn node_identity(
    prepared: &Prepared,
    boot: &Running,
    node: &Node,
    work: &Path,
) -> Result<Identity> {
    let slate = &prepared.slate;
    let first = said_line(boot, "/etc first boot at 1.0.0: machine-id ")?;
    let machine_id = first
        .rsplit("machine-id ")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned();
    ensure!(
        hook_order(boot)? == ["10-stamp", "20-check"],
        "v1's setup hooks in order"
    );
    let status = node.status()?;
    ensure!(
        status["machine_id"] == machine_id.as_str() && status["node_name"] == "node1",
        "status: {status}"
    );
    let fp1 = fingerprint(boot)?;

    // A second node from the same bundle: its own key, its own certificate.
    let disk2 = work.join("node2.raw");
    fs::File::create(&disk2)?.set_len(256 << 20)?;
    let config2 = node_config(slate, work, "node2")?;
    output(
        Command::new(slate)
            .args(["installer", "install", "--disk"])
            .arg(&disk2)
            .arg("--bundle")
            .arg(work.join("bundle-v1"))
            .arg("--trusted-keys")
            .arg(demo_keys())
            .arg("--config")
            .arg(&config2),
    )?;
    // node2 as an older slate configured it: one CA for its serving certificate and its
    // clients (issue 36); it is migrated, and stolen, below.
    let shared = stolen::plant_shared_ca(slate, &disk2, work)?;
    let mut vm2 = Vm::new(&disk2, &work.join("vm-node2"))?;
    let boot2 = running(&mut vm2)?;
    let fp2 = fingerprint(&boot2)?;
    let old_clients = Prepared {
        slate: prepared.slate.clone(),
        pki: shared.clients.clone(),
    };
    let node2 = Node {
        prepared: &old_clients,
        port: vm2.api_port,
        name: "node2".into(),
    };
    let status2 = node2.status()?;
    let stolen = stolen::stolen_node_and_migration(
        prepared,
        stolen::Victims {
            node1: node,
            node1_boot: boot,
            disk2: &disk2,
            vm2: &mut vm2,
            boot2,
        },
        shared,
        work,
    )?;
    ensure!(
        fp1 != fp2,
        "two nodes from one bundle share a certificate ({fp1})"
    );
    ensure!(
        status2["node_name"] == "node2" && status2["machine_id"] != machine_id.as_str(),
        "the second node: {status2}"
    );

    // A client whose CA is another: the node is not trusted by it, nor it by the node.
    let other = work.join("other-pki");
    let _ = fs::remove_dir_all(&other);
    run(Command::new(slate)
        .args(["gen", "certs", "--out"])
        .arg(&other))?;
    let stranger = Command::new(slate)
        .arg("--node")
        .arg(format!("127.0.0.1:{}", node.port))
        .args(["--server-name", &node.name])
        .arg("--certs")
        .arg(&other)
        .arg("status")
        .output()?;
    ensure!(
        !stranger.status.success(),
        "a client of another CA was answered"
    );

    // apply-config: the hostname changes live; what needs a reboot, or is malformed, is
    // refused with nothing written.
    let shown = node.ok(&["config", "show", "--output", "json"])?;
    // node1's installed configuration with `from` replaced by `to`, in `work/FILE` (not made
    // anew: `slate gen config` would issue a new CA, an API change that needs a reboot).
    let installed = fs::read_to_string(work.join("node1.machine.toml"))?;
    let node1_config = |file: &str, from: &str, to: &str| -> Result<(PathBuf, String)> {
        ensure!(
            installed.contains(from),
            "{from:?} in node1's configuration"
        );
        let text = installed.replacen(from, to, 1);
        let path = work.join(file);
        fs::write(&path, &text)?;
        Ok((path, text))
    };
    let no_reboot = |path: &Path| {
        node.refused(&[
            "apply-config",
            path.to_str().unwrap_or(""),
            "--mode",
            "no-reboot",
        ])
    };
    let (renamed, text) = node1_config(
        "node1-renamed.toml",
        "name = \"node1\"\n",
        "name = \"node1\"\nhostname = \"node1-renamed\"\n",
    )?;
    let (static_net, _) = node1_config(
        "node1-static.toml",
        "mode = \"dhcp\"\n",
        "mode = \"static\"\naddress = \"10.0.2.15/24\"\ngateway = \"10.0.2.2\"\n",
    )?;
    let needs_reboot = no_reboot(&static_net)?;
    ensure!(
        needs_reboot.contains("network cannot change without a reboot"),
        "{needs_reboot}"
    );
    let unknown = work.join("node1-typo.toml");
    fs::write(
        &unknown,
        text.replace("[node]\n", "[node]\nhostnme = \"x\"\n"),
    )?;
    let typo = no_reboot(&unknown)?;
    ensure!(
        typo.contains("node.hostnme"),
        "an unknown key is named: {typo}"
    );
    ensure!(
        node.ok(&["config", "show", "--output", "json"])? == shown,
        "a refused configuration changed what the node holds"
    );
    let applied = node.ok(&[
        "apply-config",
        renamed.to_str().unwrap_or(""),
        "--mode",
        "no-reboot",
    ])?;
    ensure!(
        applied.starts_with("applied: node.hostname changed; no reboot needed"),
        "apply-config: {applied}"
    );
    ensure!(
        node.status()?["hostname"] == "node1-renamed",
        "the hostname changed live"
    );
    Ok(Identity {
        summary: format!(
            "node1 sha256 {fp1:.16}…, node2 (same bundle) {fp2:.16}…; a client of another CA \
             refused; machine-id {machine_id} from the first boot; apply-config: hostname live, \
             a network change with --mode no-reboot and an unknown key (node.hostnme) refused \
             with the configuration unchanged; {stolen}"
        ),
        machine_id,
    })
}
