//! The index manifest's shape and refusals, and the channel heads: no registry needed.

use super::*;

fn release(version: &str, n: u8, channel: Channel, yanked: Option<&str>) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
        created: "2026-01-01T00:00:00Z".into(),
        channel,
        official: true,
        min_from: None,
        yanked: yanked.map(str::to_owned),
    }
}

#[test]
fn the_manifest_names_the_index_and_reads_back() {
    let json = br#"{"schema":1,"releases":[]}"#;
    let digest = Digest::of(json);
    let manifest = index_manifest(&digest, json.len());
    assert_eq!(manifest.digest, Digest::of(&manifest.bytes).to_string());
    let value: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    assert_eq!(value["artifactType"], INDEX_MEDIA_TYPE);
    assert_eq!(value["config"]["mediaType"], EMPTY_CONFIG_MEDIA_TYPE);
    assert_eq!(value["config"]["digest"], EMPTY_CONFIG_DIGEST);
    assert_eq!(Digest::of(EMPTY_CONFIG).as_str(), EMPTY_CONFIG_DIGEST);
    assert_eq!(
        index_layer("m", &manifest.bytes).unwrap(),
        (digest, json.len() as u64)
    );
}

#[test]
fn malformed_index_manifests_are_refused_by_name() {
    let layer = |media: &str, size: u64, digest: &str| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "artifactType": INDEX_MEDIA_TYPE,
            "config": {"mediaType": EMPTY_CONFIG_MEDIA_TYPE, "digest": EMPTY_CONFIG_DIGEST, "size": 2},
            "layers": [{"mediaType": media, "digest": digest, "size": size}],
        }))
        .unwrap()
    };
    let ok = Digest::of(b"x").to_string();
    let err = |bytes: &[u8]| index_layer("the index", bytes).unwrap_err().to_string();
    assert!(err(b"[1]").contains("not an OCI image manifest"));
    let e = err(&layer("application/json", 10, &ok));
    assert!(e.contains("media type \"application/json\""), "{e}");
    let e = err(&layer(INDEX_MEDIA_TYPE, 5 << 20, &ok));
    assert!(e.contains("declares 5242880 bytes"), "{e}");
    assert!(e.contains("larger than 4194304"), "{e}");
    let e = err(&layer(INDEX_MEDIA_TYPE, 10, &ok.to_uppercase()));
    assert!(e.contains("layer digest"), "{e}");
    let e = err(br#"{"schemaVersion":2,"layers":[]}"#);
    assert!(e.contains("artifactType"), "{e}");
    let e = err(&serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "artifactType": INDEX_MEDIA_TYPE, "layers": [],
    }))
    .unwrap());
    assert!(e.contains("0 layers"), "{e}");
    let e = err(br#"{"schemaVersion":1,"layers":[]}"#);
    assert!(e.contains("schemaVersion is 1"), "{e}");
}

#[test]
fn channel_tags_name_the_newest_release_that_is_not_yanked() {
    let mut index = ReleaseIndex::default();
    for r in [
        release("1.0.0", 1, Channel::Stable, None),
        release("2.0.0", 2, Channel::Beta, None),
        release("2.1.0", 3, Channel::Stable, Some("bad")),
        release("3.0.0", 4, Channel::Alpha, None),
    ] {
        index.publish(r).unwrap();
    }
    let heads: Vec<(Channel, Option<&str>)> = channel_heads(&index)
        .into_iter()
        .map(|(c, r)| (c, r.map(|r| r.version.as_str())))
        .collect();
    assert_eq!(
        heads,
        [
            (Channel::Alpha, Some("3.0.0")),
            (Channel::Beta, Some("2.0.0")),
            (Channel::Stable, Some("1.0.0")),
        ]
    );
    index.yank("1.0.0", "also bad").unwrap();
    assert_eq!(channel_heads(&index)[2], (Channel::Stable, None));
    let stay = TagMove {
        channel: Channel::Stable,
        current: Some(release("1.0.0", 1, Channel::Stable, None).digest),
        target: None,
    };
    assert!(!stay.is_needed(), "no target: the tag is left alone");
    let target = release("2.0.0", 2, Channel::Beta, None);
    let mut beta = TagMove {
        channel: Channel::Beta,
        current: None,
        target: Some(target.clone()),
    };
    assert!(beta.is_needed());
    beta.current = Some(target.digest);
    assert!(!beta.is_needed());
}
