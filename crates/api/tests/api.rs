//! The real server and client over mutual TLS on 127.0.0.1, with a fake node behind.

mod common;

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{client, read, start, Fake};
use slate_api::{Client, ClientError, EventKind, RebootMode, Role, Stage, UpgradeRequest, CA_CERT};

#[test]
fn reader_reads_version_and_status() {
    let (dir, server) = start(Arc::default());
    let reader = client(&dir, &server, Role::Reader);
    assert_eq!(reader.version().unwrap(), common::version());
    assert_eq!(reader.status().unwrap(), common::status());
    server.shutdown().unwrap();
}

#[test]
fn reader_may_not_reboot_operator_may() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = start(fake.clone());
    let err = client(&dir, &server, Role::Reader)
        .reboot(RebootMode::Default)
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::PermissionDenied(m) if m.contains("operator")),
        "{err}"
    );
    assert!(fake.reboots.lock().unwrap().is_empty());

    client(&dir, &server, Role::Operator)
        .reboot(RebootMode::Powercycle)
        .unwrap();
    client(&dir, &server, Role::Admin)
        .reboot(RebootMode::Default)
        .unwrap();
    assert_eq!(
        *fake.reboots.lock().unwrap(),
        [RebootMode::Powercycle, RebootMode::Default]
    );
    // Logged on the server's logging thread, after the answer.
    fake.wait_log("(reader) POST /v1/reboot -> 403");
    fake.wait_log("(operator) POST /v1/reboot -> 202");
    server.shutdown().unwrap();
}

#[test]
fn a_reboot_into_a_named_entry_is_for_admins() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = start(fake.clone());
    for role in [Role::Reader, Role::Operator] {
        let err = client(&dir, &server, role)
            .reboot_once_into("slate-1.0.0.efi", RebootMode::Default)
            .unwrap_err();
        // The reader is refused by the route, the operator by the field.
        assert!(
            matches!(&err, ClientError::PermissionDenied(m)
                if m.contains(if role == Role::Reader { "operator" } else { "requires role admin" })),
            "{role}: {err}"
        );
    }
    client(&dir, &server, Role::Admin)
        .reboot_once_into("slate-1.0.0.efi", RebootMode::Powercycle)
        .unwrap();
    assert_eq!(
        *fake.reboots_once.lock().unwrap(),
        [("slate-1.0.0.efi".to_owned(), RebootMode::Powercycle)]
    );
    assert!(fake.reboots.lock().unwrap().is_empty());
    server.shutdown().unwrap();
}

#[test]
fn shutdown_is_for_operators_and_answers_locked_while_a_sequence_runs() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = start(fake.clone());
    let err = client(&dir, &server, Role::Reader).shutdown().unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    assert_eq!(fake.shutdowns.load(Ordering::SeqCst), 0);
    client(&dir, &server, Role::Operator).shutdown().unwrap();
    assert_eq!(fake.shutdowns.load(Ordering::SeqCst), 1);
    fake.locked.store(true, Ordering::SeqCst);
    let err = client(&dir, &server, Role::Admin).shutdown().unwrap_err();
    assert!(matches!(err, ClientError::Locked(_)), "{err}");
    assert_eq!(fake.shutdowns.load(Ordering::SeqCst), 1);
    fake.wait_log("(operator) POST /v1/shutdown -> 202");
    server.shutdown().unwrap();
}

#[test]
fn reset_is_for_admins() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = start(fake.clone());
    for role in [Role::Reader, Role::Operator] {
        let err = client(&dir, &server, role).reset().unwrap_err();
        assert!(
            matches!(err, ClientError::PermissionDenied(_)),
            "{role}: {err}"
        );
    }
    assert_eq!(fake.resets.load(Ordering::SeqCst), 0);
    client(&dir, &server, Role::Admin).reset().unwrap();
    assert_eq!(fake.resets.load(Ordering::SeqCst), 1);
    server.shutdown().unwrap();
}

