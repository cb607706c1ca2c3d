//! Runtime modes: names and the capability mask of each.

use slate_sequencer::{Capabilities, Mode};

#[test]
fn capability_mask_per_mode() {
    let host_only = Capabilities::REBOOT
        | Capabilities::ROLLBACK
        | Capabilities::SHUTDOWN
        | Capabilities::UPGRADE
        | Capabilities::META_KV;
    assert_eq!(host_only, Capabilities::ALL);
    let expected = [
        (Mode::Cloud, Capabilities::ALL),
        (Mode::Container, Capabilities::NONE),
        (Mode::Metal, Capabilities::ALL),
        (Mode::MetalAgent, Capabilities::ALL),
    ];
    for (mode, mask) in expected {
        assert_eq!(mode.capabilities(), mask, "{mode}");
        for flag in [
            Capabilities::REBOOT,
            Capabilities::ROLLBACK,
            Capabilities::SHUTDOWN,
            Capabilities::UPGRADE,
            Capabilities::META_KV,
        ] {
            assert_eq!(
                mode.supports(flag),
                mode != Mode::Container,
                "{mode} {flag:?}"
            );
        }
    }
    assert_eq!(Capabilities::ALL.bits(), 0b1_1111);
    assert_eq!(
        format!("{:?}", Capabilities::REBOOT | Capabilities::META_KV),
        "Capabilities(Reboot | MetaKV)"
    );
}

#[test]
fn mode_names_parse_exactly() {
    for mode in Mode::ALL {
        assert_eq!(Mode::parse(mode.as_str()), Ok(mode));
        assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
    }
    assert_eq!(Mode::parse("metal-agent"), Ok(Mode::MetalAgent));
    assert!(Mode::parse("Metal").is_err());
    assert!(Mode::parse("metal_agent").is_err());
    assert!(Mode::parse("").is_err());
}

#[test]
fn mode_predicates() {
    assert!(Mode::Metal.requires_install());
    assert!(!Mode::Cloud.requires_install());
    assert!(!Mode::MetalAgent.requires_install());
    assert!(Mode::Container.in_container());
    assert!(Mode::MetalAgent.is_agent());
}
