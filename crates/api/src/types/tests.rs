//! The wire shapes of the API types.
use super::*;

#[test]
fn modes_travel_by_their_command_line_names() {
    for mode in Mode::ALL {
        let json = serde_json::to_string(&mode).unwrap();
        assert_eq!(json, format!("\"{}\"", mode.as_str()));
        assert_eq!(serde_json::from_str::<Mode>(&json).unwrap(), mode);
    }
    assert!(serde_json::from_str::<Mode>(r#""metal_agent""#).is_err());
}

#[test]
fn reboot_modes_on_the_wire_are_default_powercycle_and_kexec_only() {
    for (mode, name) in [
        (RebootMode::Default, "default"),
        (RebootMode::Powercycle, "powercycle"),
        (RebootMode::Kexec, "kexec"),
    ] {
        assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<RebootRequest>(&format!(r#"{{"mode":"{name}"}}"#))
                .unwrap()
                .mode,
            mode
        );
    }
    // A reboot request must not power the node off, nor does the node ever report it.
    assert!(serde_json::from_str::<RebootRequest>(r#"{"mode":"poweroff"}"#).is_err());
    assert!(serde_json::from_str::<RebootMode>(r#""PowerOff""#).is_err());
    assert!(serde_json::to_string(&RebootMode::PowerOff).is_err());
    assert_eq!(RebootRequest::default().mode, RebootMode::Default);
}
