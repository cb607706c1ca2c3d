use super::*;

const V1: &str = include_str!("../tests/fixtures/node-v1.toml");
const V0: &str = include_str!("../tests/fixtures/node-v0.toml");
const CA: &str = include_str!("../tests/fixtures/ca.crt");
const OTHER_KEY: &str = include_str!("../tests/fixtures/other-ca.key");
const LEAF: &str = include_str!("../tests/fixtures/leaf.crt");

fn refused(text: &str) -> ConfigError {
    parse(text).expect_err("the document should be refused")
}

/// The v1 fixture with `from` replaced by `to` (exactly once).
fn edited(from: &str, to: &str) -> String {
    assert_eq!(V1.matches(from).count(), 1, "{from:?} in the fixture");
    V1.replacen(from, to, 1)
}

#[test]
fn the_fixture_parses_with_every_section() {
    let parsed = parse(V1).unwrap();
    assert_eq!(parsed.migrated_from, None);
    let c = parsed.config;
    assert_eq!(c.node.name, "node1");
    assert_eq!(c.hostname(), "node1.example.net");
    assert_eq!(c.network.mode, NetworkMode::Static);
    assert_eq!(c.network.gateway, Some("10.0.2.2".parse().unwrap()));
    assert_eq!(c.update.strategy, Strategy::FleetLock);
    assert_eq!(c.update.windows.len(), 1);
    assert_eq!(c.etc.files[0].mode, 0o644);
    assert_eq!(c.etc_keep(), ["motd", "ssh/ssh_host_ed25519_key"]);
}

#[test]
fn a_document_round_trips_through_its_toml() {
    let c = parse(V1).unwrap().config;
    let again = parse(&c.to_toml()).unwrap().config;
    assert_eq!(c, again);
}

#[test]
fn version_0_is_migrated_forward_in_memory() {
    let parsed = parse(V0).unwrap();
    assert_eq!(parsed.migrated_from, Some(0));
    let c = parsed.config;
    assert_eq!(c.version, CURRENT_VERSION);
    assert_eq!(c.node.name, "legacy-node");
    assert_eq!(c.hostname(), "legacy-node");
    assert_eq!(c.network.mode, NetworkMode::Static);
    assert_eq!(c.network.address.as_deref(), Some("10.0.2.15/24"));
    assert_eq!(c.update.channel, "beta");
    // One CA for both directions in version 0.
    assert_eq!(c.api.ca_cert, c.api.client_ca);
    assert_eq!(c.api.ca_cert.trim(), CA.trim());
    // Its migrated form is a valid version 1 document.
    assert_eq!(parse(&c.to_toml()).unwrap().config, c);
}

#[test]
fn unknown_keys_are_named_by_their_path() {
    let err = refused(&edited("gateway = \"10.0.2.2\"", "gatewy = \"10.0.2.2\""));
    assert_eq!(err.field(), Some("network.gatewy"), "{err}");
    let err = refused(&edited("version = 1\n", "version = 1\nshoe_size = 44\n"));
    assert_eq!(err.field(), Some("shoe_size"), "{err}");
    // Appended at the end, the key belongs to the last table.
    let err = refused(&format!("{V1}\nshoe_size = 44\n"));
    assert_eq!(err.field(), Some("etc.files[0].shoe_size"), "{err}");
    let err = refused(&edited(
        "start = \"22:00\"",
        "start = \"22:00\"\nstop = \"23:00\"",
    ));
    assert!(err.field().unwrap().starts_with("update.windows"), "{err}");
    assert!(err.to_string().contains("stop"), "{err}");
    let err = refused(&V0.replace("channel = \"beta\"", "chanel = \"beta\""));
    assert_eq!(err.field(), Some("chanel"), "{err}");
}

#[test]
fn wrong_versions_are_refused() {
    let err = refused(&edited("version = 1", "version = 7"));
    assert_eq!(err.field(), Some("version"));
    assert!(
        err.to_string()
            .contains("7 is not a version this slate reads"),
        "{err}"
    );
    let err = refused(&edited("version = 1", "version = \"1\""));
    assert_eq!(err.field(), Some("version"));
    let err = refused(&edited("version = 1\n", ""));
    assert_eq!(err.to_string(), "version: missing (this slate writes 1)");
}