#[test]
fn upgrade_request_reaches_the_backend_intact() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = start(fake.clone());
    let req = UpgradeRequest {
        image: "oci:/var/lib/bundles/slate-1.3.0".into(),
        stage: true,
        reboot_mode: RebootMode::Powercycle,
        allow_downgrade: true,
        tries: Some(2),
        replace: true,
    };
    // The operator role may upgrade, but not to an older version.
    let err = client(&dir, &server, Role::Reader)
        .upgrade(&req)
        .unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    let operator = client(&dir, &server, Role::Operator);
    let err = operator.upgrade(&req).unwrap_err();
    assert!(
        matches!(&err, ClientError::PermissionDenied(m) if m.contains("allow_downgrade")),
        "{err}"
    );
    assert!(fake.upgrades.lock().unwrap().is_empty());
    let forward = UpgradeRequest::new("registry.lab/slate/os:1.4.0");
    operator.upgrade(&forward).unwrap();
    assert_eq!(*fake.upgrades.lock().unwrap(), [forward]);
    fake.upgrades.lock().unwrap().clear();
    let admin = client(&dir, &server, Role::Admin);
    admin.upgrade(&req).unwrap();
    assert_eq!(*fake.upgrades.lock().unwrap(), [req]);
    let err = admin.upgrade(&UpgradeRequest::new(" ")).unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err}");
    server.shutdown().unwrap();
}

