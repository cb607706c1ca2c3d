//! A node's own identity (key made on the node, serving certificate issued from the
//! configuration's CA) and maintenance mode (self-signed, token only), over the real server.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::raw::{head, Raw};
use common::Fake;
use slate_api::{
    ApplyConfigRequest, ApplyMode, Client, ClientError, Role, ServerConfig, ServerHandle,
};

fn apply(config: &str) -> ApplyConfigRequest {
    ApplyConfigRequest {
        config: config.into(),
        mode: ApplyMode::NoReboot,
        dry_run: false,
    }
}

/// A node as machined makes it: its own key, a serving certificate from its issuing CA for
/// its name, an address DHCP gave it and the loopback names (the CA's constraints drop all
/// but the name), its API taking clients of the client CA.
fn node(pki: &std::path::Path, name: &str) -> (slate_api::NodeTrust, ServerHandle) {
    let trust = slate_api::NodeTrust::issue(pki, name, &[name.to_owned()], &[]).unwrap();
    let key = slate_api::generate_key_pem().unwrap();
    let names = slate_api::serving_names(&[name.to_owned(), "10.0.2.15".to_owned()]);
    let cert = slate_api::issue_serving_cert(&trust.ca_cert, &trust.ca_key, &key, &names).unwrap();
    let config = ServerConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        trust.client_ca.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
    );
    (
        trust,
        slate_api::spawn(config, Arc::new(Fake::default())).unwrap(),
    )
}

#[test]
fn each_node_answers_under_its_own_name_only_and_clients_of_another_fleet_are_refused() {
    let pki = common::certs();
    for name in ["node1", "node2"] {
        let (_, server) = node(pki.path(), name);
        let addr = server.local_addr().to_string();
        // A client of the fleet reaches it, asking for the node by name.
        let client = Client::from_dir(&addr, pki.path(), Role::Reader)
            .unwrap()
            .with_server_name(name)
            .unwrap();
        assert_eq!(client.status().unwrap().version, "1.2.3");
        // Its certificate names the node alone: not the address the client dialled, not the
        // other node, not the address DHCP gave it.
        for other in ["127.0.0.1", "node3", "10.0.2.15"] {
            let client = Client::from_dir(&addr, pki.path(), Role::Reader)
                .unwrap()
                .with_server_name(other)
                .unwrap();
            let err = client.status().unwrap_err();
            assert!(err.to_string().contains("not trusted"), "{other}: {err}");
        }
        // A client whose certificates come from another fleet trusts neither the node nor is
        // trusted by it.
        let other = common::certs();
        let stranger = Client::from_dir(&addr, other.path(), Role::Admin)
            .unwrap()
            .with_server_name(name)
            .unwrap();
        assert!(stranger.status().is_err());
        server.shutdown().unwrap();
    }
}

/// A node API serving a certificate for `name` forged under `stolen`'s CA.
fn serve_forged(stolen: &slate_api::NodeTrust, name: &str) -> ServerHandle {
    let (cert, key) = common::forge(&stolen.ca_cert, &stolen.ca_key, &[name], None);
    let config = ServerConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        stolen.client_ca.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
    );
    slate_api::spawn(config, Arc::new(Fake::default())).unwrap()
}

/// The attack of issue 36, replayed: everything on node1's disk is the attacker's, its
/// machine configuration's CA key first. From it no client certificate node2 accepts can be
/// made, and no serving certificate a client takes for node2.
#[test]
fn a_stolen_nodes_key_opens_no_other_node() {
    let pki = common::certs();
    let (stolen, node1) = node(pki.path(), "node1");
    let (_, node2) = node(pki.path(), "node2");
    let node2_addr = node2.local_addr().to_string();
    let fleet_ca = common::read(&pki, slate_api::CA_CERT);

    // 1. Admin (and every other role) on node2: refused at the TLS handshake.
    for role in [Role::Admin, Role::Operator, Role::Reader] {
        let (cert, key) = common::forge(&stolen.ca_cert, &stolen.ca_key, &["attacker"], Some(role));
        let client = Client::new(&node2_addr, &fleet_ca, cert.as_bytes(), key.as_bytes())
            .unwrap()
            .with_server_name("node2")
            .unwrap();
        let err = client.status().unwrap_err();
        assert!(
            err.to_string().contains("refused the TLS handshake"),
            "{role}: {err}"
        );
    }
    // 2. A serving certificate for node2's name (or an address) under node1's CA: a client
    //    of the fleet refuses it (webpki enforces the name constraints).
    for name in ["node2", "127.0.0.1", "10.0.2.16"] {
        let impostor = serve_forged(&stolen, name);
        let client = Client::from_dir(&impostor.local_addr().to_string(), pki.path(), Role::Admin)
            .unwrap()
            .with_server_name(name)
            .unwrap();
        let err = client.status().unwrap_err();
        assert!(
            err.to_string()
                .contains("its issuing CA may not certify that name (X.509 name constraints)"),
            "a certificate for {name} under node1's CA: {err}"
        );
        impostor.shutdown().unwrap();
    }
    // …while node1's own name under its CA is good: the constraints, not a broken chain, are
    // what refused the others.
    let own = serve_forged(&stolen, "node1");
    let client = Client::from_dir(&own.local_addr().to_string(), pki.path(), Role::Reader)
        .unwrap()
        .with_server_name("node1")
        .unwrap();
    assert_eq!(client.status().unwrap().version, "1.2.3");
    own.shutdown().unwrap();
    node1.shutdown().unwrap();
    node2.shutdown().unwrap();
}