#[test]
fn bad_fields_are_named() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "hostname = \"node1.example.net\"",
            "hostname = \"node_1!\"",
            "node.hostname",
        ),
        ("name = \"node1\"", "name = \"Node 1\"", "node.name"),
        (
            "address = \"10.0.2.15/24\"",
            "address = \"10.0.2.15/33\"",
            "network.address",
        ),
        ("mode = \"static\"", "mode = \"dhcp\"", "network.address"),
        ("mode = \"static\"", "mode = \"ppp\"", "network.mode"),
        (
            "gateway = \"10.0.2.2\"",
            "gateway = \"fe80::1\"",
            "network.gateway",
        ),
        (
            "start = \"22:00\"",
            "start = \"25:00\"",
            "update.windows[0].start",
        ),
        (
            "length = \"4h\"",
            "length = \"four hours\"",
            "update.windows[0].length",
        ),
        (
            "days = [\"sat\", \"sun\"]",
            "days = [\"someday\"]",
            "update.windows[0].days",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"yolo\"",
            "update.strategy",
        ),
        (
            "lock_server = \"http://127.0.0.1:8080\"",
            "lock_server = \"ftp://x\"",
            "update.lock_server",
        ),
        (
            "image = \"registry.lab:5000/slate/os\"",
            "image = \"registry.lab:5000/slate/os:2.0.0\"",
            "update.image",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"",
            "update.operator",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:50100\", \"10.0.0.6\"]",
            "update.operator",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:50100\"]\nadvertise = \"node1\"",
            "update.advertise",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:50100\"]\ngroup = \"Web Tier\"",
            "update.group",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:50100\"]\nlabels = { \"zone a\" = \"1\" }",
            "update.labels",
        ),
        ("image = \"registry.lab:5000/slate/os\"", "", "update.image"),
        (
            "channel = \"stable\"",
            "channel = \"nightly\"",
            "update.channel",
        ),
        (
            "poll_interval = \"15m\"",
            "poll_interval = \"1s\"",
            "update.poll_interval",
        ),
        (
            "poll_interval = \"15m\"",
            "poll_interval = \"8days\"",
            "update.poll_interval",
        ),
        (
            "poll_interval = \"15m\"",
            "poll_interval = \"500000000000years\"",
            "update.poll_interval",
        ),
        (
            "listen = \"0.0.0.0:50000\"",
            "listen = \"0.0.0.0:0\"",
            "api.listen",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:0\"]",
            "update.operator",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:50100\"]\nadvertise = \"node1:0\"",
            "update.advertise",
        ),
        (
            "strategy = \"fleet-lock\"",
            "strategy = \"operator\"\noperator = [\"10.0.0.5:65536\"]",
            "update.operator",
        ),
        (
            "keep = [\"ssh/ssh_host_ed25519_key\"]",
            "keep = [\"../shadow\"]",
            "etc.keep[0]",
        ),
        (
            "path = \"motd\"",
            "path = \"/etc/motd\"",
            "etc.files[0].path",
        ),
        ("mode = 0o644", "mode = 0o17777", "etc.files[0].mode"),
        (
            "extra_sans = [\"node1.lab\"]",
            "extra_sans = [\"not a name\"]",
            "api.extra_sans",
        ),
    ];
    for (from, to, field) in cases {
        let err = refused(&edited(from, to));
        assert_eq!(err.field(), Some(*field), "{from} -> {to}: {err}");
    }
}

#[test]
fn a_bad_ca_is_refused() {
    let key_start = V1.find("ca_key = \"\"\"").unwrap();
    let (head, tail) = V1.split_at(key_start);
    let key_end = tail[12..].find("\"\"\"").unwrap() + 12 + 3;
    // A key that is not the certificate's.
    let text = format!(
        "{head}ca_key = \"\"\"\n{}\"\"\"{}",
        OTHER_KEY,
        &tail[key_end..]
    );
    let err = refused(&text);
    assert_eq!(err.to_string(), "api.ca_key: is not the key of api.ca_cert");
    // Garbage for a key.
    let text = format!("{head}ca_key = \"junk\"{}", &tail[key_end..]);
    assert_eq!(refused(&text).field(), Some("api.ca_key"));
    // A leaf certificate for the issuing CA.
    let text = V1.replacen(CA.trim(), LEAF.trim(), 1);
    let err = refused(&text);
    assert_eq!(err.field(), Some("api.ca_cert"), "{err}");
    assert!(err.to_string().contains("not a CA"), "{err}");
    // Not PEM at all.
    let text = V1.replacen(CA.trim(), "hello", 1);
    assert_eq!(refused(&text).field(), Some("api.ca_cert"));
    // A client CA that is a leaf.
    let text = V1.rsplitn(2, CA.trim()).collect::<Vec<_>>();
    let text = format!("{}{}{}", text[1], LEAF.trim(), text[0]);
    let err = refused(&text);
    assert_eq!(err.field(), Some("api.client_ca"), "{err}");
}