#[test]
fn client_without_certificate_is_refused_at_the_handshake() {
    let fake = Arc::new(Fake::default());
    let (dir, server) = start(fake.clone());
    let addr = server.local_addr().to_string();
    let anonymous = Client::without_certificate(&addr, &read(&dir, CA_CERT)).unwrap();
    let err = anonymous.status().unwrap_err();
    match &err {
        ClientError::Tls { message, .. } => {
            assert!(message.contains("requires a client certificate"), "{err}")
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // The server logged the refusal.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fake
        .api_log()
        .iter()
        .any(|l| l.contains("TLS handshake refused"))
    {
        assert!(Instant::now() < deadline, "{:?}", fake.api_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    server.shutdown().unwrap();
}

#[test]
fn client_certificate_from_another_ca_is_refused() {
    let (dir, server) = start(Arc::default());
    let other = common::certs();
    let addr = server.local_addr().to_string();
    // Trusts the node's CA, but presents an admin certificate of another CA.
    let stranger = Client::new(
        &addr,
        &read(&dir, CA_CERT),
        &read(&other, "admin.crt"),
        &read(&other, "admin.key"),
    )
    .unwrap();
    let err = stranger.reset().unwrap_err();
    match &err {
        ClientError::Tls { message, .. } => {
            assert!(message.contains("not accepted"), "{err}")
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // And a client that trusts another CA refuses the node.
    let err = Client::from_dir(&addr, other.path(), Role::Admin)
        .unwrap()
        .status()
        .unwrap_err();
    match &err {
        ClientError::Tls { message, .. } => assert!(message.contains("not trusted"), "{err}"),
        other => panic!("expected a TLS error, got {other:?}"),
    }
    server.shutdown().unwrap();
}

#[test]
fn locked_backend_maps_to_client_locked() {
    let fake = Arc::new(Fake::default());
    fake.locked.store(true, Ordering::SeqCst);
    let (dir, server) = start(fake.clone());
    let err = client(&dir, &server, Role::Operator)
        .reboot(RebootMode::Default)
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Locked(m) if m.contains("Upgrade")),
        "{err}"
    );
    let err = client(&dir, &server, Role::Admin).reset().unwrap_err();
    assert!(matches!(err, ClientError::Locked(_)), "{err}");
    server.shutdown().unwrap();
}

#[test]
fn concurrent_upgrades_one_is_locked() {
    let fake = Arc::new(Fake {
        upgrade_hold: Duration::from_millis(800),
        ..Fake::default()
    });
    let (dir, server) = start(fake.clone());
    let barrier = Arc::new(Barrier::new(2));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let admin = client(&dir, &server, Role::Admin);
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    admin.upgrade(&UpgradeRequest::new(format!("image-{i}")))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let locked = results
        .iter()
        .filter(|r| matches!(r, Err(ClientError::Locked(_))))
        .count();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!((ok, locked), (1, 1), "{results:?}");
    assert_eq!(fake.upgrades.lock().unwrap().len(), 1);
    server.shutdown().unwrap();
}

#[test]
fn logs_follow_streams_lines_as_produced() {
    let fake = Arc::new(Fake {
        log_lines: vec!["one".into(), "two".into(), "three".into()],
        log_gap: Duration::from_millis(300),
        ..Fake::default()
    });
    let (dir, server) = start(fake.clone());
    let mut received = Vec::new();
    client(&dir, &server, Role::Reader)
        .logs(true, |line| {
            received.push((line.to_owned(), Instant::now()));
            ControlFlow::Continue(())
        })
        .unwrap();
    let lines: Vec<_> = received.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(lines, ["one", "two", "three"]);
    let produced = fake.produced.lock().unwrap().clone();
    assert_eq!(produced.len(), 3);
    for (i, (_, at)) in received.iter().enumerate() {
        assert!(
            *at >= produced[i],
            "line {i} received before it was produced"
        );
    }
    // Streamed, not buffered: the first line arrived before the last was produced.
    assert!(
        received[0].1 < produced[2],
        "the first line waited for the whole stream"
    );
    server.shutdown().unwrap();
}

#[test]
fn logs_callback_can_stop_the_stream() {
    let fake = Arc::new(Fake {
        log_lines: (0..50).map(|i| format!("line {i}")).collect(),
        log_gap: Duration::from_millis(10),
        ..Fake::default()
    });
    let (dir, server) = start(fake);
    let mut seen = 0;
    client(&dir, &server, Role::Reader)
        .logs(true, |_| {
            seen += 1;
            if seen == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(seen, 2);
    server.shutdown().unwrap();
}

#[test]
fn events_backlog_and_follow() {
    let fake = Arc::new(Fake {
        live_events: vec![
            EventKind::SequenceStarted {
                sequence: "Reboot".into(),
            },
            EventKind::Stage {
                stage: Stage::Rebooting,
            },
        ],
        ..Fake::default()
    });
    let (dir, server) = start(fake);
    let reader = client(&dir, &server, Role::Reader);
    let mut backlog = Vec::new();
    reader
        .events(false, |e| {
            backlog.push(e.kind);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(
        backlog,
        [EventKind::Stage {
            stage: Stage::Running
        }]
    );
    let mut all = Vec::new();
    reader
        .events(true, |e| {
            all.push(e.kind);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(
        all[2],
        EventKind::Stage {
            stage: Stage::Rebooting
        }
    );
    server.shutdown().unwrap();
}

#[test]
fn backend_errors_on_streams_map_to_typed_errors() {
    let (dir, server) = start(Arc::default());
    let err = client(&dir, &server, Role::Reader)
        .dmesg(false, |_| ControlFlow::Continue(()))
        .unwrap_err();
    assert!(matches!(err, ClientError::Unsupported(_)), "{err}");
    server.shutdown().unwrap();
}

#[test]
fn shutdown_cuts_following_streams_and_stops_listening() {
    let fake = Arc::new(Fake {
        log_lines: (0..1000).map(|i| format!("line {i}")).collect(),
        log_gap: Duration::from_millis(20),
        ..Fake::default()
    });
    let (dir, server) = start(fake);
    let addr = server.local_addr();
    let reader = client(&dir, &server, Role::Reader);
    let follower = std::thread::spawn(move || {
        let mut n = 0;
        let r = reader.logs(true, |_| {
            n += 1;
            ControlFlow::Continue(())
        });
        (r, n)
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    server.shutdown().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let (_, n) = follower.join().unwrap();
    assert!(n > 0 && n < 1000, "{n}");
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn bad_address_and_bad_identity_are_reported() {
    let dir = common::certs();
    let err = Client::from_dir("host:port", dir.path(), Role::Admin).unwrap_err();
    assert!(matches!(err, ClientError::Address(_)), "{err}");
    let err = Client::new("127.0.0.1:1", b"junk", b"junk", b"junk").unwrap_err();
    assert!(matches!(err, ClientError::Config(_)), "{err}");
    let err = Client::from_dir("127.0.0.1:1", dir.path(), Role::Admin)
        .unwrap()
        .status()
        .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
}

#[test]
fn serve_blocking_runs_until_shutdown() {
    let dir = common::certs();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let config = slate_api::ServerConfig::from_dir(listen, dir.path()).unwrap();
    let shutdown = slate_api::Shutdown::new();
    let signal = shutdown.clone();
    let server = std::thread::spawn(move || {
        slate_api::serve_blocking(config, Arc::new(Fake::default()), signal)
    });
    let reader = Client::from_dir(&listen.to_string(), dir.path(), Role::Reader).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match reader.status() {
            Ok(status) => break status,
            Err(ClientError::Connect { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(status, common::status());
    shutdown.trigger();
    server.join().unwrap().unwrap();
    assert!(matches!(reader.status(), Err(ClientError::Connect { .. })));
}

fn tar_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, &data[..]).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn a_bundle_upload_streams_every_byte_to_the_backend() {
    use sha2::Digest as _;
    let (dir, server) = start(Arc::default());
    // 5 MiB of varied bytes: many chunks through the channel on both sides.
    let blob: Vec<u8> = (0..5u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    let tar = tar_of(&[("oci-layout", b"{}".to_vec()), ("blobs/sha256/x", blob)]);
    let expected = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&tar)));
    let progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = progress.clone();
    let sent = tar.clone();
    let uploaded = client(&dir, &server, Role::Admin)
        .upload_bundle(
            move |w| w.write_all(&sent),
            move |n| seen.store(n, Ordering::SeqCst),
        )
        .unwrap();
    assert_eq!(uploaded.size, tar.len() as u64);
    assert_eq!(uploaded.id, expected);
    assert_eq!(progress.load(Ordering::SeqCst), tar.len() as u64);

    let err = client(&dir, &server, Role::Operator)
        .upload_bundle(move |w| w.write_all(&tar), |_| {})
        .unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    server.shutdown().unwrap();
}

#[test]
fn a_refused_upload_is_answered_with_the_backends_reason() {
    let (dir, server) = start(Arc::default());
    let err = client(&dir, &server, Role::Admin)
        // 256 MiB, more than the node reads out of a refused upload (16 MiB): the client stops
        // sending once answered, and sees the answer, not a broken pipe.
        .upload_bundle(
            |w| (0..256).try_for_each(|_| w.write_all(&[0x55; 1 << 20])),
            |_| {},
        )
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::InvalidArgument(m) if m.contains("not a tar stream")),
        "{err}"
    );
    server.shutdown().unwrap();
}

/// A node that answers an upload before reading it (here 403: an operator may not upload) ends
/// the client's call at once, however much is still to send: the request's body is dropped
/// with its connection, so the writer sees a broken pipe instead of waiting on a full channel.
#[test]
fn an_upload_answered_early_ends_without_sending_the_rest() {
    let (dir, server) = start(Arc::default());
    let operator = client(&dir, &server, Role::Operator);
    let (done, answered) = std::sync::mpsc::channel();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = sent.clone();
    std::thread::spawn(move || {
        let mib = vec![0x5a; 1 << 20];
        // 1 GiB, written as the tar writer would, far beyond what the channel buffers.
        let result = operator.upload_bundle(
            move |w| (0..1024).try_for_each(|_| w.write_all(&mib)),
            move |n| counted.store(n, Ordering::SeqCst),
        );
        let _ = done.send(result);
    });
    let result = answered
        .recv_timeout(Duration::from_secs(30))
        .expect("the upload call did not end within 30 s of a refusal");
    let err = result.unwrap_err();
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    assert!(
        sent.load(Ordering::SeqCst) < 64 << 20,
        "{} bytes written after the refusal",
        sent.load(Ordering::SeqCst)
    );
    server.shutdown().unwrap();
}

/// `GET /v1/image` is a reader's route, answered by the backend (here the trait's default: a
/// node that cannot describe its running image); it takes no other method.
#[test]
fn a_reader_asks_for_the_running_image() {
    let route = slate_api::route_of(slate_api::Endpoint::ImageSummary);
    assert_eq!((route.method, route.path), ("GET", "/v1/image"));
    assert_eq!(route.role, Role::Reader);
    let (dir, server) = start(Arc::default());
    let reader = client(&dir, &server, Role::Reader);
    let err = reader
        .call::<serde_json::Value, ()>("GET", "/v1/image", None)
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Unsupported(m) if m == "this node cannot describe its running image"),
        "{err}"
    );
    let err = reader
        .call::<serde_json::Value, ()>("POST", "/v1/image", None)
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Server { status: 405, .. }),
        "{err:?}"
    );
    server.shutdown().unwrap();
}
