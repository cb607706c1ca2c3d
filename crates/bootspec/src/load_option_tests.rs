use super::*;

/// docs/formats.md §2.9's test vector: `Boot####` of `slate start 1/4` for
/// `EFI/BOOT/BOOTX64.EFI` on GPT partition 1 (LBA 2048, 196608 blocks, GUID bytes 00..0f).
const VECTOR_HEX: &str = "\
07000000010000005e0073006c00610074006500200073007400610072007400\
200031002f003400000004012a00010000000008000000000000000003000000\
0000000102030405060708090a0b0c0d0e0f0202040430005c00450046004900\
5c0042004f004f0054005c0042004f004f0054005800360034002e0045004600\
490000007fff0400";

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn esp() -> LoaderLocation {
    LoaderLocation {
        partition_number: 1,
        start_lba: 2048,
        size_lba: 196_608,
        partition_guid: std::array::from_fn(|i| i as u8),
        path: "EFI/BOOT/BOOTX64.EFI".into(),
    }
}

fn slate_option(k: usize, n: usize) -> Vec<u8> {
    build_load_option(&LoadOption {
        attributes: LOAD_OPTION_ACTIVE,
        description: slate_description(k, n),
        file_path_list: loader_device_path(&esp()).unwrap(),
        optional_data: Vec::new(),
    })
}

/// An option of another OS: a different path, and optional data.
fn foreign(description: &str) -> Vec<u8> {
    let mut other = esp();
    other.path = "EFI/debian/shimx64.efi".into();
    build_load_option(&LoadOption {
        attributes: LOAD_OPTION_ACTIVE,
        description: description.into(),
        file_path_list: loader_device_path(&other).unwrap(),
        optional_data: b"\x4e\xac\x08\x81".to_vec(),
    })
}

#[test]
fn the_test_vector_is_built_and_read_back() {
    let bytes = slate_option(1, 4);
    assert_eq!(bytes, unhex(VECTOR_HEX));
    let option = parse_load_option("Boot0005", &bytes).unwrap();
    assert_eq!(option.attributes, LOAD_OPTION_ACTIVE);
    assert_eq!(option.description, "slate start 1/4");
    assert_eq!(option.file_path_list.len(), 94);
    assert!(option.optional_data.is_empty());
    assert_eq!(build_load_option(&option), bytes);
}

#[test]
fn foreign_options_round_trip_with_their_optional_data() {
    let bytes = foreign("debian");
    let option = parse_load_option("Boot0001", &bytes).unwrap();
    assert_eq!(option.optional_data, b"\x4e\xac\x08\x81");
    assert_eq!(build_load_option(&option), bytes);
}

#[test]
fn malformed_options_are_refused_by_name_and_offset() {
    let good = slate_option(1, 4);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..3].to_vec(), "shorter than its 4 attribute bytes"),
        (good[..8].to_vec(), "shorter than the 6-byte option header"),
        (good[..20].to_vec(), "no terminating NUL"),
        // FilePathListLength one byte longer than what follows.
        (
            {
                let mut b = good.clone();
                b[8] = 95;
                b
            },
            "runs past the end",
        ),
        // The list cut before its end node (length says 90).
        (
            {
                let mut b = good[..good.len() - 4].to_vec();
                b[8] = 90;
                b
            },
            "without an end node",
        ),
        // The hard drive node claims 2 bytes.
        (
            {
                let mut b = good.clone();
                b[44] = 2;
                b
            },
            "shorter than its 4-byte header",
        ),
        // An unpaired surrogate in the description.
        (
            {
                let mut b = good.clone();
                b[10] = 0x00;
                b[11] = 0xd8;
                b
            },
            "not valid UTF-16",
        ),
        (vec![0; MAX_LOAD_OPTION_LEN + 1], "at most"),
    ];
    for (bytes, expected) in cases {
        let err = parse_load_option("Boot0007", &bytes)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err:?} should say {expected:?}");
        assert!(err.contains("Boot0007") || err.contains("bytes"), "{err}");
    }
}

#[test]
fn boot_order_parses_and_refuses_odd_lengths() {
    let file = build_boot_order(&[5, 0x1a, 1]);
    assert_eq!(file, [7, 0, 0, 0, 5, 0, 0x1a, 0, 1, 0]);
    assert_eq!(parse_boot_order(&file).unwrap(), [5, 0x1a, 1]);
    let err = parse_boot_order(&file[..9]).unwrap_err();
    assert_eq!(err, LoadOptionError::OddBootOrder { len: 5 });
    assert!(parse_boot_order(&[7, 0]).is_err());
}

#[test]
fn boot_var_names() {
    assert_eq!(boot_var_name(0x1a), "Boot001A");
    assert_eq!(parse_boot_var_name("Boot001A"), Some(0x1a));
    for bad in [
        "BootOrder",
        "Boot001a",
        "Boot01",
        "Boot00001",
        "Boot00G1",
        "boot0001",
    ] {
        assert_eq!(parse_boot_var_name(bad), None, "{bad}");
    }
}