#[test]
fn syntax_errors_and_oversized_documents_are_refused() {
    assert!(matches!(
        refused("version = 1\n[node\n"),
        ConfigError::Syntax(_)
    ));
    let big = "#".repeat(MAX_DOCUMENT_BYTES + 1);
    assert!(matches!(refused(&big), ConfigError::TooLarge { .. }));
}

#[test]
fn redaction_hides_the_ca_key_only() {
    let c = parse(V1).unwrap().config;
    let r = c.redacted();
    assert_eq!(r.api.ca_key, REDACTED);
    assert!(!r.to_toml().contains("PRIVATE KEY"));
    assert_eq!(r.api.ca_cert, c.api.ca_cert);
}

#[test]
fn changes_say_whether_a_reboot_is_needed() {
    let a = parse(V1).unwrap().config;
    let mut b = a.clone();
    b.node.hostname = Some("renamed".into());
    let change = change(&a, &b);
    assert_eq!(change.changed, ["node.hostname"]);
    assert!(!change.reboot_required);
    b.network.dns.clear();
    let change = super::change(&a, &b);
    assert_eq!(change.changed, ["node.hostname", "network"]);
    assert!(change.reboot_required);
    assert!(super::change(&a, &a).changed.is_empty());
}

#[test]
fn windows_wrap_midnight_and_the_week() {
    let w = Window {
        days: vec!["sun".into()],
        start: "22:00".into(),
        length: "4h".into(),
    };
    let at = |day: u32, h: u32, m: u32| day * 1440 + h * 60 + m;
    assert!(w.contains(at(6, 22, 0)));
    assert!(w.contains(at(6, 23, 59)));
    assert!(w.contains(at(0, 1, 59))); // Monday, past midnight and past the week's end
    assert!(!w.contains(at(0, 2, 0)));
    assert!(!w.contains(at(6, 21, 59)));
    let every = Window {
        days: vec!["*".into()],
        start: "00:00".into(),
        length: "30m".into(),
    };
    assert!((0..7).all(|d| every.contains(at(d, 0, 29)) && !every.contains(at(d, 0, 30))));
}

#[test]
fn hostnames_and_cidrs() {
    assert!(is_hostname("node1"));
    assert!(is_hostname("Node1.Example.net"));
    assert!(!is_hostname("node_1"));
    assert!(!is_hostname("-node"));
    assert!(!is_hostname("a..b"));
    assert!(!is_hostname(&"a".repeat(64)));
    assert_eq!(
        parse_cidr("10.0.0.1/8"),
        Some(("10.0.0.1".parse().unwrap(), 8))
    );
    assert_eq!(parse_cidr("fd00::1/64").map(|(_, p)| p), Some(64));
    assert_eq!(parse_cidr("10.0.0.1"), None);
    assert_eq!(parse_cidr("fd00::1/129"), None);
}

#[test]
fn the_next_window_opening_is_found_across_the_week() {
    let at = |day: u32, h: u32, m: u32| day * 1440 + h * 60 + m;
    let windows = [
        Window {
            days: vec!["tue".into()],
            start: "02:00".into(),
            length: "1h".into(),
        },
        Window {
            days: vec!["sun".into()],
            start: "23:00".into(),
            length: "2h".into(),
        },
    ];
    // Monday 01:30 is inside Sunday's window, which runs past the week's end.
    assert_eq!(minutes_until_open(&windows, at(0, 0, 30)), Some(0));
    // Monday 03:00: Tuesday 02:00 is 23 hours away.
    assert_eq!(minutes_until_open(&windows, at(0, 3, 0)), Some(23 * 60));
    assert_eq!(describe_minute_of_week(at(0, 3, 0) + 23 * 60), "Tue 02:00");
    // Tuesday 03:00: the next is Sunday 23:00.
    assert_eq!(
        minutes_until_open(&windows, at(1, 3, 0)),
        Some(5 * 1440 + 20 * 60)
    );
    assert_eq!(minutes_until_open(&[], 0), None);
}

