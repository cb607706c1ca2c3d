//! loader.conf parsing: what systemd-boot reads, and clear refusals of what it would ignore.

use proptest::prelude::*;
use slate_bootspec::{parse_loader_conf, LoaderConf, LoaderConfError, Timeout};

#[test]
fn slate_and_talos_files() {
    let conf = parse_loader_conf("timeout 3\ndefault slate-*\n").unwrap();
    assert_eq!(conf.timeout, Some(Timeout::Seconds(3)));
    assert_eq!(conf.default.as_deref(), Some("slate-*"));
    assert!(conf.other.is_empty());

    let talos = parse_loader_conf("timeout 10\n").unwrap();
    assert_eq!(
        talos,
        LoaderConf {
            timeout: Some(Timeout::Seconds(10)),
            ..LoaderConf::default()
        }
    );
    assert_eq!(parse_loader_conf("").unwrap(), LoaderConf::default());
}

#[test]
fn syntax_details() {
    let text = "# comment\r\n\r\n  timeout\tmenu-hidden  \r\neditor no\nconsole-mode  max\n\
                default \"Slate-*.efi\"\nTimeout 5\ndefault @Saved\ntimeout menu-force\n";
    let conf = parse_loader_conf(text).unwrap();
    assert_eq!(conf.timeout, Some(Timeout::MenuForce), "last one wins");
    assert_eq!(conf.default.as_deref(), Some("@Saved"));
    assert_eq!(
        conf.other,
        [
            ("editor".to_owned(), "no".to_owned()),
            ("console-mode".to_owned(), "max".to_owned()),
            ("Timeout".to_owned(), "5".to_owned()), // keys are case-sensitive
        ]
    );
    let conf = parse_loader_conf("default \"Slate-*.efi\"").unwrap();
    assert_eq!(conf.default.as_deref(), Some("Slate-*.efi"), "unquoted");
    assert_eq!(
        parse_loader_conf("timeout menu-disabled").unwrap().timeout,
        Some(Timeout::MenuDisabled)
    );
    assert_eq!(
        parse_loader_conf("timeout 0").unwrap().timeout,
        Some(Timeout::Seconds(0))
    );
}

#[test]
fn refusals_name_the_line() {
    let cases: [(&str, LoaderConfError); 5] = [
        (
            "timeout 3\ndefault\n",
            LoaderConfError::MissingValue {
                line: 2,
                key: "default".into(),
            },
        ),
        (
            "\n\ntimeout 3s\n",
            LoaderConfError::InvalidTimeout {
                line: 3,
                value: "3s".into(),
            },
        ),
        (
            "timeout 4294967296",
            LoaderConfError::InvalidTimeout {
                line: 1,
                value: "4294967296".into(),
            },
        ),
        (
            "default @last",
            LoaderConfError::UnsupportedDefault {
                line: 1,
                value: "@last".into(),
            },
        ),
        (
            "timeout 3\r\ndefault a\0b",
            LoaderConfError::Nul { line: 2 },
        ),
    ];
    for (text, err) in cases {
        assert_eq!(parse_loader_conf(text), Err(err.clone()), "{text:?}");
        let message = err.to_string();
        assert!(message.starts_with("loader.conf line "), "{message}");
    }
}

proptest! {
    #[test]
    fn parse_never_panics(text in any::<String>()) {
        let _ = parse_loader_conf(&text);
    }

    #[test]
    fn written_settings_read_back(secs in any::<u32>(), glob in "[a-z0-9*?.+_-]{1,20}") {
        let conf = parse_loader_conf(&format!("timeout {secs}\ndefault {glob}\n")).unwrap();
        prop_assert_eq!(conf.timeout, Some(Timeout::Seconds(secs)));
        prop_assert_eq!(conf.default, Some(glob));
    }
}
