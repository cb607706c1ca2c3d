//! UKI assembly against the real Debian 12 systemd-stub, checked with objdump and with our
//! own reader.

mod common;

use std::io::Write;
use std::process::Command;

use common::{debian_stub, get32};
use proptest::prelude::*;
use slate_uki::{
    parse_pe, parse_sections, pe_checksum, section_data, verify_checksum, SbatOutcome, UkiBuilder,
    UkiError, DATA_SECTION_FLAGS, LINUX_SECTION_FLAGS, UKI_SBAT_LINE,
};

const OSREL: &str = "NAME=slate\nID=slate\nVERSION_ID=1.0\nPRETTY_NAME=\"slate 1.0\"\n";
const CMDLINE: &str = "console=ttyS0 ro slate.slot=a";
const UNAME: &str = "6.1.0-slate-amd64";

fn initrd() -> Vec<u8> {
    let mut w = slate_cpio::CpioWriter::new();
    w.dir("dev", 0o755)
        .unwrap()
        .char_device("dev/console", 0o600, 5, 1)
        .unwrap()
        .file("init", 0o755, b"#!/bin/sh\nexec /sbin/slate\n".to_vec())
        .unwrap();
    w.finish()
}

/// The canonical UKI, using the stub itself as the `.linux` PE (no real kernel here).
fn canonical(stub: &[u8]) -> Result<Vec<u8>, UkiError> {
    UkiBuilder::new(stub)
        .osrel(OSREL)
        .cmdline(CMDLINE)
        .uname(UNAME)
        .initrd(initrd())
        .linux(stub)
        .build()
}

#[derive(Debug)]
struct ObjdumpSection {
    name: String,
    vma: u64,
    file_offset: u64,
}

/// `objdump ARGS` of `image`, or `None` when there is no objdump (skipped, saying so; failed
/// under `CI=true`).
fn objdump(args: &[&str], image: &[u8]) -> Option<String> {
    if !slate_testkit::require_tool("objdump") {
        return None;
    }
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(image).unwrap();
    file.flush().unwrap();
    let out = Command::new("objdump")
        .args(args)
        .arg(file.path())
        .output()
        .unwrap_or_else(|err| panic!("objdump {args:?}: {err}"));
    assert!(
        out.status.success(),
        "objdump {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// Rows of `objdump -h`: "Idx Name Size VMA LMA File-off Algn".
fn objdump_sections(text: &str) -> Vec<ObjdumpSection> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() != 7 || f[0].parse::<usize>().is_err() {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
            Some(ObjdumpSection {
                name: f[1].to_owned(),
                vma: hex(f[3]),
                file_offset: hex(f[5]),
            })
        })
        .collect()
}