#[test]
fn the_operator_strategy_names_replicas_group_labels_and_address() {
    let text = edited(
        "strategy = \"fleet-lock\"",
        "strategy = \"operator\"\noperator = [\"10.0.0.5:50100\", \"ops.lab:50100\"]\n\
         group = \"web\"\nlabels = { zone = \"a\" }\nadvertise = \"127.0.0.1:50001\"",
    );
    let c = parse(&text).unwrap().config;
    assert_eq!(c.update.strategy, Strategy::Operator);
    assert_eq!(c.update.operator, ["10.0.0.5:50100", "ops.lab:50100"]);
    assert_eq!(c.update.group.as_deref(), Some("web"));
    assert_eq!(c.update.labels["zone"], "a");
    assert_eq!(c.update.advertise.as_deref(), Some("127.0.0.1:50001"));
    assert_eq!(parse(&c.to_toml()).unwrap().config, c);
}

#[test]
fn poll_interval_and_ports_are_bounded_both_ways() {
    for ok in ["10s", "7days"] {
        let text = edited(
            "poll_interval = \"15m\"",
            &format!("poll_interval = \"{ok}\""),
        );
        parse(&text).unwrap();
    }
    let err = refused(&edited(
        "poll_interval = \"15m\"",
        "poll_interval = \"7days 1s\"",
    ));
    assert!(err.to_string().contains("at most 7 days"), "{err}");
    parse(&edited(
        "listen = \"0.0.0.0:50000\"",
        "listen = \"0.0.0.0:65535\"",
    ))
    .unwrap();
}

#[test]
fn the_var_mode_takes_tpm2_refuses_an_unknown_one_and_a_change_takes_a_reboot() {
    assert_eq!(parse(V1).unwrap().config.var, None);
    let tpm2 = parse(&format!("{V1}\n[var]\nmode = \"tpm2\"\n"))
        .unwrap()
        .config;
    assert_eq!(tpm2.var_mode(), Some(slate_profile::VarMode::Tpm2));
    assert_eq!(tpm2.recovery_key(), RecoveryKey::Console);
    assert_eq!(parse(&tpm2.to_toml()).unwrap().config, tpm2);
    let e = refused(&format!("{V1}\n[var]\nmode = \"luks\"\n"));
    assert_eq!(e.field(), Some("var.mode"), "{e}");
    let change = change(&parse(V1).unwrap().config, &tpm2);
    assert_eq!(change.changed, ["var"]);
    assert!(change.reboot_required);
}

#[test]
fn the_recovery_key_goes_where_the_document_says_and_nothing_else_is_taken() {
    for (name, to) in [
        ("console", RecoveryKey::Console),
        ("state", RecoveryKey::State),
        ("none", RecoveryKey::None),
    ] {
        let c = parse(&format!("{V1}\n[var]\nrecovery_key = \"{name}\"\n"))
            .unwrap()
            .config;
        assert_eq!(c.recovery_key(), to);
        // Naming the key's destination alone leaves the image's mode in force.
        assert_eq!(c.var_mode(), None);
        assert_eq!(parse(&c.to_toml()).unwrap().config, c);
    }
    for bad in [
        "\"State\"",
        "\"state:/root/key\"",
        "\"file\"",
        "\"\"",
        "true",
        "[\"state\"]",
    ] {
        let e = refused(&format!("{V1}\n[var]\nrecovery_key = {bad}\n"));
        assert_eq!(e.field(), Some("var.recovery_key"), "{bad}: {e}");
    }
    let e = refused(&format!("{V1}\n[var]\nrecovery_key = \"stdout\"\n"));
    assert!(
        e.to_string().contains("console") && e.to_string().contains("state"),
        "a refusal says what is accepted: {e}"
    );
    let e = refused(&format!("{V1}\n[var]\nrecovery = \"state\"\n"));
    assert_eq!(e.field(), Some("var.recovery"), "{e}");
}

#[test]
fn the_reboot_mode_is_optional_and_checked_by_name() {
    assert_eq!(parse(V1).unwrap().config.reboot.mode, None);
    let kexec = format!("{V1}\n[reboot]\nmode = \"kexec\"\n");
    let c = parse(&kexec).unwrap().config;
    assert_eq!(c.reboot.mode, Some(RebootMethod::Kexec));
    assert_eq!(parse(&c.to_toml()).unwrap().config, c);
    let firmware = parse(&format!("{V1}\n[reboot]\nmode = \"firmware\"\n")).unwrap();
    assert_eq!(firmware.config.reboot.mode, Some(RebootMethod::Firmware));
    // Unset, the section is not written back.
    assert!(!parse(V1).unwrap().config.to_toml().contains("[reboot]"));

    let e = refused(&format!("{V1}\n[reboot]\nmode = \"warm\"\n"));
    assert_eq!(e.field(), Some("reboot.mode"), "{e}");
    let e = refused(&format!("{V1}\n[reboot]\nmod = \"kexec\"\n"));
    assert_eq!(e.field(), Some("reboot.mod"), "{e}");

    // A change of the reboot mode applies to the next reboot without one.
    let a = parse(V1).unwrap().config;
    let change = change(&a, &c);
    assert_eq!(change.changed, ["reboot"]);
    assert!(!change.reboot_required);
}

