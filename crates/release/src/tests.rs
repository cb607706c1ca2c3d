use super::*;

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

fn release(version: &str, channel: Channel, min_from: Option<&str>) -> Release {
    Release {
        version: version.into(),
        digest: digest(version.bytes().map(u32::from).sum::<u32>() as u8),
        created: "2026-12-01T00:00:00Z".into(),
        channel,
        official: true,
        min_from: min_from.map(String::from),
        yanked: None,
    }
}

fn index(releases: &[Release]) -> ReleaseIndex {
    let mut index = ReleaseIndex::default();
    for r in releases {
        index.publish(r.clone()).unwrap();
    }
    index
}

fn chosen(index: &ReleaseIndex, channel: Channel, running: &str, policy: &Policy<'_>) -> String {
    match choose(index, channel, running, policy) {
        Choice::Upgrade(r) => r.version.clone(),
        Choice::Hold(hold) => format!("hold: {hold}"),
    }
}

#[test]
fn channels_nest_stable_in_beta_in_alpha() {
    let idx = index(&[
        release("1.0.0", Channel::Stable, None),
        release("1.1.0", Channel::Beta, None),
        release("1.2.0", Channel::Alpha, None),
    ]);
    let seen = |c| {
        idx.visible(c)
            .map(|r| r.version.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(seen(Channel::Stable), ["1.0.0"]);
    assert_eq!(seen(Channel::Beta), ["1.0.0", "1.1.0"]);
    assert_eq!(seen(Channel::Alpha), ["1.0.0", "1.1.0", "1.2.0"]);
}

#[test]
fn promotion_goes_forward_only_and_a_version_never_changes_its_bundle() {
    let mut idx = index(&[release("2.0.0", Channel::Beta, None)]);
    assert_eq!(
        idx.publish(release("2.0.0", Channel::Stable, None)),
        Ok(Published::Promoted {
            from: Channel::Beta,
            to: Channel::Stable
        })
    );
    assert_eq!(
        idx.publish(release("2.0.0", Channel::Stable, None)),
        Ok(Published::Unchanged)
    );
    let before = idx.clone();
    assert!(matches!(
        idx.publish(release("2.0.0", Channel::Alpha, None)),
        Err(ReleaseError::Demotion { .. })
    ));
    let mut other = release("2.0.0", Channel::Stable, None);
    other.digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    assert!(matches!(
        idx.publish(other),
        Err(ReleaseError::DigestConflict { .. })
    ));
    assert_eq!(idx, before, "a refused publish changes nothing");
}

#[test]
fn releases_stay_in_version_order_and_round_trip() {
    let idx = index(&[
        release("1.10.0", Channel::Stable, Some("1.2.0")),
        release("1.2.0", Channel::Stable, None),
        release("1.9.0", Channel::Beta, None),
    ]);
    let versions: Vec<_> = idx.releases.iter().map(|r| r.version.as_str()).collect();
    assert_eq!(versions, ["1.2.0", "1.9.0", "1.10.0"]);
    assert_eq!(ReleaseIndex::parse(idx.to_json().as_bytes()), Ok(idx));
}

#[test]
fn malformed_indexes_are_refused_with_a_reason() {
    let refused = |text: &str| ReleaseIndex::parse(text.as_bytes()).unwrap_err();
    assert!(matches!(refused("{"), ReleaseError::Malformed(_)));
    assert_eq!(
        refused(r#"{"schema":2,"releases":[]}"#),
        ReleaseError::Schema(2)
    );
    let one = |fields: &str| {
        format!(
            r#"{{"schema":1,"releases":[{{"version":"1.0.0","digest":"{}","created":"2026-12-01T00:00:00Z","channel":"stable"{fields}}}]}}"#,
            digest(1)
        )
    };
    assert!(matches!(
        refused(&one(r#","extra":1"#)),
        ReleaseError::Malformed(_)
    ));
    assert!(matches!(
        refused(&one(r#","min_from":"2.0.0""#)),
        ReleaseError::MinFrom { .. }
    ));
    assert!(matches!(
        refused(&one("").replace("stable", "nightly")),
        ReleaseError::Malformed(_)
    ));
    assert!(matches!(
        refused(&one("").replace(&digest(1), "sha256:AB")),
        ReleaseError::BadDigest { .. }
    ));
    assert!(matches!(
        refused(&one("").replace("1.0.0", "1.0.0;rm")),
        ReleaseError::BadVersion { .. }
    ));
    let twice = format!(
        r#"{{"schema":1,"releases":[{r},{r}]}}"#,
        r = format!(
            r#"{{"version":"1.0","digest":"{}","created":"2026-12-01T00:00:00Z","channel":"beta"}}"#,
            digest(1)
        )
    );
    assert_eq!(refused(&twice), ReleaseError::Duplicate("1.0".into()));
    assert!(matches!(
        ReleaseIndex::parse(&vec![b' '; MAX_INDEX_BYTES + 1]),
        Err(ReleaseError::TooLarge { .. })
    ));
}

#[test]
fn the_newest_allowed_release_is_chosen_never_a_downgrade() {
    let idx = index(&[
        release("1.0.0", Channel::Stable, None),
        release("2.0.0", Channel::Stable, None),
        release("2.1.0", Channel::Beta, None),
    ]);
    let none = Policy::default();
    assert_eq!(chosen(&idx, Channel::Stable, "1.0.0", &none), "2.0.0");
    assert_eq!(chosen(&idx, Channel::Beta, "1.0.0", &none), "2.1.0");
    assert_eq!(
        chosen(&idx, Channel::Stable, "2.0.0", &none),
        "hold: up to date"
    );
    // A node ahead of its channel stays where it is.
    assert_eq!(
        chosen(&idx, Channel::Stable, "2.1.0", &none),
        "hold: up to date"
    );
}

#[test]
fn a_barrier_is_crossed_through_an_intermediate_release() {
    let idx = index(&[
        release("1.0.0", Channel::Stable, None),
        release("1.5.0", Channel::Stable, None),
        release("2.0.0", Channel::Stable, Some("1.5.0")),
    ]);
    let none = Policy::default();
    assert_eq!(chosen(&idx, Channel::Stable, "1.0.0", &none), "1.5.0");
    assert_eq!(chosen(&idx, Channel::Stable, "1.5.0", &none), "2.0.0");
    // Without the intermediate the node waits, and says why.
    let mut blocked = idx.clone();
    blocked.yank("1.5.0", "bad").unwrap();
    assert_eq!(
        chosen(&blocked, Channel::Stable, "1.0.0", &none),
        "hold: 2.0.0 upgrades only from 1.5.0 or newer, and nothing leads there from 1.0.0"
    );
}

#[test]
fn yanked_versions_are_never_chosen_and_nodes_on_them_move_on() {
    let mut idx = index(&[
        release("1.0.0", Channel::Stable, None),
        release("2.0.0", Channel::Stable, None),
        release("3.0.0", Channel::Stable, None),
    ]);
    idx.yank("3.0.0", "eats disks").unwrap();
    // Idempotent, the first reason stays.
    idx.yank("3.0.0", "again").unwrap();
    assert_eq!(
        idx.get("3.0.0").unwrap().yanked.as_deref(),
        Some("eats disks")
    );
    assert_eq!(
        idx.yank("9.9", "x").unwrap_err(),
        ReleaseError::NotFound("9.9".into())
    );
    let none = Policy::default();
    assert_eq!(chosen(&idx, Channel::Stable, "1.0.0", &none), "2.0.0");
    assert_eq!(
        chosen(&idx, Channel::Stable, "2.0.0", &none),
        "hold: up to date"
    );
    // A yanked version cannot come back.
    assert!(matches!(
        idx.publish(idx.get("3.0.0").unwrap().clone()),
        Err(ReleaseError::Yanked { .. })
    ));
    idx.publish(release("3.0.1", Channel::Stable, None))
        .unwrap();
    idx.yank("2.0.0", "oops").unwrap();
    assert_eq!(chosen(&idx, Channel::Stable, "2.0.0", &none), "3.0.1");
}

#[test]
fn pin_and_max_version_limit_the_choice() {
    let idx = index(&[
        release("1.0.0", Channel::Stable, None),
        release("1.5.0", Channel::Stable, None),
        release("2.0.0", Channel::Stable, Some("1.5.0")),
        release("3.0.0", Channel::Stable, None),
    ]);
    let max = Policy {
        max_version: Some("2.0.0"),
        ..Policy::default()
    };
    assert_eq!(chosen(&idx, Channel::Stable, "1.5.0", &max), "2.0.0");
    assert_eq!(
        chosen(&idx, Channel::Stable, "2.0.0", &max),
        "hold: up to date"
    );
    let pin = Policy {
        pin: Some("2.0.0"),
        ..Policy::default()
    };
    // Towards the pin through the barrier, then stay.
    assert_eq!(chosen(&idx, Channel::Stable, "1.0.0", &pin), "1.5.0");
    assert_eq!(chosen(&idx, Channel::Stable, "1.5.0", &pin), "2.0.0");
    assert_eq!(
        chosen(&idx, Channel::Stable, "2.0.0", &pin),
        "hold: pinned to 2.0.0"
    );
    // A pin below the running version is never a downgrade.
    assert_eq!(
        chosen(&idx, Channel::Stable, "3.0.0", &pin),
        "hold: pinned to 2.0.0, which channel stable does not offer"
    );
    let absent = Policy {
        pin: Some("2.5.0"),
        ..Policy::default()
    };
    assert_eq!(
        chosen(&idx, Channel::Stable, "1.5.0", &absent),
        "hold: pinned to 2.5.0, which channel stable does not offer"
    );
}

#[test]
fn the_agent_gives_up_on_a_version_after_three_reverts() {
    let idx = index(&[
        release("1.0.0", Channel::Stable, None),
        release("2.0.0", Channel::Stable, None),
        release("2.1.0", Channel::Stable, None),
    ]);
    let mut failures = FailureCounter::default();
    assert!(!failures.record_revert("2.1.0"));
    assert!(!failures.record_revert("2.1.0"));
    let skip = failures.skipped();
    let policy = Policy {
        skip: &skip,
        ..Policy::default()
    };
    assert_eq!(chosen(&idx, Channel::Stable, "2.0.0", &policy), "2.1.0");
    assert!(failures.record_revert("2.1.0"));
    let skip = failures.skipped();
    let policy = Policy {
        skip: &skip,
        ..Policy::default()
    };
    assert_eq!(
        chosen(&idx, Channel::Stable, "2.0.0", &policy),
        "hold: up to date"
    );
    assert_eq!(
        failures.describe("2.1.0").as_deref(),
        Some("2.1.0 reverted 3 times: skipped")
    );
    // Once the node is past it, the count is forgotten.
    failures.forget_up_to("2.1.0");
    assert!(failures.skipped().is_empty());
}

#[test]
fn versions_compare_as_uapi_does() {
    assert_eq!(compare("1.10.0", "1.9.0"), Ordering::Greater);
    assert_eq!(compare("2.0.0~rc1", "2.0.0"), Ordering::Less);
    assert_eq!(Channel::parse("beta"), Ok(Channel::Beta));
    assert!(Channel::parse("nightly").is_err());
}

fn document(version: &str, created: &str) -> String {
    format!(
        r#"{{"schema":1,"releases":[{{"version":"{version}","digest":"{}","created":"{created}","channel":"stable"}}]}}"#,
        digest(1)
    )
}

#[test]
fn a_version_named_like_one_of_slates_tags_is_refused() {
    for reserved in ["releases", "alpha", "beta", "stable", "sha256-0a.sig"] {
        assert_eq!(
            ReleaseIndex::parse(document(reserved, "2026-12-01T00:00:00Z").as_bytes()),
            Err(ReleaseError::ReservedVersion {
                version: reserved.into()
            }),
            "{reserved}"
        );
        let mut idx = ReleaseIndex::default();
        let mut r = release("1.0.0", Channel::Stable, None);
        r.version = reserved.into();
        assert!(idx.publish(r).is_err(), "{reserved}");
        assert_eq!(idx, ReleaseIndex::default());
    }
    // Near misses are versions like any other.
    for fine in ["releases2", "stable-1", "sha256-0a.sig1"] {
        assert!(
            ReleaseIndex::parse(document(fine, "2026-12-01T00:00:00Z").as_bytes()).is_ok(),
            "{fine}"
        );
    }
}

#[test]
fn created_must_be_rfc_3339_in_utc() {
    for bad in [
        "yesterday",
        "",
        "2026-12-01",
        "2026-13-01T00:00:00Z",
        "2026-12-01 00:00:00",
        "1796083200",
        "2026-12-01T00:00:00+01:00",
    ] {
        let err = ReleaseIndex::parse(document("1.0.0", bad).as_bytes()).unwrap_err();
        assert_eq!(
            err,
            ReleaseError::BadCreated {
                version: "1.0.0".into(),
                created: bad.into()
            },
            "{bad}"
        );
        assert!(err.to_string().contains("is not an RFC 3339 time"), "{err}");
    }
    for good in ["2026-12-01T00:00:00Z", "2026-12-01T00:00:00.5Z"] {
        assert!(
            ReleaseIndex::parse(document("1.0.0", good).as_bytes()).is_ok(),
            "{good}"
        );
    }
}