fn objdump_field(text: &str, key: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("{key} missing from objdump -p"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

#[test]
fn objdump_sees_an_aligned_non_overlapping_layout() {
    let Some(stub) = debian_stub() else { return };
    let uki = canonical(&stub).unwrap();
    let info = parse_pe(&uki).unwrap();
    let Some(headers) = objdump(&["-h"], &uki) else {
        return;
    };
    let listed = objdump_sections(&headers);
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        &names[names.len() - 5..],
        [".osrel", ".cmdline", ".uname", ".initrd", ".linux"],
        "{headers}"
    );
    assert_eq!(listed.len(), info.sections.len());
    let stub_count = parse_sections(&stub).unwrap().len();

    for (i, (ours, theirs)) in info.sections.iter().zip(&listed).enumerate() {
        assert_eq!(ours.name, theirs.name);
        assert_eq!(u64::from(ours.virtual_address), theirs.vma);
        assert_eq!(u64::from(ours.pointer_to_raw_data), theirs.file_offset);
        // The stub's own VAs are the linker's business (Debian's .sdmagic sits at 0x19100
        // with SectionAlignment 0x200); ours must be aligned.
        if i >= stub_count {
            assert_eq!(
                theirs.vma % u64::from(info.section_alignment),
                0,
                "{theirs:?}"
            );
        }
        assert_eq!(
            theirs.file_offset % u64::from(info.file_alignment),
            0,
            "{theirs:?}"
        );
        assert_eq!(ours.size_of_raw_data % info.file_alignment, 0, "{ours:?}");
        let mem_end = ours.virtual_address + ours.memory_size();
        assert!(mem_end <= info.size_of_image, "{ours:?} beyond SizeOfImage");
        let file_end = (ours.pointer_to_raw_data + ours.size_of_raw_data) as usize;
        assert!(file_end <= uki.len(), "{ours:?} beyond end of file");
    }

    // No two sections share memory or file bytes.
    let mut by_va: Vec<_> = info.sections.iter().collect();
    by_va.sort_by_key(|s| s.virtual_address);
    for w in by_va.windows(2) {
        assert!(
            w[0].virtual_address + w[0].memory_size() <= w[1].virtual_address,
            "{:?} overlaps {:?} in memory",
            w[0],
            w[1]
        );
    }
    let mut by_offset: Vec<_> = info.sections.iter().collect();
    by_offset.sort_by_key(|s| s.pointer_to_raw_data);
    for w in by_offset.windows(2) {
        assert!(w[0].pointer_to_raw_data + w[0].size_of_raw_data <= w[1].pointer_to_raw_data);
    }
    assert!(info.section_table_end() <= info.size_of_headers as usize);

    let private = objdump(&["-p"], &uki).unwrap();
    assert_eq!(
        objdump_field(&private, "SizeOfImage"),
        u64::from(info.size_of_image)
    );
    assert_eq!(
        objdump_field(&private, "CheckSum"),
        u64::from(pe_checksum(&uki).unwrap())
    );
    assert_eq!(objdump_field(&private, "SizeOfHeaders"), 0x400);
}

#[test]
fn added_sections_follow_the_spec_layout() {
    let Some(stub) = debian_stub() else { return };
    let stub_info = parse_pe(&stub).unwrap();
    let uki = canonical(&stub).unwrap();
    let info = parse_pe(&uki).unwrap();
    let new = &info.sections[stub_info.sections.len()..];

    // Debian 12's last section is .sdmagic at 0x19100 + 0x34, so the first added VA is 0x19200.
    if stub_info
        .sections
        .last()
        .map(|s| (s.name.as_str(), s.virtual_address))
        == Some((".sdmagic", 0x19100))
    {
        assert_eq!(new[0].virtual_address, 0x19200);
    }
    let mut prev = stub_info.sections.last().unwrap().clone();
    for s in new {
        let expected_va =
            (prev.virtual_address + prev.memory_size()).next_multiple_of(info.section_alignment);
        assert_eq!(s.virtual_address, expected_va, "{s:?}");
        prev = s.clone();
    }
    let last = new.last().unwrap();
    assert_eq!(
        info.size_of_image,
        (last.virtual_address + last.virtual_size).next_multiple_of(info.section_alignment)
    );

    // Contents, sizes and flags.
    let expect = [
        (".osrel", OSREL.as_bytes().to_vec()),
        (".cmdline", CMDLINE.as_bytes().to_vec()),
        (".uname", UNAME.as_bytes().to_vec()),
        (".initrd", initrd()),
    ];
    for (name, data) in &expect {
        let s = info.section(name).unwrap();
        assert_eq!(s.virtual_size as usize, data.len());
        assert_eq!(s.characteristics, DATA_SECTION_FLAGS);
        assert_eq!(section_data(&uki, name).unwrap().unwrap(), &data[..]);
    }
    let linux = info.section(".linux").unwrap();
    assert_eq!(linux.characteristics, LINUX_SECTION_FLAGS);
    // The "kernel" is the stub: a PE whose SizeOfImage (0x19300) exceeds its file size.
    assert_eq!(
        linux.virtual_size,
        stub_info.size_of_image.max(stub.len() as u32)
    );
    let start = linux.pointer_to_raw_data as usize;
    assert_eq!(&uki[start..start + stub.len()], &stub[..]);

    let added: u32 = new.iter().map(|s| s.virtual_size).sum();
    assert_eq!(
        info.size_of_initialized_data,
        stub_info.size_of_initialized_data + added
    );
    assert_eq!(info.sections.len(), stub_info.sections.len() + 5);

    // A non-PE blob as .linux keeps VirtualSize = length.
    let blob = vec![0x5A; 1000];
    let uki = UkiBuilder::new(&stub).linux(&blob).build().unwrap();
    let s = parse_pe(&uki).unwrap().section(".linux").unwrap().clone();
    assert_eq!(s.virtual_size, 1000);
    assert_eq!(s.size_of_raw_data, 1024);
}

#[test]
fn stub_symbol_table_is_dropped_and_the_rest_preserved() {
    let Some(stub) = debian_stub() else { return };
    let stub_info = parse_pe(&stub).unwrap();
    let report = UkiBuilder::new(&stub)
        .osrel(OSREL)
        .build_with_report()
        .unwrap();
    let info = parse_pe(&report.image).unwrap();
    if stub_info.pointer_to_symbol_table != 0 {
        assert!(report.symbol_table_stripped);
    }
    assert_eq!(info.pointer_to_symbol_table, 0);
    assert_eq!(info.number_of_symbols, 0);
    // The file ends exactly with the last section's raw data.
    let last = info.sections.last().unwrap();
    assert_eq!(
        report.image.len(),
        (last.pointer_to_raw_data + last.size_of_raw_data) as usize
    );
    // Every stub section's bytes are unchanged (Debian's stub is already aligned).
    for s in &stub_info.sections {
        assert_eq!(
            section_data(&report.image, &s.name).unwrap(),
            section_data(&stub, &s.name).unwrap(),
            "{}",
            s.name
        );
    }
    // object's full PE parser accepts the result too.
    let file = object::read::pe::PeFile64::parse(&*report.image).unwrap();
    assert_eq!(file.section_table().len(), info.sections.len());
}

#[test]
fn checksum_is_the_standard_one() {
    let Some(stub) = debian_stub() else { return };
    // The linker-written checksum of the stub validates our algorithm independently.
    let stub_info = parse_pe(&stub).unwrap();
    assert_ne!(stub_info.checksum, 0);
    assert_eq!(pe_checksum(&stub).unwrap(), stub_info.checksum);

    let uki = canonical(&stub).unwrap();
    assert!(verify_checksum(&uki).unwrap());
    let mut corrupted = uki.clone();
    let last = corrupted.len() - 1;
    corrupted[last] ^= 0x40;
    assert!(!verify_checksum(&corrupted).unwrap());
}

#[test]
fn building_twice_gives_identical_bytes() {
    let Some(stub) = debian_stub() else { return };
    let a = canonical(&stub).unwrap();
    let b = canonical(&stub).unwrap();
    assert_eq!(a, b);
}

#[test]
fn header_room_is_seven_sections() {
    let Some(stub) = debian_stub() else { return };
    let names = [".a", ".b", ".c", ".d", ".e", ".f", ".g", ".h"];
    let with = |n: usize| {
        names[..n]
            .iter()
            .fold(UkiBuilder::new(&stub), |b, name| {
                b.section(name, b"x".to_vec())
            })
            .build()
    };
    let seven = with(7).unwrap();
    assert_eq!(parse_sections(&seven).unwrap().len(), 15);
    assert_eq!(
        with(8).unwrap_err(),
        UkiError::NoHeaderRoom {
            name: ".h".into(),
            capacity: 7,
            stub_sections: 8,
            size_of_headers: 0x400,
        }
    );
    println!("{}", with(8).unwrap_err());
}

#[test]
fn long_names_are_refused() {
    let Some(stub) = debian_stub() else { return };
    let err = UkiBuilder::new(&stub)
        .section(".toolong9", b"x".to_vec())
        .build()
        .unwrap_err();
    assert!(matches!(err, UkiError::InvalidSectionName { .. }), "{err}");
    println!("{err}");
}

#[test]
fn signed_stubs_are_refused() {
    let Some(mut stub) = debian_stub() else {
        return;
    };
    let info = parse_pe(&stub).unwrap();
    assert!(info.is_pe32_plus);
    // Security is data directory 4; PE32+ directories start 112 bytes into the optional header.
    let entry = info.optional_header_offset + 112 + 4 * 8;
    let cert_at = stub.len() as u32;
    stub[entry..entry + 4].copy_from_slice(&cert_at.to_le_bytes());
    stub[entry + 4..entry + 8].copy_from_slice(&8u32.to_le_bytes());
    stub.extend_from_slice(&[8, 0, 0, 0, 0, 2, 2, 0]);
    assert_eq!(get32(&stub, entry + 4), 8);
    let err = UkiBuilder::new(&stub).osrel(OSREL).build().unwrap_err();
    assert_eq!(err, UkiError::SignedStub);
    println!("{err}");
}

#[test]
fn merged_sbat_does_not_fit_debian_stub_so_it_is_kept() {
    let Some(stub) = debian_stub() else { return };
    let stub_sbat = section_data(&stub, ".sbat").unwrap().unwrap().to_vec();
    let report = UkiBuilder::new(&stub)
        .osrel(OSREL)
        .linux(&stub)
        .sbat(UKI_SBAT_LINE)
        .build_with_report()
        .unwrap();
    match report.sbat {
        SbatOutcome::KeptStub { merged_len, usable } => {
            // Debian: 0xe2 bytes of stub SBAT + the uki line + "\0" > 256 bytes of memory room.
            assert_eq!(usable, 256);
            assert!(merged_len > usable);
        }
        other => panic!("expected KeptStub, got {other:?}"),
    }
    assert_eq!(
        section_data(&report.image, ".sbat").unwrap().unwrap(),
        &stub_sbat[..]
    );
    assert_eq!(
        parse_sections(&report.image)
            .unwrap()
            .iter()
            .filter(|s| s.name == ".sbat")
            .count(),
        1,
        "shim rejects images with more than one .sbat"
    );
    assert!(verify_checksum(&report.image).unwrap());
}

#[test]
fn explicit_sbat_replacement_respects_the_memory_limit() {
    let Some(stub) = debian_stub() else { return };
    let err = UkiBuilder::new(&stub)
        .section(".sbat", vec![b'a'; 257])
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        UkiError::ExistingSectionTooSmall {
            name: ".sbat".into(),
            len: 257,
            usable: 256
        }
    );
    println!("{err}");

    let small = b"sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\0";
    let uki = UkiBuilder::new(&stub)
        .section(".sbat", &small[..])
        .build()
        .unwrap();
    assert_eq!(section_data(&uki, ".sbat").unwrap().unwrap(), &small[..]);
    let info = parse_pe(&uki).unwrap();
    let sbat = info.section(".sbat").unwrap();
    assert_eq!(sbat.virtual_size as usize, small.len());
    // The rest of the old raw data is zeroed.
    let start = (sbat.pointer_to_raw_data as usize) + small.len();
    let end = (sbat.pointer_to_raw_data + sbat.size_of_raw_data) as usize;
    assert!(uki[start..end].iter().all(|&b| b == 0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn parse_sections_never_panics_on_random_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..2048)
    ) {
        let _ = parse_sections(&bytes);
        let _ = pe_checksum(&bytes);
    }

    #[test]
    fn parsing_and_building_never_panic_on_corrupted_stubs(
        flips in prop::collection::vec((0usize..0x400, any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let Some(mut stub) = debian_stub() else { return Ok(()) };
        for (at, byte) in flips {
            stub[at] = byte;
        }
        let keep = cut.index(stub.len() + 1);
        let stub = &stub[..keep];
        let _ = parse_sections(stub);
        let _ = UkiBuilder::new(stub).osrel(OSREL).linux(stub).sbat("").build();
    }
}
