//! Issue 36 on real nodes: a node whose STATE holds a configuration of the shared-CA shape (as
//! an older slate wrote it) warns, is migrated with `apply-config` to its own name-constrained
//! CA, and an attacker who takes its disk before and after is replayed against slate's own CLI,
//! node1's real API and an `openssl s_server` impostor.

use std::time::Instant;

use super::*;

/// The second node (`node2`, booted with the shared-CA configuration) and the node it must
/// not open (`node1`, running).
pub(super) struct Victims<'a> {
    pub(super) node1: &'a Node<'a>,
    pub(super) node1_boot: &'a Running,
    pub(super) disk2: &'a Path,
    pub(super) vm2: &'a mut Vm,
    pub(super) boot2: Running,
}

/// What [`plant_shared_ca`] made: the old certificate directory, a client directory of it
/// (the old CA verifies node2 and signed the old admin), and an attacker's admin certificate
/// made from what node2's disk held.
pub(super) struct SharedCa {
    old: PathBuf,
    pub(super) clients: PathBuf,
    before: PathBuf,
}

/// The bytes of `path` in STATE's ext4 on `disk` (`debugfs`, as from a stolen disk).
pub(super) fn read_state_file(disk: &Path, work: &Path, path: &str) -> Result<String> {
    let (image, _) = state_image(disk, work)?;
    let out = output(
        Command::new("debugfs")
            .args(["-R", &format!("cat {path}")])
            .arg(&image),
    )?;
    ensure!(!out.is_empty(), "{path} is empty or missing on STATE");
    Ok(out)
}

/// What `debugfs` says of `path` in STATE's ext4 on `disk` (`stat`: its mode, owner, size).
pub(super) fn stat_state_file(disk: &Path, work: &Path, path: &str) -> Result<String> {
    let (image, _) = state_image(disk, work)?;
    let out = output(
        Command::new("debugfs")
            .args(["-R", &format!("stat {path}")])
            .arg(&image),
    )?;
    fs::remove_file(&image)?;
    Ok(out)
}

/// STATE copied out of `disk` into `work/state.ext4`, and where it lies on the disk.
fn state_image(disk: &Path, work: &Path) -> Result<(PathBuf, slate_layout::PartitionInfo)> {
    let file = slate_disk::FileDisk::open_read_only(disk)?;
    let state = slate_layout::find_partition(file, slate_layout::STATE_LABEL)?;
    let bytes = fs::read(disk)?;
    let image = work.join("state.ext4");
    fs::write(
        &image,
        &bytes[state.start as usize..(state.start + state.len) as usize],
    )?;
    Ok((image, state))
}

/// Replaces `config/machine.toml` on STATE of the powered-off `disk` with `text`, as an older
/// slate left it: through debugfs, since today's installer refuses the shape.
fn plant_config(disk: &Path, work: &Path, text: &str) -> Result<()> {
    let (image, state) = state_image(disk, work)?;
    let source = work.join("planted.toml");
    fs::write(&source, text)?;
    for request in [
        "rm /config/machine.toml".to_owned(),
        format!("write {} /config/machine.toml", source.display()),
    ] {
        let out = Command::new("debugfs")
            .args(["-w", "-R", &request])
            .arg(&image)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        // debugfs exits 0 whatever happened: its complaints are on stderr after the banner.
        ensure!(
            out.status.success() && err.lines().skip(1).all(|l| l.trim().is_empty()),
            "debugfs {request}: {err}"
        );
    }
    let planted = fs::read(&image)?;
    let mut file = fs::OpenOptions::new().write(true).open(disk)?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(state.start))?;
    std::io::Write::write_all(&mut file, &planted)?;
    file.sync_all()?;
    Ok(())
}

