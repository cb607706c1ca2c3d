//! `api/openapi.yaml` describes exactly what the server serves: every route with its role, and
//! the same fields as the Rust types.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;
use serde_yaml::Value;
use slate_api::{
    Accepted, ApiError, ApplyConfigRequest, ApplyConfigResult, ApplyMode, ConfigView, ErrorCode,
    Event, EventKind, Failure, Mode, RebootMode, RebootRequest, RollbackRequest, RollbackResult,
    Stage, Status, UpgradeRequest, UploadedBundle, VersionInfo, ROUTES,
};

fn spec() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../api/openapi.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn schema<'a>(spec: &'a Value, name: &str) -> &'a Value {
    let s = &spec["components"]["schemas"][name];
    assert!(s.is_mapping(), "no schema {name}");
    s
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn property_names(schema: &Value) -> BTreeSet<String> {
    schema["properties"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect()
}

fn json_keys(value: &impl Serialize) -> BTreeSet<String> {
    match serde_json::to_value(value).unwrap() {
        serde_json::Value::Object(map) => map.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

fn json_strings<T: Serialize>(values: impl IntoIterator<Item = T>) -> BTreeSet<String> {
    values
        .into_iter()
        .map(|v| {
            serde_json::to_value(v)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// `properties` are the keys of `full`, `required` those of `minimal` (optional fields unset).
fn check_object(spec: &Value, name: &str, full: &impl Serialize, minimal: &impl Serialize) {
    let s = schema(spec, name);
    assert_eq!(property_names(s), json_keys(full), "{name} properties");
    assert_eq!(
        strings(&s["required"]),
        json_keys(minimal),
        "{name} required"
    );
}

#[test]
fn lists_exactly_the_served_routes_with_their_roles() {
    let spec = spec();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.0"));
    let mut documented = BTreeSet::new();
    for (path, item) in spec["paths"].as_mapping().unwrap() {
        for (method, op) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap().to_uppercase();
            let role = op["x-slate-role"].as_str().unwrap_or("<none>").to_owned();
            documented.insert((method, path.as_str().unwrap().to_owned(), role));
        }
    }
    let served: BTreeSet<_> = ROUTES
        .iter()
        .map(|r| {
            (
                r.method.to_owned(),
                r.path.to_owned(),
                r.role.as_str().to_owned(),
            )
        })
        .collect();
    assert_eq!(documented, served);
}

#[test]
fn schemas_match_the_types() {
    let spec = spec();
    let failure = Failure {
        version: "1".into(),
        reason: "r".into(),
    };
    let version = VersionInfo {
        version: "1".into(),
        arch: "amd64".into(),
        booted_entry: Some("e".into()),
        kernel: Some("k".into()),
    };
    let version_min = VersionInfo {
        booted_entry: None,
        kernel: None,
        ..version.clone()
    };
    check_object(&spec, "VersionInfo", &version, &version_min);
    let rollback_record = slate_api::RollbackRecord {
        from: "3.0.0".into(),
        to: "1.0.0".into(),
        reason: "r".into(),
        time: 1_764_600_000,
    };
    let status = Status {
        boot_id: Some("5f1c".into()),
        committed: true,
        last_rollback: Some(rollback_record.clone()),
        pinned: vec!["1.0.0".into()],
        secure_boot: Some(slate_api::SecureBootStatus {
            enabled: true,
            setup_mode: false,
            db: vec!["CN=owner db".into()],
        }),
        version: "1".into(),
        booted_entry: Some("e".into()),
        stage: Stage::Running,
        running_sequence: Some("Boot".into()),
        mode: Mode::Metal,
        staged_image: Some("i".into()),
        last_failure: Some(failure.clone()),
        node_name: Some("node1".into()),
        hostname: Some("node1".into()),
        machine_id: Some("0123".into()),
        agent: Some(slate_api::AgentStatus {
            strategy: "fleet-lock".into(),
            channel: "stable".into(),
            image: Some("10.0.2.2:5000/slate/os".into()),
            newest_available: Some("2.0.0".into()),
            target: Some("2.0.0".into()),
            state: "waiting".into(),
            reason: Some("window opens Tue 02:00".into()),
            skipped: vec!["1.9.0".into()],
        }),
        boot_times: Some(slate_api::BootTimes {
            firmware_us: Some(1_200_000),
            loader_us: Some(300_000),
            milestones: vec![slate_api::Milestone {
                name: "running".into(),
                at_us: 5_000_000,
            }],
            spans: vec![slate_api::BootSpan {
                sequence: "Boot".into(),
                phase: "network".into(),
                task: Some("network".into()),
                start_us: 4_000_000,
                took_us: 500_000,
                ok: true,
            }],
        }),
        memory: Some(slate_api::MemoryUse {
            rss_kib: 9_000,
            journal_bytes: 200_000,
        }),
        var: Some(slate_api::VarStatus {
            mode: "persistent".into(),
            encrypted: false,
            unlocked: Some("tpm2".into()),
            prepared: "mounted".into(),
        }),
        warnings: vec!["INSECURE machine configuration: …".into()],
    };
    let status_min = Status {
        booted_entry: None,
        running_sequence: None,
        staged_image: None,
        last_failure: None,
        node_name: None,
        hostname: None,
        machine_id: None,
        agent: None,
        boot_id: None,
        last_rollback: None,
        pinned: Vec::new(),
        secure_boot: None,
        boot_times: None,
        memory: None,
        var: None,
        warnings: Vec::new(),
        ..status.clone()
    };
    check_object(&spec, "Status", &status, &status_min);
    let var = status.var.clone().unwrap();
    let var_min = slate_api::VarStatus {
        unlocked: None,
        ..var.clone()
    };
    check_object(&spec, "VarStatus", &var, &var_min);
    let memory = status.memory.unwrap();
    check_object(&spec, "MemoryUse", &memory, &memory);
    let times = status.boot_times.clone().unwrap();
    let times_min = slate_api::BootTimes {
        firmware_us: None,
        loader_us: None,
        ..times.clone()
    };
    check_object(&spec, "BootTimes", &times, &times_min);
    check_object(
        &spec,
        "Milestone",
        &times.milestones[0],
        &times.milestones[0],
    );
    let span = times.spans[0].clone();
    let span_min = slate_api::BootSpan {
        task: None,
        ..span.clone()
    };
    check_object(&spec, "BootSpan", &span, &span_min);
    let secure_boot = status.secure_boot.clone().unwrap();
    let secure_boot_min = slate_api::SecureBootStatus {
        db: Vec::new(),
        ..secure_boot.clone()
    };
    check_object(&spec, "SecureBootStatus", &secure_boot, &secure_boot_min);
    check_object(&spec, "Failure", &failure, &failure);
    check_object(&spec, "RollbackRecord", &rollback_record, &rollback_record);
    let pinned = slate_api::PinResult {
        pinned: vec!["1.0.0".into()],
        changed: true,
        dry_run: false,
    };
    check_object(&spec, "PinResult", &pinned, &pinned);
    let snapshot_upgrade = slate_api::SnapshotUpgradeRequest {
        command: "true".into(),
        reboot: true,
        dry_run: false,
        tries: Some(1),
    };
    let s = schema(&spec, "SnapshotUpgradeRequest");
    assert_eq!(property_names(s), json_keys(&snapshot_upgrade));
    assert_eq!(
        strings(&s["required"]),
        BTreeSet::from(["command".to_owned()])
    );
    let pin = slate_api::PinRequest {
        version: "1.0.0".into(),
        pin: false,
        dry_run: true,
    };
    let s = schema(&spec, "PinRequest");
    assert_eq!(property_names(s), json_keys(&pin));
    assert_eq!(
        strings(&s["required"]),
        BTreeSet::from(["version".to_owned()])
    );
    assert!(
        serde_json::from_str::<slate_api::PinRequest>(r#"{"version":"1"}"#)
            .unwrap()
            .pin,
        "pin defaults to true"
    );
    let uploaded = UploadedBundle {
        id: "sha256:00".into(),
        name: "slate".into(),
        version: "2".into(),
        size: 1,
    };
    check_object(&spec, "UploadedBundle", &uploaded, &uploaded);
    let accepted = Accepted {
        operation: "reboot".into(),
    };
    check_object(&spec, "Accepted", &accepted, &accepted);
    let error = ApiError {
        code: ErrorCode::Locked,
        message: "m".into(),
    };
    check_object(&spec, "Error", &error, &error);

    // Requests: every field documented; `required` is what the server cannot default.
    let upgrade = UpgradeRequest::new("img");
    let s = schema(&spec, "UpgradeRequest");
    let full = UpgradeRequest {
        tries: Some(3),
        replace: true,
        ..upgrade.clone()
    };
    assert_eq!(property_names(s), json_keys(&full));
    assert_eq!(
        strings(&s["required"]),
        BTreeSet::from(["image".to_owned()])
    );
    assert_eq!(
        serde_json::from_str::<UpgradeRequest>(r#"{"image":"img"}"#).unwrap(),
        upgrade
    );
    assert!(serde_json::from_str::<UpgradeRequest>("{}").is_err());
    let s = schema(&spec, "RebootRequest");
    assert_eq!(property_names(s), json_keys(&RebootRequest::default()));
    assert!(strings(&s["required"]).is_empty());
    assert_eq!(
        serde_json::from_str::<RebootRequest>("{}").unwrap(),
        RebootRequest::default()
    );

    let rollback = RollbackRequest {
        dry_run: true,
        tries: Some(2),
        reboot_mode: RebootMode::Default,
    };
    let s = schema(&spec, "RollbackRequest");
    assert_eq!(property_names(s), json_keys(&rollback));
    assert!(strings(&s["required"]).is_empty());
    assert_eq!(
        serde_json::from_str::<RollbackRequest>("{}").unwrap(),
        RollbackRequest::default()
    );
    let rolled = RollbackResult {
        from: "slate-2.0.0.efi".into(),
        to: "slate-1.0.0+3.efi".into(),
        version: "1.0.0".into(),
        dry_run: false,
    };
    check_object(&spec, "RollbackResult", &rolled, &rolled);

    let apply = ApplyConfigRequest {
        config: "version = 1".into(),
        mode: ApplyMode::NoReboot,
        dry_run: true,
    };
    let s = schema(&spec, "ApplyConfigRequest");
    assert_eq!(property_names(s), json_keys(&apply));
    assert_eq!(
        strings(&s["required"]),
        BTreeSet::from(["config".to_owned()])
    );
    let result = ApplyConfigResult {
        changed: vec!["node.hostname".into()],
        reboot_required: false,
        outcome: "applied".into(),
    };
    check_object(&spec, "ApplyConfigResult", &result, &result);
    let view = ConfigView {
        config: serde_json::json!({}),
        migrated_from: Some(0),
        pending_reboot: false,
    };
    let view_min = ConfigView {
        migrated_from: None,
        ..view.clone()
    };
    check_object(&spec, "ConfigView", &view, &view_min);
    let service = slate_api::NodeServiceStatus {
        name: "web".into(),
        state: "backoff".into(),
        pid: Some(312),
        since: 1_796_425_139,
        restarts: 3,
        ready: false,
        last_exit: Some("exit code 1".into()),
        memory_bytes: Some(286_720),
        restart_in_ms: Some(2000),
    };
    let service_min = slate_api::NodeServiceStatus {
        pid: None,
        last_exit: None,
        memory_bytes: None,
        restart_in_ms: None,
        ..service.clone()
    };
    check_object(&spec, "NodeServiceStatus", &service, &service_min);
    let control = slate_api::ServiceControlRequest {
        name: "web".into(),
        action: slate_api::ServiceAction::Restart,
    };
    check_object(&spec, "ServiceControlRequest", &control, &control);

    let enums = [
        (
            "ApplyMode",
            json_strings([
                ApplyMode::Auto,
                ApplyMode::NoReboot,
                ApplyMode::Reboot,
                ApplyMode::Staged,
            ]),
        ),
        ("Stage", json_strings(Stage::ALL)),
        ("Mode", json_strings(Mode::ALL)),
        (
            "RebootMode",
            json_strings([
                RebootMode::Default,
                RebootMode::Powercycle,
                RebootMode::Kexec,
            ]),
        ),
    ];
    for (name, values) in enums {
        assert_eq!(strings(&schema(&spec, name)["enum"]), values, "{name}");
    }
    let codes = strings(&schema(&spec, "Error")["properties"]["code"]["enum"]);
    assert_eq!(codes, json_strings(ErrorCode::ALL));
    let operations = strings(&schema(&spec, "Accepted")["properties"]["operation"]["enum"]);
    // Every POST answers 202 Accepted, except the upload, which answers what it received, the
    // configuration, the rollback, the pins, the snapshot upgrade and a service's control,
    // which answer what they did.
    let mutating: BTreeSet<_> = ROUTES
        .iter()
        .filter(|r| {
            r.method == "POST"
                && ![
                    "/v1/bundles",
                    "/v1/config",
                    "/v1/rollback",
                    "/v1/pins",
                    "/v1/snapshots/upgrade",
                    "/v1/services",
                ]
                .contains(&r.path)
        })
        .map(|r| r.path.trim_start_matches("/v1/").to_owned())
        .collect();
    assert_eq!(operations, mutating);
}

#[test]
fn event_schemas_match_every_event_kind() {
    let spec = spec();
    let event = schema(&spec, "Event");
    let mapping = event["discriminator"]["mapping"].as_mapping().unwrap();
    let kinds = [
        EventKind::Stage {
            stage: Stage::Booting,
        },
        EventKind::SequenceStarted {
            sequence: "Boot".into(),
        },
        EventKind::PhaseStarted {
            sequence: "Boot".into(),
            phase: "mountState".into(),
        },
        EventKind::SequenceFinished {
            sequence: "Boot".into(),
            error: Some("failed".into()),
        },
    ];
    assert_eq!(mapping.len(), kinds.len());
    assert_eq!(event["oneOf"].as_sequence().unwrap().len(), kinds.len());
    for kind in kinds {
        let full = Event { unix_ms: 1, kind };
        let minimal = match &full.kind {
            EventKind::SequenceFinished { sequence, .. } => Event {
                unix_ms: 1,
                kind: EventKind::SequenceFinished {
                    sequence: sequence.clone(),
                    error: None,
                },
            },
            _ => full.clone(),
        };
        let json = serde_json::to_value(&full).unwrap();
        let tag = json["type"].as_str().unwrap();
        let target = mapping[tag].as_str().unwrap();
        let name = target.rsplit('/').next().unwrap();
        check_object(&spec, name, &full, &minimal);
        let type_enum = strings(&schema(&spec, name)["properties"]["type"]["enum"]);
        assert_eq!(type_enum, BTreeSet::from([tag.to_owned()]));
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, full);
    }
}