#[test]
fn maintenance_mode_serves_apply_config_to_the_token_only() {
    let key = slate_api::generate_key_pem().unwrap();
    let cert = slate_api::self_signed_cert(&key, &slate_api::serving_names(&[])).unwrap();
    let fake = Arc::new(Fake::default());
    let token = "k3x9-t0k3n";
    let config = ServerConfig::maintenance(
        "127.0.0.1:0".parse().unwrap(),
        cert.as_bytes(),
        key.as_bytes(),
        token,
    );
    let server = slate_api::spawn(config, fake.clone()).unwrap();
    let addr = server.local_addr().to_string();

    // The right token, the certificate pinned by its fingerprint.
    let mut pin = [0u8; 32];
    hex::decode_to_slice(slate_api::fingerprint(&cert).unwrap(), &mut pin).unwrap();
    let client = Client::maintenance(&addr, token, Some(pin)).unwrap();
    let result = client.apply_config(&apply("version = 1")).unwrap();
    assert_eq!(result.outcome, "applied");
    assert_eq!(fake.configs.lock().unwrap().len(), 1);
    // Nothing else is served, even with the token.
    let err = client.status().unwrap_err();
    assert!(
        matches!(&err, ClientError::PermissionDenied(m) if m.contains("maintenance mode")),
        "{err}"
    );
    // A wrong token or none.
    for wrong in ["nope", ""] {
        let client = Client::maintenance(&addr, wrong, None).unwrap();
        let err = client.apply_config(&apply("version = 1")).unwrap_err();
        assert!(
            matches!(&err, ClientError::PermissionDenied(m) if m.contains("token")),
            "{err}"
        );
    }
    assert_eq!(fake.configs.lock().unwrap().len(), 1);
    // A pinned fingerprint that is not the node's certificate: refused at the handshake.
    let client = Client::maintenance(&addr, token, Some([7u8; 32])).unwrap();
    assert!(client.apply_config(&apply("version = 1")).is_err());
    assert_eq!(fake.configs.lock().unwrap().len(), 1);
    server.shutdown().unwrap();
}

/// Maintenance mode has no client certificates to count connections by, so it counts them per
/// address: 8 from 127.0.0.1 are served, a ninth is answered 429, and the address gets its
/// place back when one of its connections closes.
#[test]
fn maintenance_mode_limits_connections_per_address() {
    let key = slate_api::generate_key_pem().unwrap();
    let cert = slate_api::self_signed_cert(&key, &slate_api::serving_names(&[])).unwrap();
    let config = ServerConfig::maintenance(
        "127.0.0.1:0".parse().unwrap(),
        cert.as_bytes(),
        key.as_bytes(),
        "t0k3n",
    );
    let fake = Arc::new(Fake::default());
    let server = slate_api::spawn(config, fake.clone()).unwrap();
    let addr = server.local_addr();
    // Any route: without the token each is refused 403, which is an answer on a place held.
    let request = head("GET", "/v1/status", &[]);
    let ask = |raw: &mut Raw| {
        assert!(raw.send(&request));
        raw.answer(Duration::from_secs(5))
    };
    let mut held: Vec<Raw> = (0..slate_api::CONNECTIONS_PER_CLIENT)
        .map(|i| {
            let mut raw = Raw::connect_anonymous(addr, cert.as_bytes());
            let (status, answer) = ask(&mut raw);
            assert_eq!(status, 403, "connection {i}: {answer}");
            raw
        })
        .collect();
    let mut extra = Raw::connect_anonymous(addr, cert.as_bytes());
    let (status, answer) = ask(&mut extra);
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("close one"), "{answer}");
    let log = fake.wait_log("refused a connection (429)");
    assert!(
        log.iter()
            .any(|l| l.contains("(429): address 127.0.0.1 holds 8")),
        "{log:?}"
    );

    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = Raw::connect_anonymous(addr, cert.as_bytes());
        match ask(&mut again).0 {
            403 => break,
            429 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("{other}"),
        }
    }
    server.shutdown().unwrap();
}
