//! Assembly paths the Debian stub does not exercise, using small hand-made PE images:
//! re-alignment, in-place and appended `.sbat`, kernel SBAT merging, symbol tables that are
//! not at the end, PE32, and header-room arithmetic.

mod common;

use common::{pad, FakePe, FakeSection, SBAT_STUB};
use slate_uki::{
    parse_pe, section_data, verify_checksum, SbatOutcome, UkiBuilder, UkiError, SBAT_HEADER_LINE,
    UKI_SBAT_LINE,
};

#[test]
fn fake_stub_round_trips_through_the_parser() {
    let stub = FakePe::typical().bytes();
    let info = parse_pe(&stub).unwrap();
    assert_eq!(info.sections.len(), 2);
    assert_eq!(info.section(".sbat").unwrap().virtual_address, 0x2000);
    assert_eq!(section_data(&stub, ".sbat").unwrap().unwrap(), SBAT_STUB);
}

#[test]
fn unaligned_stub_sections_are_realigned() {
    let mut fake = FakePe::typical();
    // .text with an unaligned size, .sbat right behind it at an unaligned offset.
    fake.sections[0].raw = vec![0xC3; 0x30];
    fake.sections[0].vs = 0x30;
    fake.sections[1].ptr = 0x430;
    fake.sections[1].raw = SBAT_STUB.to_vec();
    let stub = fake.bytes();
    assert_eq!(
        parse_pe(&stub).unwrap().sections[1].pointer_to_raw_data,
        0x430
    );

    let uki = UkiBuilder::new(&stub).osrel("ID=x\n").build().unwrap();
    let info = parse_pe(&uki).unwrap();
    let text = info.section(".text").unwrap();
    let sbat = info.section(".sbat").unwrap();
    assert_eq!(
        (text.pointer_to_raw_data, text.size_of_raw_data),
        (0x400, 0x200)
    );
    assert_eq!(
        (sbat.pointer_to_raw_data, sbat.size_of_raw_data),
        (0x600, 0x200)
    );
    assert_eq!(
        section_data(&uki, ".text").unwrap().unwrap(),
        &[0xC3; 0x30][..]
    );
    assert_eq!(section_data(&uki, ".sbat").unwrap().unwrap(), SBAT_STUB);
    assert_eq!(info.section(".osrel").unwrap().pointer_to_raw_data, 0x800);
    assert!(verify_checksum(&uki).unwrap());
}

#[test]
fn merged_sbat_replaces_a_roomy_stub_sbat_in_place() {
    let stub = FakePe::typical().bytes();
    // A fake kernel that carries its own SBAT.
    let mut kernel = FakePe::typical();
    let kernel_sbat =
        format!("{SBAT_HEADER_LINE}\nlinux,1,The Linux Developers,linux,6.1,https://linux.org\n");
    kernel.sections[1].vs = kernel_sbat.len() as u32;
    kernel.sections[1].raw = pad(kernel_sbat.into_bytes(), 0x200);
    let kernel = kernel.bytes();

    let report = UkiBuilder::new(&stub)
        .linux(&kernel)
        .sbat(UKI_SBAT_LINE)
        .build_with_report()
        .unwrap();
    let expected = format!(
        "{SBAT_HEADER_LINE}\nfakestub,1,Test,fakestub,1,https://example.invalid/\n\
         linux,1,The Linux Developers,linux,6.1,https://linux.org\n{UKI_SBAT_LINE}\n\0"
    );
    assert_eq!(
        report.sbat,
        SbatOutcome::ReplacedInPlace {
            len: expected.len()
        }
    );
    assert_eq!(
        section_data(&report.image, ".sbat").unwrap().unwrap(),
        expected.as_bytes()
    );
    let info = parse_pe(&report.image).unwrap();
    // Still one .sbat, still where the stub had it.
    assert_eq!(
        info.sections.iter().filter(|s| s.name == ".sbat").count(),
        1
    );
    assert_eq!(info.section(".sbat").unwrap().virtual_address, 0x2000);
    assert!(verify_checksum(&report.image).unwrap());
}

#[test]
fn sbat_is_appended_when_the_stub_has_none() {
    let mut fake = FakePe::typical();
    fake.sections.truncate(1);
    let stub = fake.bytes();
    let report = UkiBuilder::new(&stub)
        .osrel("ID=x\n")
        .sbat(UKI_SBAT_LINE)
        .build_with_report()
        .unwrap();
    let expected = format!("{SBAT_HEADER_LINE}\n{UKI_SBAT_LINE}\n\0");
    assert_eq!(
        report.sbat,
        SbatOutcome::Appended {
            len: expected.len()
        }
    );
    let info = parse_pe(&report.image).unwrap();
    let names: Vec<&str> = info.sections.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, [".text", ".osrel", ".sbat"]);
    assert_eq!(
        section_data(&report.image, ".sbat").unwrap().unwrap(),
        expected.as_bytes()
    );
}