/// What an attacker makes of a CA read off a disk: a key and a certificate under
/// `ca_cert`/`ca_key` for the DNS name `san` — a client's with `O=os:<role>` when `role` is
/// given, else a server's —, valid from a day back (a guest's clock may lag the host's), in
/// `dir` as `forged.crt` (alone) and `NAME.crt` (with the CA after it), `NAME.key`, and the CA
/// as `stolen-ca.crt`. rcgen, not slate's issuing code, which keeps to the constraints.
fn forge(
    dir: &Path,
    name: &str,
    ca_cert: &str,
    ca_key: &str,
    role: Option<&str>,
    san: &str,
) -> Result<()> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
    fs::create_dir_all(dir)?;
    let issuer_key = KeyPair::from_pem(ca_key)?;
    let issuer = CertificateParams::from_ca_cert_pem(ca_cert)?.self_signed(&issuer_key)?;
    let mut p = CertificateParams::new(vec![san.to_owned()])?;
    p.distinguished_name.push(DnType::CommonName, "attacker");
    p.extended_key_usages = match role {
        Some(role) => {
            p.distinguished_name
                .push(DnType::OrganizationName, format!("os:{role}"));
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        }
        None => vec![ExtendedKeyUsagePurpose::ServerAuth],
    };
    let now = std::time::SystemTime::now();
    p.not_before = (now - Duration::from_secs(24 * 3600)).into();
    p.not_after = (now + Duration::from_secs(24 * 3600)).into();
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer, &issuer_key)?.pem();
    fs::write(dir.join("stolen-ca.crt"), ca_cert)?;
    fs::write(dir.join("forged.crt"), &cert)?;
    fs::write(dir.join(format!("{name}.crt")), cert + ca_cert)?;
    fs::write(dir.join(format!("{name}.key")), key.serialize_pem())?;
    Ok(())
}

/// `slate status` on `addr` as `server_name`, with the certificates of `certs`.
fn status_with(slate: &Path, certs: &Path, addr: &str, server_name: &str) -> Result<Output> {
    Ok(Command::new(slate)
        .args([
            "--node",
            addr,
            "--server-name",
            server_name,
            "--role",
            "admin",
            "--certs",
        ])
        .arg(certs)
        .args(["status", "--output", "json"])
        .output()?)
}

/// Puts a configuration of the shared-CA shape onto the STATE of the powered-off `disk2` (one
/// CA issues node2's serving certificate and the clients' certificates, as `slate gen certs`
/// made it before issue 36), after checking that today's slate refuses to write it; then
/// plays the attacker on that disk.
pub(super) fn plant_shared_ca(slate: &Path, disk2: &Path, work: &Path) -> Result<SharedCa> {
    let work = &work.join("stolen");
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work)?;
    let old = work.join("old-pki");
    run(Command::new(slate)
        .args(["gen", "certs", "--out"])
        .arg(&old))?;
    let read_old = |f: &str| fs::read_to_string(old.join(f));
    let installed = read_state_file(disk2, work, "/config/machine.toml")?;
    let mut shared = slate_machine_config::parse(&installed)?.config;
    shared.api.ca_cert = read_old(slate_api::CLIENT_CA_CERT)?;
    shared.api.ca_key = read_old(slate_api::CLIENT_CA_KEY)?;
    shared.api.client_ca = read_old(slate_api::CLIENT_CA_CERT)?;
    shared.api.fleet_ca = None;
    let shared_text = shared.to_toml();
    // Today's slate refuses to write it, naming why.
    let shared_file = work.join("shared.toml");
    fs::write(&shared_file, &shared_text)?;
    let refused = Command::new(slate)
        .args(["config", "validate"])
        .arg(&shared_file)
        .output()?;
    let why = String::from_utf8_lossy(&refused.stderr).into_owned();
    ensure!(
        !refused.status.success() && why.contains("no node may hold a key that signs for others"),
        "config validate of a shared-CA configuration: {why}"
    );
    plant_config(disk2, work, &shared_text)?;
    let clients = work.join("old-clients");
    fs::create_dir_all(&clients)?;
    fs::write(
        clients.join(slate_api::CA_CERT),
        read_old(slate_api::CLIENT_CA_CERT)?,
    )?;
    for f in ["admin.crt", "admin.key"] {
        fs::copy(old.join(f), clients.join(f))?;
    }
    // The attacker, before the migration: the key on node2's disk makes admin certificates.
    let harvested =
        slate_machine_config::parse(&read_state_file(disk2, work, "/config/machine.toml")?)?.config;
    let before = work.join("attacker-before");
    forge(
        &before,
        "admin",
        &harvested.api.ca_cert,
        &harvested.api.ca_key,
        Some("admin"),
        "attacker",
    )?;
    fs::write(before.join(slate_api::CA_CERT), &harvested.api.ca_cert)?;
    Ok(SharedCa {
        old,
        clients,
        before,
    })
}

