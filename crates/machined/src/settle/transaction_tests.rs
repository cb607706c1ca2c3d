use super::*;

fn outcome(blessed: &str, previous: Option<&str>) -> CommitOutcome {
    CommitOutcome {
        blessed: blessed.into(),
        previous: previous.map(str::to_owned),
    }
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn the_slot_comes_from_the_kernel_command_line() {
    let cmdline = "BOOT_IMAGE=/A/vmlinuz console=ttyS0 slate.slot=B quiet";
    assert_eq!(slot_from_cmdline(cmdline).as_deref(), Some("B"));
    assert_eq!(slot_from_cmdline("console=ttyS0 panic=0"), None);
    // A prefix of the key is another key.
    assert_eq!(slot_from_cmdline("xslate.slot=A"), None);
}

#[test]
fn after_a_kexec_the_command_line_names_the_entry_not_the_stale_variable() {
    // The kexec started v2's first try; the firmware had started v1.
    let selected = Some("slate-1.0.0.efi".to_owned());
    let cmdline = "console=ttyS0 slate.entry=slate-2.0.0+2-1.efi";
    assert_eq!(
        booted_entry_at_start(cmdline, selected.clone()).as_deref(),
        Some("slate-2.0.0+2-1.efi")
    );
    // A firmware boot: systemd-boot's variable.
    assert_eq!(
        booted_entry_at_start("console=ttyS0", selected.clone()),
        selected
    );
    assert_eq!(booted_entry_at_start("console=ttyS0", None), None);
}

#[test]
fn a_commit_names_the_counted_entry_it_renamed() {
    let before = names(&["slate-2.0.0+2-1.efi"]);
    let after = names(&["slate-1.0.0.efi", "slate-2.0.0.efi"]);
    assert_eq!(
        committed_line(
            &before,
            &after,
            "slate-2.0.0+2-1.efi",
            &outcome("slate-2.0.0.efi", Some("slate-1.0.0.efi"))
        ),
        "committed: slate-2.0.0+2-1.efi blessed as slate-2.0.0.efi; \
         upgrade marker (fallback slate-1.0.0.efi) dropped"
    );
}

#[test]
fn a_commit_that_renamed_nothing_names_the_booted_entry() {
    // GRUB: slots are never renamed, and no upgrade was pending.
    let slots = names(&["A", "B"]);
    assert_eq!(
        committed_line(&[], &slots, "A", &outcome("A", None)),
        "committed: A blessed as A"
    );
    // systemd-bless-boot renamed it before the commit ran: the commit only drops the marker.
    let after = names(&["slate-1.0.0.efi", "slate-2.0.0.efi"]);
    assert_eq!(
        committed_line(
            &[],
            &after,
            "slate-2.0.0+2-1.efi",
            &outcome("slate-2.0.0.efi", Some("slate-1.0.0.efi"))
        ),
        "committed: slate-2.0.0+2-1.efi already blessed as slate-2.0.0.efi; \
         upgrade marker (fallback slate-1.0.0.efi) dropped"
    );
    // A counted entry that is still there was not the one blessed.
    let still = names(&["slate-3.0.0+0-3.efi"]);
    assert_eq!(
        committed_line(&still, &still, "B", &outcome("B", Some("A"))),
        "committed: B blessed as B; upgrade marker (fallback A) dropped"
    );
}

#[test]
fn the_failure_record_is_the_api_failure_as_json() {
    let json = failure_record("2.0.0", "health check `file /x` failed").unwrap();
    assert_eq!(
        serde_json::from_str::<slate_api::Failure>(&json).unwrap(),
        slate_api::Failure {
            version: "2.0.0".into(),
            reason: "health check `file /x` failed".into()
        }
    );
}

#[test]
fn a_long_failure_reason_is_cut_to_fit_meta() {
    let reason = "x".repeat(5000);
    let json = failure_record("2.0.0", &reason).unwrap();
    assert!(json.len() <= 4096, "{}", json.len());
    let failure: slate_api::Failure = serde_json::from_str(&json).unwrap();
    assert_eq!(failure.reason, "x".repeat(3000));
    // Cut by characters, never inside one.
    let failure: slate_api::Failure =
        serde_json::from_str(&failure_record("2.0.0", &"é".repeat(5000)).unwrap()).unwrap();
    assert_eq!(failure.reason, "é".repeat(3000));
    // Below the limit it is kept whole.
    let reason = "x".repeat(4000);
    let failure: slate_api::Failure =
        serde_json::from_str(&failure_record("2.0.0", &reason).unwrap()).unwrap();
    assert_eq!(failure.reason, reason);
}

/// Writing is left to the VM scenarios (OVMF's variables): a test here must not change the
/// build machine's own firmware settings. Removing what is not there writes nothing.
#[test]
fn removing_an_absent_variable_is_no_write() {
    let mut vars = FirmwareVars;
    assert!(vars.remove("SlateNoSuchVariableForTests").is_ok());
}

#[test]
fn settle_errors_display_their_reason() {
    assert_eq!(
        SettleError::Unhealthy("check x".into()).to_string(),
        "check x"
    );
    assert_eq!(SettleError::Failed("no META".into()).to_string(), "no META");
}

fn entry(file_name: &str, version: &str, state: slate_bootspec::BootState) -> EntryStatus {
    EntryStatus {
        file_name: file_name.into(),
        version: Some(version.into()),
        state,
        len: 1,
    }
}

/// Boot counting brought v1 back: the version that did not come up is the bad one, named
/// in the rollback record; entry references resolve with or without their counters.
#[test]
fn the_failed_version_is_the_bad_other_one_the_newest_first() {
    use slate_bootspec::BootState::{Bad, Good};
    let entries = [
        entry("slate-1.0.0.efi", "1.0.0", Good),
        entry("slate-3.0.0+0-3.efi", "3.0.0", Bad),
        entry("slate-2.0.0+0-3.efi", "2.0.0", Bad),
        entry("slate-0.9.0.efi", "0.9.0", Good),
    ];
    assert_eq!(
        failed_version(&entries, "slate-1.0.0.efi", "1.0.0").as_deref(),
        Some("3.0.0")
    );
    assert_eq!(
        version_of(&entries, "slate-3.0.0+1-2.efi").as_deref(),
        Some("3.0.0")
    );
    assert_eq!(version_of(&entries, "slate-7.efi"), None);
    // GRUB: two slots, the other one is the version that failed.
    let slots = [entry("A", "1.0.0", Good), entry("B", "2.0.0", Good)];
    assert_eq!(
        failed_version(&slots, "A", "1.0.0").as_deref(),
        Some("2.0.0")
    );
    assert_eq!(failed_version(&slots[..1], "A", "1.0.0"), None);
}