#[test]
fn services_are_checked_one_by_one_here_and_apply_live() {
    let base = parse(V1).unwrap().config;
    let mut with = base.clone();
    with.services = vec![slate_services::ServiceSpec::new("web", &["/bin/httpd"])];
    let change = change(&base, &with);
    assert_eq!(change.changed, ["services"]);
    assert!(!change.reboot_required);
    let text = format!("{V1}\n[[services]]\nname = \"web\"\ncommand = [\"httpd\"]\n");
    let err = parse(&text).unwrap_err();
    assert_eq!(err.field(), Some("services"));
    assert!(
        err.to_string()
            .contains("service \"web\": command: \"httpd\" is not an absolute path"),
        "{err}"
    );
    let twins = format!(
        "{V1}\n[[services]]\nname = \"web\"\ncommand = [\"/a\"]\n[[services]]\nname = \"web\"\ncommand = [\"/b\"]\n"
    );
    assert!(parse(&twins)
        .unwrap_err()
        .to_string()
        .contains("declared twice"));
}

#[test]
fn a_drain_command_is_an_absolute_argv_with_a_bounded_timeout_and_applies_live() {
    let with = format!("{V1}\n[drain]\ncommand = [\"/usr/bin/cordon\", \"--evict\"]\n");
    let parsed = parse(&with).unwrap().config;
    let drain = parsed.drain.clone().unwrap();
    assert_eq!(drain.command, ["/usr/bin/cordon", "--evict"]);
    assert_eq!(drain.timeout_secs, 60, "the default timeout");
    let change = change(&parse(V1).unwrap().config, &parsed);
    assert_eq!(change.changed, ["drain"]);
    assert!(!change.reboot_required);
    for (text, field, words) in [
        (
            "[drain]\ncommand = []\n",
            "drain.command",
            "names no program",
        ),
        (
            "[drain]\ncommand = [\"cordon\"]\n",
            "drain.command",
            "\"cordon\" is not an absolute path",
        ),
        (
            "[drain]\ncommand = [\"/c\"]\ntimeout_secs = 0\n",
            "drain.timeout_secs",
            "0 is outside 1..=3600",
        ),
        (
            "[drain]\ncommand = [\"/c\"]\ntimeout_secs = 3601\n",
            "drain.timeout_secs",
            "3601 is outside",
        ),
        (
            "[drain]\ncommand = [\"/c\"]\ntimeout = 5\n",
            "drain.timeout",
            "unknown field",
        ),
        (
            "[drain]\ntimeout_secs = 5\n",
            "drain",
            "missing field `command`",
        ),
    ] {
        let err = parse(&format!("{V1}\n{text}")).unwrap_err();
        assert!(
            err.to_string().contains(field) && err.to_string().contains(words),
            "{text}: {err}"
        );
    }
}

#[test]
fn a_file_listed_twice_and_a_unit_given_twice_are_refused_by_field() {
    let twice = edited(
        "mode = 0o644",
        "mode = 0o644\n\n[[etc.files]]\npath = \"motd\"\ncontent = \"other\\n\"",
    );
    let err = refused(&twice);
    assert_eq!(err.field(), Some("etc.files[1].path"), "{err}");
    assert!(
        err.to_string()
            .contains("\"motd\" is etc.files[0].path already"),
        "{err}"
    );
    for (bad, why) in [
        ("1h1h1h", "the unit \"h\" comes twice"),
        ("30m1h", "comes after the smaller \"m\""),
        ("1hour 2 hours", "the unit \"hours\" comes twice"),
    ] {
        let err = refused(&edited(
            "poll_interval = \"15m\"",
            &format!("poll_interval = \"{bad}\""),
        ));
        assert_eq!(err.field(), Some("update.poll_interval"), "{bad}: {err}");
        assert!(err.to_string().contains(why), "{bad}: {err}");
    }
    for good in ["1h30m", "1h 30m 10s", "2days", "90m"] {
        assert!(duration(good).is_ok(), "{good}");
    }
}
