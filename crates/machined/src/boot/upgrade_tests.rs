use super::*;

#[test]
fn bundle_ids_are_canonical_digests() {
    let hex = "ab".repeat(32);
    let id = bundle_id(&format!("bundle:sha256:{hex}")).unwrap();
    assert_eq!(bundle_dir(&id), Path::new(BUNDLES_DIR).join(&hex));
    // Upper case used to pass the filter and then name no directory.
    for bad in [
        format!("bundle:sha256:{}", hex.to_uppercase()),
        "bundle:sha256:00".into(),
        format!("bundle:sha512:{hex}{hex}"),
        format!("sha256:{hex}"),
        format!("bundle:{hex}"),
    ] {
        assert!(bundle_id(&bad).is_err(), "{bad}");
        let staged = Staged {
            image: bad.clone(),
            options: StagedOptions {
                version: "2.0.0".into(),
                tries: 3,
                allow_downgrade: false,
            },
        };
        assert!(staged_plan(&staged).is_err(), "{bad}");
    }
    let err = locate(&format!("bundle:sha256:{}", hex.to_uppercase())).unwrap_err();
    assert!(err.to_string().contains("not a bundle id"), "{err}");
}

/// issue 18: `tries` of the API's upgrade request once went unchecked into the installer's
/// `--tries`, and `slate-2.0.0+3000000000.efi` is never rolled back. Now it is a 400.
#[test]
fn upgrade_tries_out_of_range_are_a_bad_request() {
    let hex = "ab".repeat(32);
    let req = |tries| slate_api::UpgradeRequest {
        tries,
        ..slate_api::UpgradeRequest::new(format!("bundle:sha256:{hex}"))
    };
    assert_eq!(requested_tries(&req(None)).unwrap(), DEFAULT_TRIES);
    assert_eq!(requested_tries(&req(Some(1))).unwrap(), 1);
    assert_eq!(requested_tries(&req(Some(15))).unwrap(), 15);
    for bad in [0, 16, 3_000_000_000, u32::MAX] {
        match requested_tries(&req(Some(bad))) {
            Err(BackendError::InvalidArgument(message)) => assert!(
                message.starts_with(&format!(
                    "the upgrade is refused: {bad} boot-counting tries is not 1 to 15"
                )),
                "{message}"
            ),
            other => panic!("{bad}: {other:?}"),
        }
    }
    let staged = |tries| Staged {
        image: format!("bundle:sha256:{hex}"),
        options: StagedOptions {
            version: "2.0.0".into(),
            tries,
            allow_downgrade: false,
        },
    };
    assert_eq!(staged_plan(&staged(3)).unwrap().tries, 3);
    let err = staged_plan(&staged(3_000_000_000)).unwrap_err();
    assert!(err.contains("3000000000 boot-counting tries"), "{err}");
}

#[test]
fn under_systemd_only_a_machine_booted_from_slates_uki_is_upgraded() {
    use crate::boot::upgrade::booted_through_slate;
    booted_through_slate(Some("slate-1.0.0+2-1.efi")).unwrap();
    booted_through_slate(Some("slate-2.0.0.efi")).unwrap();
    let err = booted_through_slate(Some("debian-12.conf")).unwrap_err();
    assert!(
        err.contains("\"debian-12.conf\", not one of slate's UKIs"),
        "{err}"
    );
    let err = booted_through_slate(None).unwrap_err();
    assert!(err.contains("no LoaderEntrySelected"), "{err}");
}