#[test]
fn a_firmware_with_only_its_own_options_gets_slates_first() {
    // OVMF's: the DVD, the disk's removable path, the network.
    let options: BTreeMap<u16, Vec<u8>> = [
        (1, foreign("UEFI DVD")),
        (2, foreign("UEFI Misc Device")),
        (3, foreign("PXE")),
    ]
    .into_iter()
    .collect();
    let order = build_boot_order(&[1, 2, 3]);
    let plan = plan_boot_options(Some(&order), &options, &esp(), 4).unwrap();
    assert_eq!(plan.slate_options, [0, 4, 5, 6]);
    let names: Vec<&str> = plan.write.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Boot0000", "Boot0004", "Boot0005", "Boot0006"]);
    assert_eq!(plan.write[2].1, slate_option(3, 4));
    assert_eq!(plan.boot_order, Some(vec![0, 4, 5, 6, 1, 2, 3]));
    assert!(plan.remove.is_empty());

    // Applied, the same plan asks for nothing.
    let mut after = options.clone();
    for (name, bytes) in &plan.write {
        after.insert(parse_boot_var_name(name).unwrap(), bytes.clone());
    }
    let order = build_boot_order(plan.boot_order.as_ref().unwrap());
    let again = plan_boot_options(Some(&order), &after, &esp(), 4).unwrap();
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(again.slate_options, [0, 4, 5, 6]);
}

#[test]
fn stale_slate_options_are_rewritten_reordered_and_trimmed() {
    // A reinstall gave the ESP another GUID; someone moved PXE first; there were five.
    let mut old = esp();
    old.partition_guid = [0xee; 16];
    let stale = |k| {
        build_load_option(&LoadOption {
            attributes: LOAD_OPTION_ACTIVE,
            description: slate_description(k, 5),
            file_path_list: loader_device_path(&old).unwrap(),
            optional_data: Vec::new(),
        })
    };
    let options: BTreeMap<u16, Vec<u8>> = [
        (1, foreign("PXE")),
        (8, stale(1)),
        (9, stale(2)),
        (10, stale(3)),
        (11, stale(4)),
        (12, stale(5)),
    ]
    .into_iter()
    .collect();
    let order = build_boot_order(&[1, 8, 9, 10, 11, 12, 0x30]);
    let plan = plan_boot_options(Some(&order), &options, &esp(), 4).unwrap();
    assert_eq!(plan.slate_options, [8, 9, 10, 11]);
    assert_eq!(plan.write.len(), 4);
    assert_eq!(plan.remove, ["Boot000C"]);
    // An entry BootOrder names without a variable is kept where it was, after slate's.
    assert_eq!(plan.boot_order, Some(vec![8, 9, 10, 11, 1, 0x30]));
}

#[test]
fn no_boot_order_and_bad_input_write_nothing() {
    let plan = plan_boot_options(None, &BTreeMap::new(), &esp(), 2).unwrap();
    assert_eq!(plan.boot_order, Some(vec![0, 1]));

    let options: BTreeMap<u16, Vec<u8>> = [(3, vec![7, 0, 0, 0, 1])].into_iter().collect();
    let err = plan_boot_options(None, &options, &esp(), 4).unwrap_err();
    assert!(err.to_string().starts_with("Boot0003: "), "{err}");
    let err = plan_boot_options(Some(&[7, 0, 0, 0, 1]), &BTreeMap::new(), &esp(), 4);
    assert_eq!(err, Err(LoadOptionError::OddBootOrder { len: 1 }));
    for count in [0, 33] {
        assert_eq!(
            plan_boot_options(None, &BTreeMap::new(), &esp(), count),
            Err(LoadOptionError::BadCount { count })
        );
    }
    let mut bad = esp();
    for path in [
        "",
        "/EFI/BOOT/BOOTX64.EFI",
        "EFI\\BOOT",
        "EFI/BOOT/BÖÖT.EFI",
    ] {
        bad.path = path.into();
        assert!(matches!(
            plan_boot_options(None, &BTreeMap::new(), &bad, 4),
            Err(LoadOptionError::BadLoaderPath { .. })
        ));
    }
}

#[test]
fn a_kept_high_number_and_new_low_ones_settle_at_once() {
    // One slate option left at Boot0009 (say, the others were deleted by hand); 0-3 are free.
    let options: BTreeMap<u16, Vec<u8>> = [(9, slate_option(1, 4)), (4, foreign("PXE"))]
        .into_iter()
        .collect();
    let plan = plan_boot_options(None, &options, &esp(), 4).unwrap();
    assert_eq!(plan.slate_options, [0, 1, 2, 9]);
    let mut after = options.clone();
    for (name, bytes) in &plan.write {
        after.insert(parse_boot_var_name(name).unwrap(), bytes.clone());
    }
    assert_eq!(after[&9], slate_option(4, 4));
    let order = build_boot_order(plan.boot_order.as_ref().unwrap());
    let again = plan_boot_options(Some(&order), &after, &esp(), 4).unwrap();
    assert!(again.is_empty(), "{again:?}");
}
