//! The policy file: what is accepted, and every way it is refused before anything is stored.

use slate_rollout::{Limit, PolicyError, PolicySet, Strategy};

const FULL: &str = r#"
[[policy]]
name = "workers"
groups = ["workers"]
labels = { zone = "a" }
channel = "beta"
strategy = "replace"
max_unavailable = "10%"
rate = "20/hour"
windows = [{ days = ["sat", "sun"], start = "22:00", length = "6h" }]
waves = [{ percent = 1, soak = "10m" }, { percent = 10, soak = "30m" }, { percent = 100 }]
failure_budget = 3
quorum = true
probe = "http://{host}:8080/healthz"
upgrade_timeout = "20m"

[[policy]]
name = "everything"
max_unavailable = "2"
"#;

#[test]
fn a_full_policy_file_is_understood() {
    let set = PolicySet::parse(FULL).unwrap();
    let p = &set.policies[0];
    assert_eq!(p.max_unavailable, Some(Limit::Percent(10)));
    assert_eq!(p.rate.unwrap().starts, 20);
    assert_eq!(p.rate.unwrap().per_seconds, 3600);
    assert_eq!(p.waves.len(), 3);
    assert_eq!(p.waves[1].soak.as_secs(), 1800);
    assert_eq!(p.strategy, Some(Strategy::Replace));
    assert_eq!(set.policies[1].max_unavailable, Some(Limit::Count(2)));
    assert!(set.policies[1].groups.is_empty());
}

#[test]
fn every_bad_field_is_refused_naming_policy_and_field() {
    let cases: &[(&str, &str)] = &[
        ("max_unavailable = \"0%\"", "max_unavailable"),
        ("max_unavailable = \"120%\"", "max_unavailable"),
        ("max_unavailable = \"many\"", "max_unavailable"),
        ("rate = \"5/week\"", "rate"),
        ("rate = \"0/hour\"", "rate"),
        ("channel = \"nightly\"", "channel"),
        ("strategy = \"rebuild\"", "strategy"),
        ("failure_budget = 0", "failure_budget"),
        ("probe = \"ftp://x\"", "probe"),
        ("probe = \"https://{host}/healthz\"", "probe"),
        ("probe = \"http:///healthz\"", "probe"),
        ("upgrade_timeout = \"soon\"", "upgrade_timeout"),
        // A unit twice is a typo, not a sum (issue 44).
        ("upgrade_timeout = \"1h1h1h\"", "upgrade_timeout"),
        ("waves = [{ percent = 100, soak = \"10m30m\" }]", "waves"),
        (
            "waves = [{ percent = 10 }, { percent = 5 }, { percent = 100 }]",
            "waves",
        ),
        ("waves = [{ percent = 10 }, { percent = 50 }]", "waves"),
        ("waves = [{ percent = 100, soak = \"forever\" }]", "waves"),
        (
            "windows = [{ days = [\"someday\"], start = \"02:00\", length = \"1h\" }]",
            "windows",
        ),
        (
            "windows = [{ days = [\"mon\"], start = \"25:00\", length = \"1h\" }]",
            "windows",
        ),
    ];
    for (line, field) in cases {
        let text = format!("[[policy]]\nname = \"p\"\n{line}\n");
        match PolicySet::parse(&text) {
            Err(PolicyError::Invalid {
                policy, field: f, ..
            }) => {
                assert_eq!(policy, "p", "{line}");
                assert_eq!(f, *field, "{line}");
            }
            other => panic!("{line}: {other:?}"),
        }
    }
}

#[test]
fn unknown_keys_syntax_and_duplicates_are_refused() {
    assert!(matches!(
        PolicySet::parse("[[policy]]\nname = \"p\"\nmax_unavailble = \"1\"\n"),
        Err(PolicyError::Syntax(e)) if e.contains("max_unavailble")
    ));
    assert!(matches!(
        PolicySet::parse("[[policy]\n"),
        Err(PolicyError::Syntax(_))
    ));
    assert_eq!(
        PolicySet::parse("[[policy]]\nname = \"p\"\n[[policy]]\nname = \"p\"\n"),
        Err(PolicyError::Duplicate("p".into()))
    );
    assert!(PolicySet::parse("").unwrap().policies.is_empty());
}

#[test]
fn combined_settings_take_the_safer_choice() {
    let set = PolicySet::parse(
        r#"
[[policy]]
name = "a"
channel = "alpha"
strategy = "replace"
upgrade_timeout = "1h"
allow_unofficial = true
[[policy]]
name = "b"
groups = ["db"]
channel = "stable"
strategy = "in-place"
upgrade_timeout = "10m"
"#,
    )
    .unwrap();
    let mut db = slate_rollout::NodeReport {
        id: "n".into(),
        group: "db".into(),
        labels: Default::default(),
        endpoint: "n:1".into(),
        version: "1".into(),
        channel: "alpha".into(),
        committed: true,
        healthy: true,
        busy: false,
        last_failure: None,
        sent_at_ms: 0,
    };
    assert_eq!(set.channel_of(&db), Some(slate_release::Channel::Stable));
    assert_eq!(set.strategy_of(&db), Strategy::InPlace);
    assert_eq!(set.upgrade_timeout_of(&db).as_secs(), 600);
    assert!(!set.allows_unofficial(&db));
    db.group = "web".into();
    assert_eq!(set.channel_of(&db), Some(slate_release::Channel::Alpha));
    assert_eq!(set.strategy_of(&db), Strategy::Replace);
    assert!(set.allows_unofficial(&db));
}

#[test]
fn a_probe_url_names_the_nodes_host() {
    use slate_rollout::probe_target;
    assert_eq!(
        probe_target("http://{host}:8080/healthz", "10.0.0.7"),
        Some(("10.0.0.7:8080".into(), "/healthz".into()))
    );
    assert_eq!(
        probe_target("http://lb.example/{host}", "n1"),
        Some(("lb.example:80".into(), "/n1".into()))
    );
    assert_eq!(probe_target("https://{host}/", "n1"), None);
}