/// The scenario on the booted node2; returns its summary.
pub(super) fn stolen_node_and_migration(
    prepared: &Prepared,
    v: Victims<'_>,
    shared: SharedCa,
    work: &Path,
) -> Result<String> {
    let slate = &prepared.slate;
    let work = &work.join("stolen");
    let node1_addr = format!("127.0.0.1:{}", v.node1.port);
    let SharedCa {
        old,
        clients: old_clients,
        before,
    } = shared;
    let read_old = |f: &str| fs::read_to_string(old.join(f));
    let mut boot2 = v.boot2;
    let node2_addr = format!("127.0.0.1:{}", v.vm2.api_port);
    let node2 = Node {
        prepared,
        port: v.vm2.api_port,
        name: "node2".into(),
    };
    let warned = said_line(&boot2, "INSECURE machine configuration")?;
    let out = status_with(slate, &old_clients, &node2_addr, "node2")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && stderr.contains("WARNING: INSECURE machine configuration"),
        "slate status on a shared-CA node says so: {stderr}"
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(
        status["warnings"].as_array().is_some_and(|w| !w.is_empty()),
        "status JSON warnings: {status}"
    );
    let out = status_with(slate, &before, &node2_addr, "node2")?;
    ensure!(
        out.status.success(),
        "before the migration, a forged admin is answered: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The migration: node2's own CA from the fleet of node1, the old client CA accepted beside
    // the new one; applied by the old admin, with the new fleet CA to verify the node after.
    let gen = |file: &str, extra: &[&str]| -> Result<PathBuf> {
        let text = output(
            Command::new(slate)
                .args(["gen", "config", "--name", "node2", "--pki"])
                .arg(demo_pki())
                .args(extra),
        )?;
        let path = work.join(file);
        fs::write(&path, text)?;
        Ok(path)
    };
    let accept_old = old.join(slate_api::CLIENT_CA_CERT);
    let transition = gen(
        "transition.toml",
        &["--also-accept-client-ca", accept_old.to_str().unwrap_or("")],
    )?;
    let apply = |certs: &Path, file: &Path| -> Result<String> {
        output(
            Command::new(slate)
                .args(["--node", &node2_addr, "--server-name", "node2", "--certs"])
                .arg(certs)
                .arg("apply-config")
                .arg(file)
                .args(["--mode", "reboot"]),
        )
    };
    apply(&old_clients, &transition)?;
    boot2.wait_exit(Duration::from_secs(90))?;
    let mut boot2 = running(v.vm2)?;
    let mixed = work.join("transition-clients");
    fs::create_dir_all(&mixed)?;
    fs::copy(
        demo_pki().join(slate_api::CA_CERT),
        mixed.join(slate_api::CA_CERT),
    )?;
    for f in ["admin.crt", "admin.key"] {
        fs::copy(old.join(f), mixed.join(f))?;
    }
    let out = status_with(slate, &mixed, &node2_addr, "node2")?;
    ensure!(
        out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("WARNING"),
        "after the first step the old admin is still answered, and no warning: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        node2.status()?["node_name"] == "node2",
        "the fleet's admin reaches node2 too"
    );
    // Then the old CA out.
    let last = gen("node2.toml", &[])?;
    apply(&demo_pki(), &last)?;
    boot2.wait_exit(Duration::from_secs(90))?;
    let boot2 = running(v.vm2)?;
    let out = status_with(slate, &mixed, &node2_addr, "node2")?;
    ensure!(
        !out.status.success(),
        "the old admin is refused once its CA is removed"
    );
    let out = status_with(slate, &before, &node2_addr, "node2")?;
    ensure!(
        !out.status.success(),
        "the key from before the migration opens nothing now"
    );
    ensure!(
        node2.status()?["warnings"].is_null(),
        "no warnings after the migration"
    );
    let mut boot2 = boot2;
    boot2.kill();

    // After: node2 is stolen (powered off); everything on its STATE is the attacker's.
    let stolen =
        slate_machine_config::parse(&read_state_file(v.disk2, work, "/config/machine.toml")?)?
            .config;
    let previous = read_state_file(v.disk2, work, "/config/machine.toml.previous")?;
    ensure!(
        !previous.contains(read_old(slate_api::CLIENT_CA_KEY)?.trim()),
        "the old CA key is gone from STATE"
    );
    let node_key = read_state_file(v.disk2, work, "/pki/node.key")?;
    ensure!(
        node_key.contains("PRIVATE KEY"),
        "node2's own key, harvested too"
    );
    let after = work.join("attacker-after");
    forge(
        &after,
        "admin",
        &stolen.api.ca_cert,
        &stolen.api.ca_key,
        Some("admin"),
        "node2",
    )?;
    fs::write(after.join(slate_api::CA_CERT), stolen.fleet_ca())?;
    let refused_before = v
        .node1_boot
        .serial()
        .matches("TLS handshake refused")
        .count();
    let out = status_with(slate, &after, &node1_addr, &v.node1.name)?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        !out.status.success() && err.contains("refused the TLS handshake"),
        "node1 refuses an admin certificate made with node2's key: {err}"
    );
    // node1 logged one bounded line about it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let logged = loop {
        let serial = v.node1_boot.serial();
        // The whole line: the console may hand it over in pieces.
        let complete = serial
            .rfind("TLS handshake refused")
            .is_some_and(|at| serial[at..].contains('\n'));
        if complete && serial.matches("TLS handshake refused").count() > refused_before {
            break serial
                .lines()
                .rfind(|l| l.contains("TLS handshake refused"))
                .unwrap_or_default()
                .to_owned();
        }
        ensure!(
            Instant::now() < deadline,
            "node1 logged no refused handshake"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Refused for the right reason: its chain leads to no CA node1 takes clients of.
    ensure!(
        logged.len() < 1024 && logged.contains("UnknownIssuer"),
        "one bounded line naming the unknown issuer: {logged}"
    );
    // A serving certificate for node1's name under node2's CA: slate refuses it.
    let impostor_dir = work.join("impostor");
    forge(
        &impostor_dir,
        "server",
        &stolen.api.ca_cert,
        &stolen.api.ca_key,
        None,
        &v.node1.name,
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut impostor = Command::new("openssl")
        .args(["s_server", "-quiet", "-accept", &port.to_string(), "-cert"])
        .arg(impostor_dir.join("forged.crt"))
        .arg("-cert_chain")
        .arg(impostor_dir.join("stolen-ca.crt"))
        .arg("-key")
        .arg(impostor_dir.join("server.key"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(500));
    let out = status_with(
        slate,
        &demo_pki(),
        &format!("127.0.0.1:{port}"),
        &v.node1.name,
    );
    let _ = impostor.kill();
    let _ = impostor.wait();
    let out = out?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        !out.status.success() && err.contains("(X.509 name constraints)"),
        "a certificate for node1 under node2's CA is refused by slate for its name: {err}"
    );
    Ok(format!(
        "node2 with a shared-CA configuration warned ({warned:.60}…) and a forged admin was \
         answered; migrated in two apply-configs; after, node2's harvested key: admin on node1 \
         refused at the handshake (logged: {} bytes), a serving certificate for node1 refused \
         ({})",
        logged.len(),
        err.lines().last().unwrap_or_default().trim()
    ))
}
