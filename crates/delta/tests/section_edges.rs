//! A UKI and an ELF binary are chunked at their sections' edges (chunker.rs): a release that
//! changes only the os-release text costs the UKI's header (its PE checksum) and its `.osrel`
//! section, not a chunk of the stub's code or of the initrd around them. UKIs built with
//! slate's UKI builder on Debian's real systemd-stub; the ELF file is this test's own binary.

use std::collections::HashSet;

use slate_delta::{chunk_blob, section_edges, BlobChunks, DEFAULT_PARAMS};
use slate_testkit::Xorshift;
use slate_uki::{parse_sections, UkiBuilder};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

fn stub() -> Option<Vec<u8>> {
    slate_testkit::require_path(
        STUB,
        "Debian's systemd-boot-efi; scripts/install-deps installs it",
    )
    .then(|| std::fs::read(STUB).expect("reading the stub"))
}

/// A UKI of `version` with 600 KB of incompressible initrd, the stub as its `.linux`.
fn uki(stub: &[u8], version: &str) -> Vec<u8> {
    UkiBuilder::new(stub)
        .osrel(&format!("NAME=slate\nID=slate\nVERSION_ID={version}\n"))
        .cmdline("console=ttyS0")
        .uname("6.1.0-slate-amd64")
        .initrd(Xorshift(41).bytes(600_000))
        .linux(stub)
        .build()
        .expect("building the UKI")
}

fn tiles(blob: &BlobChunks) -> bool {
    let mut end = 0;
    for c in &blob.chunks {
        if c.offset != end {
            return false;
        }
        end += u64::from(c.length);
    }
    end == blob.size
}

#[test]
fn every_section_edge_is_a_chunk_start() {
    let Some(stub) = stub() else { return };
    let image = uki(&stub, "1.0.0");
    let edges = section_edges(&image);
    let sections = parse_sections(&image).unwrap();
    assert!(edges.len() >= sections.len(), "{edges:?} for {sections:?}");
    let blob = chunk_blob(&image, DEFAULT_PARAMS);
    assert!(tiles(&blob));
    let starts: HashSet<u64> = blob.chunks.iter().map(|c| c.offset).collect();
    for s in sections.iter().filter(|s| s.size_of_raw_data > 0) {
        assert!(
            starts.contains(&u64::from(s.pointer_to_raw_data)),
            "section {} starts at {} inside a chunk",
            s.name,
            s.pointer_to_raw_data
        );
    }
    // The stub itself is a PE image: cut at its sections too.
    assert!(!section_edges(&stub).is_empty());
}

#[test]
fn a_new_version_string_costs_the_header_and_osrel_only() {
    let Some(stub) = stub() else { return };
    let (v1, v2) = (uki(&stub, "1.0.0"), uki(&stub, "2.0.0"));
    assert_eq!(v1.len(), v2.len());
    let (old, new) = (
        chunk_blob(&v1, DEFAULT_PARAMS),
        chunk_blob(&v2, DEFAULT_PARAMS),
    );
    let held: HashSet<_> = old.chunks.iter().map(|c| c.digest).collect();
    let changed: Vec<_> = new
        .chunks
        .iter()
        .filter(|c| !held.contains(&c.digest))
        .collect();
    let sections = parse_sections(&v2).unwrap();
    let osrel = sections.iter().find(|s| s.name == ".osrel").unwrap();
    let header_end = sections
        .iter()
        .map(|s| s.pointer_to_raw_data)
        .min()
        .unwrap();
    let fetched: u64 = changed.iter().map(|c| u64::from(c.length)).sum();
    // Cut by content alone, each change took at least a chunk of DEFAULT_PARAMS.min (8 KiB).
    assert!(
        fetched <= u64::from(header_end) + u64::from(osrel.size_of_raw_data),
        "{fetched} bytes in {} changed chunks: {changed:?}",
        changed.len()
    );
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(changed
        .iter()
        .any(|c| c.offset == u64::from(osrel.pointer_to_raw_data)));
}

#[test]
fn an_elf_binary_is_cut_at_its_sections_too() {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(exe.starts_with(b"\x7fELF"));
    let edges = section_edges(&exe);
    // A test binary has tens of sections (.text, .rodata, .eh_frame, .data, debug info...).
    assert!(edges.len() >= 10, "{edges:?}");
    let blob = chunk_blob(&exe, DEFAULT_PARAMS);
    assert!(tiles(&blob));
    let starts: HashSet<u64> = blob.chunks.iter().map(|c| c.offset).collect();
    for edge in edges {
        assert!(
            starts.contains(&(edge as u64)),
            "a section edge at {edge} inside a chunk"
        );
    }
}

#[test]
fn blobs_that_are_neither_pe_nor_elf_are_cut_by_content_alone() {
    let noise = Xorshift(7).bytes(300_000);
    assert!(section_edges(&noise).is_empty());
    assert_eq!(
        chunk_blob(&noise, DEFAULT_PARAMS).chunks,
        chunk_blob(&noise, DEFAULT_PARAMS).chunks
    );
    // An ELF magic, then noise: its headers do not parse.
    let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
    elf.extend(Xorshift(9).bytes(100_000));
    assert!(section_edges(&elf).is_empty());
    // "MZ" then noise: not a PE image (no PE signature where the header points).
    let mut mz = b"MZ".to_vec();
    mz.extend(Xorshift(3).bytes(70_000));
    assert!(section_edges(&mz).is_empty());
    // A COFF object's machine type first (x86-64), which has no magic: not cut.
    let mut coff = vec![0x64, 0x86, 0x01, 0x00];
    coff.extend(Xorshift(5).bytes(70_000));
    assert!(section_edges(&coff).is_empty());
}