#[test]
fn symbol_table_at_the_end_is_cut_and_elsewhere_kept() {
    let mut fake = FakePe::typical();
    fake.symtab = Some((0x800, 3));
    let stub = fake.bytes();
    assert_eq!(stub.len(), 0x800 + 3 * 18 + 4);
    let report = UkiBuilder::new(&stub)
        .osrel("ID=x\n")
        .build_with_report()
        .unwrap();
    assert!(report.symbol_table_stripped);
    let info = parse_pe(&report.image).unwrap();
    assert_eq!(
        (info.pointer_to_symbol_table, info.number_of_symbols),
        (0, 0)
    );
    assert_eq!(info.characteristics & 0x0008, 0x0008);
    assert_eq!(info.section(".osrel").unwrap().pointer_to_raw_data, 0x800);

    // Followed by other bytes, the table is not ours to cut.
    fake.trailer = vec![0xEE; 16];
    let stub = fake.bytes();
    let report = UkiBuilder::new(&stub)
        .osrel("ID=x\n")
        .build_with_report()
        .unwrap();
    assert!(!report.symbol_table_stripped);
    let info = parse_pe(&report.image).unwrap();
    assert_eq!(info.pointer_to_symbol_table, 0x800);
    assert!(info.section(".osrel").unwrap().pointer_to_raw_data >= stub.len() as u32);
}

#[test]
fn pe32_stubs_work_too() {
    let mut fake = FakePe::typical();
    fake.pe32 = true;
    let stub = fake.bytes();
    assert!(!parse_pe(&stub).unwrap().is_pe32_plus);
    let uki = UkiBuilder::new(&stub)
        .osrel("ID=x\n")
        .linux(vec![1u8; 10])
        .build()
        .unwrap();
    let info = parse_pe(&uki).unwrap();
    assert_eq!(info.sections.len(), 4);
    assert_eq!(info.section(".osrel").unwrap().virtual_address, 0x3000);
    assert_eq!(info.section(".linux").unwrap().virtual_address, 0x4000);
    assert_eq!(info.size_of_image, 0x5000);
    assert!(verify_checksum(&uki).unwrap());

    // Signed PE32: directories start 96 bytes into the optional header.
    fake.security = (0x1000, 8);
    assert_eq!(
        UkiBuilder::new(&fake.bytes()).osrel("x").build(),
        Err(UkiError::SignedStub)
    );
}

#[test]
fn size_of_headers_is_rounded_up_for_more_header_room() {
    let mut fake = FakePe::typical();
    // The PE32+ section table starts at 0x148; two stub headers end at 0x198.
    fake.size_of_headers = 0x1C0;
    let stub = fake.bytes();
    // Rounded to 0x200: (0x200 - 0x198) / 40 = 2 new headers.
    let two = UkiBuilder::new(&stub)
        .osrel("a")
        .uname("b")
        .build()
        .unwrap();
    assert_eq!(parse_pe(&two).unwrap().size_of_headers, 0x200);
    let err = UkiBuilder::new(&stub)
        .osrel("a")
        .uname("b")
        .cmdline("c")
        .build()
        .unwrap_err();
    assert!(
        matches!(err, UkiError::NoHeaderRoom { capacity: 2, .. }),
        "{err}"
    );
}

#[test]
fn replacing_a_stub_section_that_is_too_small_fails() {
    let stub = FakePe::typical().bytes();
    let err = UkiBuilder::new(&stub)
        .section(".text", vec![0x90; 0x201])
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        UkiError::ExistingSectionTooSmall {
            name: ".text".into(),
            len: 0x201,
            usable: 0x200
        }
    );
}

#[test]
fn overlapping_stub_sections_are_refused() {
    let mut fake = FakePe::typical();
    fake.sections.push(FakeSection {
        name: ".bad",
        va: 0x3000,
        vs: 0x10,
        ptr: 0x500,
        raw: vec![1; 0x200],
    });
    let err = UkiBuilder::new(&fake.bytes())
        .osrel("x")
        .build()
        .unwrap_err();
    assert!(matches!(err, UkiError::UnsupportedStub(_)), "{err}");
}

#[test]
fn empty_sections_are_refused() {
    let stub = FakePe::typical().bytes();
    let err = UkiBuilder::new(&stub)
        .initrd(Vec::new())
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        UkiError::EmptySection {
            name: ".initrd".into()
        }
    );
}
